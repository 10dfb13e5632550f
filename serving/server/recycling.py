"""One worker at a time leaves for ``SERVING_MAX_REQUESTS``: the gate (``RecycleGate``,
shared memory the master creates before the first fork) and each worker's watcher
(``recycle_one_at_a_time``) that replaces Gunicorn's own ``max_requests`` exit.

A worker leaves only when no other is loading and the earlier leaver's replacement serves;
the master forks a leaver's replacement as soon as it leaves, not once it has exited
(``serving.server.rollover``). Counts are requests; the watcher looks every 50 ms.

Imports only the standard library.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from typing import Any

from serving.server.board import GOING, Board

__all__ = ["RecycleGate", "recycle_one_at_a_time"]

#: The board's lock (``Board.locked``) a worker holds to look and leave.
_LOCK = "recycle.lock"


class RecycleGate:
    """At most one worker at a time is away for ``max_requests``.

    Created by the master before the first fork: the configured number of workers
    (``target``, in shared memory the forked workers inherit; the master updates it as
    ``SIGTTIN``/``SIGTTOU`` change it) and a lock on the board (``Board.locked``: a
    worker killed inside leaves it free). ``try_leave(pid)`` succeeds only when no other
    worker is loading or failed, at least ``target - 1`` others are ``ready`` (the
    previous leaver's replacement, forked as soon as it left, serves) and at most one
    other is still ``leaving`` (draining: up to 2 s for kept-alive connections; so
    recycles keep at most ``target + 2`` processes; workers the master is ``stopping``
    after a reload do not count). No slot is held between recycles, so nothing has to
    free one: a reload or ``SIGTTIN`` during a recycle once left the slot taken for
    good, and no worker recycled again.
    """

    def __init__(self, board: Board) -> None:
        self.board = board
        self._target = multiprocessing.RawValue("i", 0)

    @property
    def target(self) -> int:
        return int(self._target.value)

    @target.setter
    def target(self, workers: int) -> None:
        self._target.value = workers

    def try_leave(self, pid: int) -> bool:
        """Whether worker ``pid`` may leave now; if so it is marked ``leaving``. A worker
        the master is stopping (a reload) may not: it goes anyway, and as ``leaving`` it
        would hold up the next leaver."""
        with self.board.locked(_LOCK):
            states = self.board.read().states
            if states.get(pid) in GOING:
                return False
            others = [s for p, s in states.items() if p != pid]
            if any(state not in ("ready", *GOING) for state in others):
                return False  # one is loading or failed
            if others.count("leaving") > 1 or others.count("ready") < self.target - 1:
                return False
            self.board.write(pid, "leaving")
            return True


def recycle_one_at_a_time(server: Any, worker: Any, gate: RecycleGate | None) -> None:
    """Worker: replace Gunicorn's own ``max_requests`` exit (each worker on its own, so two
    can leave in the same second) by one through ``gate``: the worker leaves (a graceful
    ``SIGTERM`` to itself) only when no other worker is loading and the previous leaver's
    replacement serves; until then it goes on serving. Leaving, it wakes the master
    (``SIGCHLD``: look at the workers), which forks its replacement at once. Without a gate
    (outside our hooks) or a limit, Gunicorn's own handling stays.

    :param worker: a ``ServingWorker`` (``recycle_by_hand`` turns Gunicorn's exit off)."""
    if gate is None:
        return
    limit = worker.recycle_by_hand()
    if limit is None:
        return
    pid = os.getpid()

    def watch() -> None:
        while worker.nr < limit or not gate.try_leave(pid):
            time.sleep(0.05)
        server.log.info(
            "worker %s: recycling after %s requests (SERVING_MAX_REQUESTS, one worker at a time)",
            pid,
            worker.nr,
        )
        os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(OSError):
            os.kill(os.getppid(), signal.SIGCHLD)

    threading.Thread(target=watch, name="serving-recycle", daemon=True).start()
