"""Each worker on CPUs of its own: ``pin_while_quiet`` pins a worker's threads while it
serves about one request at a time (``SERVING_CPU_AFFINITY=adaptive``, the default:
``QuietGate`` decides), or always (``auto``: ``Always``), choosing its CPUs from those this
process may use (``cpus_for_slot``) and claiming them across the host (``CpuClaims``).

Three rules keep pinning from doing harm:

* **Only the process's own CPUs**: the choice is made from ``os.sched_getaffinity`` (a
  ``taskset`` or a container's cpuset), never from the host's count.
* **Two servers never share a CPU while others are free**: a pinned worker holds a lock
  file per CPU (``CpuClaims``: ``flock`` in ``/dev/shm``, released when it unpins or its
  process ends), and a worker finding every CPU claimed pins nothing until one is free.
  The first CPU used to be the master's pid modulo the CPU count: two one-worker servers
  whose pids had the same parity both pinned to CPU 0 (combined 4,689 answers where
  ``none`` gave 8,717 over 10 rounds).
* **A mask set from outside wins**: once a worker's affinity is not what it last set
  (``taskset -a -p``), it stops pinning, releases its claims and says so in one line.

A slot is the worker's index among the live workers (``pre_fork`` gives the lowest free
one); ``per_worker`` is ``SERVING_BLAS_THREADS``. Linux only (``os.sched_setaffinity``).
Imports only the standard library.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["Always", "CpuClaims", "QuietGate", "cpus_for_slot", "pin_while_quiet"]

#: Where the CPU claims of every server on the host meet.
CLAIMS_DIR = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
#: Least time between two attempts to claim CPUs while all are taken, in seconds.
RETRY_S = 1.0


def cpus_for_slot(slot: int, cpus: list[int], per_worker: int) -> list[int]:
    """``cpus`` in the order worker ``slot`` prefers them: round-robin from its
    ``slot * per_worker``-th, so that the workers of one server start apart.

    Why pin: a worker's request threads and batcher thread hand the GIL back and forth
    thousands of times a second; on one CPU a hand-off is a cheap switch, across CPUs each
    wake-up crosses cores. Why not always (``QuietGate``): a worker pinned to a CPU that
    nginx or the clients also use cannot move off it under load.
    """
    first = slot * per_worker
    return [cpus[(first + i) % len(cpus)] for i in range(len(cpus))]


class CpuClaims:
    """This process's claims on CPUs, exclusive across the host: one ``flock`` per CPU on
    ``serving-cpu-<n>.lock`` in ``directory``. A claim ends with ``release`` or with the
    process (the kernel drops its locks), so a killed server leaves none behind.

    Usage::

        claims = CpuClaims()
        claims.claim([1, 0], count=1)  # {1}, or {0} when another server holds CPU 1
        claims.release()
    """

    def __init__(self, directory: Path = CLAIMS_DIR) -> None:
        self.directory = directory
        self._held: dict[int, int] = {}  # cpu -> the descriptor holding its lock

    @property
    def held(self) -> set[int]:
        return set(self._held)

    def claim(self, preferred: list[int], count: int) -> set[int] | None:
        """Claim ``count`` CPUs (``min(count, len(preferred))``), the first free ones in
        ``preferred``; None, holding nothing, when fewer are free."""
        self.release()
        wanted = min(count, len(preferred))
        for cpu in preferred:
            if len(self._held) == wanted:
                break
            fd = self._lock(cpu)
            if fd is not None:
                self._held[cpu] = fd
        if len(self._held) < wanted:
            self.release()
            return None
        return self.held

    def _lock(self, cpu: int) -> int | None:
        path = self.directory / f"serving-cpu-{cpu}.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError:  # another user's file, or no such directory: not ours to take
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        return fd

    def release(self) -> None:
        for fd in self._held.values():
            with contextlib.suppress(OSError):
                os.close(fd)  # closing the descriptor drops its lock
        self._held.clear()


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


class Always:
    """The gate of ``SERVING_CPU_AFFINITY=auto``: pinned whatever the load."""

    def update(self, active: int) -> bool:
        return True


def pin_while_quiet(
    server: Any,
    worker: Any,
    per_worker: int,
    gate: QuietGate | Always | None = None,
    *,
    interval_s: float = 0.05,
    claims: CpuClaims | None = None,
) -> threading.Thread | None:
    """Pin every thread of this worker (a ``ServingWorker``, after fork, before its
    threads) to CPUs of its own while ``gate`` (a ``QuietGate`` by default) says so, and
    let them run on every CPU of the process otherwise, sampling its active connections
    (open, not idle on the main loop) every ``interval_s`` seconds on a daemon thread.
    Threads started later inherit the affinity of the thread starting them. Returns the
    thread; None for a worker that does not count its connections (not a
    ``ServingWorker``)."""
    if not hasattr(worker, "idle_connections"):
        return None
    pinner = _Pinner(
        server.log, worker.pid, per_worker,
        preferred=cpus_for_slot(getattr(worker, "serving_slot", 0),
                                sorted(os.sched_getaffinity(0)), per_worker),
        claims=claims or CpuClaims(),
    )  # fmt: skip

    def active() -> int:
        return max(0, int(worker.nr_conns) - int(worker.idle_connections()))

    gate = gate if gate is not None else QuietGate()
    pinner.want(gate.update(0))
    thread = threading.Thread(
        target=_watch, args=(gate, active, pinner, interval_s), name="serving-pinning",
        daemon=True,
    )  # fmt: skip
    thread.start()
    return thread


class _Pinner:
    """One worker's pinning: its claims, what it last set, and whether someone else has
    set its affinity since (then it is done)."""

    def __init__(
        self, log: Any, pid: int, per_worker: int, preferred: list[int], claims: CpuClaims
    ) -> None:
        self.log, self.pid, self.per_worker = log, pid, per_worker
        self.preferred, self.claims = preferred, claims
        self.everywhere = set(preferred)
        self.expected = self.everywhere  # the affinity this worker last set (or found)
        self.pinned = self.done = self._said_taken = False
        self._said: set[int] | None = None
        self._tried_at = float("-inf")

    def want(self, pinned: bool) -> None:
        """Pin (claiming CPUs) or unpin, if that changes anything; first of all, give up
        if someone else has set the worker's affinity (looked at every time: a quiet
        worker pinned for good kept its claim on a CPU ``taskset`` had taken it off)."""
        if self.done:
            return
        if os.sched_getaffinity(self.pid) != self.expected:  # its main thread's
            self.done = True
            self.claims.release()
            self.log.info(
                "worker %s: its CPU affinity was set from outside; it no longer pins itself",
                self.pid,
            )
            return
        if pinned is self.pinned:
            return
        if not pinned:
            self._set(self.everywhere)
            self.claims.release()
            self.pinned = False
            return
        now = time.monotonic()
        if now - self._tried_at < RETRY_S:
            return
        self._tried_at = now
        chosen = self.claims.claim(self.preferred, self.per_worker)
        if chosen is None:  # every CPU is claimed by another worker: stay unpinned
            if not self._said_taken:
                self._said_taken = True
                self.log.info(
                    "worker %s: every CPU it may use is pinned by another worker; it runs "
                    "unpinned until one is free", self.pid,
                )  # fmt: skip
            return
        self._set(chosen)
        self.pinned = True
        if chosen != self._said:
            self._said = chosen
            self.log.info(
                "worker %s pinned to CPU %s", self.pid, ",".join(map(str, sorted(chosen)))
            )

    def _set(self, cpus: set[int]) -> None:
        _set_threads(cpus)
        self.expected = cpus


def _watch(
    gate: QuietGate | Always, active: Callable[[], int], pinner: _Pinner, interval_s: float
) -> None:
    while not pinner.done:
        time.sleep(interval_s)
        pinner.want(gate.update(active()))


def _set_threads(cpus: set[int]) -> None:
    """Every thread of this process on ``cpus``."""
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # ended meanwhile
            os.sched_setaffinity(int(task), cpus)
