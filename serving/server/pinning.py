"""Each worker on its own CPUs: ``cpus_for_slot`` chooses them (round-robin over the CPUs
this process may use, from an offset per server), ``pin`` applies them in ``post_fork``
(``SERVING_CPU_AFFINITY=auto``), or ``pin_while_quiet`` only while the worker serves about
one request at a time (``adaptive``, the default: ``QuietGate`` decides).

A slot is the worker's index among the live workers (``pre_fork`` gives the lowest free
one); ``per_worker`` is ``SERVING_BLAS_THREADS``. Linux only (``os.sched_setaffinity``).
Imports only the standard library.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["QuietGate", "cpus_for_slot", "pin", "pin_while_quiet"]


def cpus_for_slot(slot: int, cpus: list[int], per_worker: int, start: int = 0) -> set[int]:
    """The ``per_worker`` CPUs of worker ``slot``, round-robin over ``cpus`` from the
    ``start``-th (modulo): the master passes its pid, so two servers on one host do not
    both put their first worker on the first CPU.

    Why pin: a worker's request threads and batcher thread hand the GIL back and forth
    thousands of times a second; on one CPU a hand-off is a cheap switch, across CPUs each
    wake-up crosses cores. Why not always (``QuietGate``): a worker pinned to a CPU that
    nginx or the clients also use cannot move off it under load.
    """
    first = start + slot * per_worker
    return {cpus[(first + i) % len(cpus)] for i in range(min(per_worker, len(cpus)))}


def pin(server: Any, worker: Any, per_worker: int) -> None:
    """Pin this worker to its CPUs (``cpus_for_slot``), before any thread starts: threads
    inherit the affinity of the thread creating them."""
    chosen = _worker_cpus(server, worker, per_worker, os.sched_getaffinity(0))
    os.sched_setaffinity(0, chosen)
    server.log.info("worker %s pinned to CPU %s", worker.pid, ",".join(map(str, sorted(chosen))))


def _worker_cpus(server: Any, worker: Any, per_worker: int, allowed: set[int]) -> set[int]:
    """This worker's CPUs among ``allowed`` (``cpus_for_slot`` from its slot, starting at
    the master's pid)."""
    slot = getattr(worker, "serving_slot", 0)
    return cpus_for_slot(slot, sorted(allowed), per_worker, start=server.pid)


class QuietGate:
    """Whether a worker is quiet: about one request at a time in flight, from samples of
    its active connections (a moving average, with hysteresis so that it does not flap).

    Why: pinned to one CPU, a worker's threads hand the GIL to each other with a local
    switch, the lowest latency at one connection (p50 0.62-0.75x the naive server where
    unpinned gave 0.80-1.39x). Under load, a worker pinned to a CPU that nginx or the
    clients also need cannot move off it, nor use an idle one: batches of 1.7-2.4 and
    connection shares of 64/0 in some runs at 64 connections (docs/batching.md, "Third
    pass"). So: pinned while quiet, everywhere once busy.

    :param pin_below: the average under which the worker pins itself (active requests).
    :param unpin_above: the average over which it unpins itself.
    :param weight: the newest sample's weight in the average.

    Usage::

        gate = QuietGate()
        gate.update(1)   # True: quiet, pin
        gate.update(30)  # False once the average passes unpin_above
    """

    __slots__ = ("average", "pin_below", "quiet", "unpin_above", "weight")

    def __init__(self, pin_below: float = 1.5, unpin_above: float = 2.5, weight: float = 0.3):
        self.pin_below, self.unpin_above, self.weight = pin_below, unpin_above, weight
        self.average = 0.0
        self.quiet = True

    def update(self, active: int) -> bool:
        """Add one sample (requests in flight now); whether the worker is quiet."""
        self.average += self.weight * (active - self.average)
        if self.quiet and self.average > self.unpin_above:
            self.quiet = False
        elif not self.quiet and self.average < self.pin_below:
            self.quiet = True
        return self.quiet


def pin_while_quiet(
    server: Any, worker: Any, per_worker: int, interval_s: float = 0.05
) -> threading.Thread | None:
    """Pin every thread of this worker (a gthread worker) to its CPUs (``cpus_for_slot``)
    while ``QuietGate`` finds it quiet, and let them run on every CPU of the process
    while it is busy, sampling its active connections (open, neither idle in keep-alive
    nor waiting for their first bytes) every ``interval_s`` seconds on a daemon thread.
    Threads started later inherit the affinity of the thread starting them. Returns the
    thread; None for a worker that does not count its connections (not a ``ServingWorker``)."""
    if not hasattr(worker, "idle_connections"):
        return None
    everywhere = os.sched_getaffinity(0)
    chosen = _worker_cpus(server, worker, per_worker, everywhere)
    server.log.info(
        "worker %s runs on CPU %s while it serves one request at a time, on every CPU when "
        "busy", worker.pid, ",".join(map(str, sorted(chosen))),
    )  # fmt: skip

    def active() -> int:
        return max(0, int(worker.nr_conns) - int(worker.idle_connections()))

    gate = QuietGate()
    _set_threads(chosen)
    thread = threading.Thread(
        target=_watch, args=(gate, active, chosen, everywhere, interval_s),
        name="serving-pinning", daemon=True,
    )  # fmt: skip
    thread.start()
    return thread


def _watch(
    gate: QuietGate,
    active: Callable[[], int],
    chosen: set[int],
    everywhere: set[int],
    interval_s: float,
) -> None:
    pinned = True
    while True:
        time.sleep(interval_s)
        quiet = gate.update(active())
        if quiet is not pinned:
            _set_threads(chosen if quiet else everywhere)
            pinned = quiet


def _set_threads(cpus: set[int]) -> None:
    """Every thread of this process on ``cpus``."""
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # ended meanwhile
            os.sched_setaffinity(int(task), cpus)
