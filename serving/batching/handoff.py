"""What handing work to another thread and back costs on this host.

``ThreadedBatcher`` (``serving.batching.batcher``) compares it with its model's calls: a call
cheaper than a hand-off is run on the caller's thread whenever the model is idle, since
merging it with others cannot save what the two thread wake-ups cost. Measured, not
assumed: it spans 10-250 us across the hosts and loads seen (``docs/batching.md``).

Boundary: standard library only.
"""

from __future__ import annotations

import functools
import threading
import time

__all__ = ["handoff_s"]


@functools.cache
def handoff_s(round_trips: int = 100) -> float:
    """What handing work to another thread and back costs on this host, in seconds: the
    median of ``round_trips`` round trips between this thread and a helper thread through
    two locks (two wake-ups, as a request handed to the batcher thread and answered).
    Measured once per process, in a few milliseconds."""
    there, back = threading.Lock(), threading.Lock()
    there.acquire()
    back.acquire()

    def helper() -> None:
        for _ in range(round_trips):
            there.acquire()
            back.release()

    thread = threading.Thread(target=helper, name="serving-handoff-probe", daemon=True)
    thread.start()
    times = []
    for _ in range(round_trips):
        started = time.perf_counter()
        there.release()
        back.acquire()
        times.append(time.perf_counter() - started)
    thread.join()
    return sorted(times)[len(times) // 2]
