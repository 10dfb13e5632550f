"""The memory a model load adds: this process's proportional set size (PSS) before and
after, from ``/proc/self/smaps_rollup`` (Linux 4.14 and later), and the libraries the
load imported first.

PSS counts each page a process maps divided by the number of processes mapping it, so
the PSS a master adds loading a model its workers then share is the model's one copy
on the host, and the PSS a worker adds loading its own copy is that copy. Measured, not
estimated from file sizes: a 40 MB joblib forest and a 40 MB ONNX graph take very
different memory once loaded. Other threads allocating meanwhile count too; the loads it
measures take seconds and allocate megabytes, the request threads beside them little.
The first load that imports a library (scikit-learn, ONNX Runtime) also adds the
library's memory, once per process: ``Look.added`` names the libraries, so a figure
that carries them says so.

Boundary: standard library only (the master reads it before prometheus-client may load).

Usage::

    before = Look.now()
    model = load()
    added_bytes, imported = before.added()   # bytes (None: /proc cannot tell), names
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Look", "pss_bytes"]

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


def _libraries() -> frozenset[str]:
    return frozenset(name.partition(".")[0] for name in list(sys.modules))


@dataclass(frozen=True)
class Look:
    """This process's PSS and the top-level packages imported, at one moment."""

    pss: int | None
    libraries: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def now(cls) -> Look:
        return cls(pss_bytes(), _libraries())

    def added(self) -> tuple[int | None, tuple[str, ...]]:
        """Bytes of PSS added since this look (at least 0; None when a look could not
        tell) and the public top-level packages imported since, sorted."""
        now = pss_bytes()
        added = None if now is None or self.pss is None else max(0, now - self.pss)
        new = sorted(n for n in _libraries() - self.libraries if not n.startswith("_"))
        return added, tuple(new)
