"""In-process batcher cost: a no-op model, 16 threads submitting one instance at a time.

    python bench/batcher_overhead.py [--threads 16] [--seconds 3]

Prints instances/s through ThreadedBatcher (adaptive and window policies) next to the
floor of this machine: the same threads handing a lock to one server thread and back,
with no batching code at all (the cost of two thread wake-ups under the GIL). Measured
twice: threads free to run on any CPU, then all on one CPU, as a pinned service worker.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from serving.batching.batcher import ThreadedBatcher


def drive(submit: object, threads: int, seconds: float) -> float:
    """Instances/s when ``threads`` threads call ``submit()`` in a loop for ``seconds``."""
    counts = [0] * threads
    stop = time.monotonic() + seconds

    def work(index: int) -> None:
        n = 0
        while time.monotonic() < stop:
            for _ in range(100):
                submit()  # type: ignore[operator]
            n += 100
        counts[index] = n

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    started = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(counts) / (time.perf_counter() - started)


def floor(threads: int, seconds: float) -> float:
    handoff: queue.SimpleQueue[threading.Lock | None] = queue.SimpleQueue()

    def server() -> None:
        while (lock := handoff.get()) is not None:
            lock.release()

    thread = threading.Thread(target=server, daemon=True)
    thread.start()

    def submit() -> None:
        lock = threading.Lock()
        lock.acquire()
        handoff.put(lock)
        lock.acquire()

    rate = drive(submit, threads, seconds)
    handoff.put(None)
    return rate


def measure(label: str, threads: int, seconds: float) -> None:
    row = np.zeros((1, 30))
    base = floor(threads, seconds)
    each_us = 1e6 / base
    print(
        f"[{label}] floor (bare lock hand-off): {base:>9,.0f} instances/s  {each_us:5.1f} us each"
    )
    for policy in ("adaptive", "window"):
        batcher = ThreadedBatcher(
            lambda rows: {"predictions": rows[:, 0]},
            max_batch_size=32,
            max_batch_latency_ms=1,
            policy=policy,
        ).start()
        rate = drive(lambda b=batcher: b.submit_many(row), threads, seconds)
        batcher.stop()
        print(
            f"[{label}] ThreadedBatcher {policy:>8}:  {rate:>9,.0f} instances/s  "
            f"{1e6 / rate:5.1f} us each  ({rate / base:.0%} of the floor)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    measure("any CPU", args.threads, args.seconds)
    if hasattr(os, "sched_setaffinity"):
        # As a service worker runs (SERVING_CPU_AFFINITY=auto): threads started from here on
        # inherit this thread's single CPU.
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        measure("one CPU", args.threads, args.seconds)


if __name__ == "__main__":
    main()
