"""What a benchmark says of the machine it ran on: figures from this VM and another mean
something only next to their CPU model (standard library only, so any bench imports it)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["cpu_model"]


def cpu_model() -> str:
    """The ``model name`` line of ``/proc/cpuinfo`` (``Intel(R) Xeon(R) Processor``), or
    ``unknown CPU`` where there is none."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "unknown CPU"
    for line in lines:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"
