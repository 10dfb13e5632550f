"""Each worker on its own CPUs: ``cpus_for_slot`` chooses them (round-robin over the CPUs
this process may use, from an offset per server), ``pin`` applies them in ``post_fork``.

A slot is the worker's index among the live workers (``pre_fork`` gives the lowest free
one); ``per_worker`` is ``SERVING_BLAS_THREADS``. Linux only (``os.sched_setaffinity``).
Imports only the standard library.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["cpus_for_slot", "pin"]


def cpus_for_slot(slot: int, cpus: list[int], per_worker: int, start: int = 0) -> set[int]:
    """The ``per_worker`` CPUs of worker ``slot``, round-robin over ``cpus`` from the
    ``start``-th (modulo): the master passes its pid, so two servers on one host do not
    both put their first worker on the first CPU.

    Why pin (``SERVING_CPU_AFFINITY=auto``; off by default): a worker's request threads
    and batcher thread hand the GIL back and forth thousands of times a second; on one CPU
    a hand-off is a cheap switch, across CPUs each wake-up crosses cores. Pinned, the one
    connection latency is lower; but a worker pinned to a CPU that nginx or the clients
    also use cannot move off it, and at 64 connections its batches fell to 1.7-2.4 in
    some runs (docs/architecture.md, "Pinning").
    """
    first = start + slot * per_worker
    return {cpus[(first + i) % len(cpus)] for i in range(min(per_worker, len(cpus)))}


def pin(server: Any, worker: Any, per_worker: int) -> None:
    """Pin this worker to its CPUs (``cpus_for_slot``), before any thread starts: threads
    inherit the affinity of the thread creating them."""
    cpus = sorted(os.sched_getaffinity(0))
    slot = getattr(worker, "serving_slot", 0)
    chosen = cpus_for_slot(slot, cpus, per_worker, start=server.pid)
    os.sched_setaffinity(0, chosen)
    server.log.info("worker %s pinned to CPU %s", worker.pid, ",".join(map(str, sorted(chosen))))
