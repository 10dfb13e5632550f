"""The memory a model load adds: this process's proportional set size (PSS) before and
after, from ``/proc/self/smaps_rollup`` (Linux 4.14 and later).

PSS counts each page a process maps divided by the number of processes mapping it, so
the PSS a master adds loading a model its workers then share is the model's one copy
on the host, and the PSS a worker adds loading its own copy is that copy. Measured, not
estimated from file sizes: a 40 MB joblib forest and a 40 MB ONNX graph take very
different memory once loaded. Other threads allocating meanwhile count too; the loads it
measures take seconds and allocate megabytes, the request threads beside them little.

Boundary: standard library only (the master reads it before prometheus-client may load).

Usage::

    before = pss_bytes()
    model = load()
    added = added_since(before)   # bytes, or None where /proc cannot tell
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["added_since", "pss_bytes"]

_ROLLUP = Path("/proc/self/smaps_rollup")


def pss_bytes() -> int | None:
    """This process's PSS in bytes, or None where the kernel does not say (not Linux, an
    old kernel, ``/proc`` not mounted). Costs one read of a small file (tens of µs to a
    few ms for a process with many mappings)."""
    try:
        text = _ROLLUP.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024  # the kernel writes kB
    return None


def added_since(before: int | None) -> int | None:
    """Bytes of PSS added since ``before`` (``pss_bytes()`` then), at least 0; None when
    either look could not tell."""
    now = pss_bytes()
    if before is None or now is None:
        return None
    return max(0, now - before)
