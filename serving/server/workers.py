"""What the workers of one server know about each other, and how the master rolls them over.

Gunicorn workers share nothing but the listening socket, so each one publishes its state in
a small JSON file named after its pid in a directory the master creates before the first
fork (``Board``). The master removes a dead worker's file in ``child_exit`` and the whole
directory when it exits. States::

    starting  first boot: loads while accepting (probes answer, predicts get 503)  counted
    warming   after first boot: loads before accepting                         not counted
    failed    after first boot: its load failed; retried with backoff, not accepting
    ready     every model loaded and batching, accepting                            counted
    leaving   stopped accepting (recycling), answering what it accepted       not counted
    stopping  stopped by the master (a reload, SIGTTOU), answering what it accepted

The server is ready (``Fleet.ready``) when at least one worker is counted and every counted
worker is ready. A worker that is ``warming`` or ``failed`` takes no connections, so it
cannot make a request fail; it only shows up in ``/healthz``.

``roll_over(server, board)`` changes the master (a Gunicorn ``Arbiter``) so that

* a reload (``SIGHUP``) stops an old worker only once a new one is ready: capacity never
  drops (Gunicorn itself stops all old workers at once, and new ones load for seconds);
  old workers that serve nothing (failed to load) are stopped at once, and the master
  handles the next signal as soon as the new workers are forked;
* after the first boot, no worker exit halts the server (Gunicorn halts on exit status 3 or
  4 whenever it comes: a model calling ``os._exit(3)`` would stop every worker).

``RecycleGate`` lets one worker at a time leave for ``SERVING_MAX_REQUESTS``: a worker leaves
only when no other is loading and the earlier leaver's replacement serves; the master forks
a leaver's replacement as soon as it leaves, not once it has exited.

Imports only the standard library.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "Board",
    "alive",
    "Fleet",
    "RecycleGate",
    "WorkerState",
    "install_board",
    "readiness",
    "roll_over",
]

log = logging.getLogger(__name__)

WorkerState = Literal["starting", "warming", "failed", "ready", "leaving", "stopping"]
_COUNTED = ("starting", "ready")
_GOING = ("leaving", "stopping")


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a signal 0 reaches it, or it is another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Fleet:
    """The workers of this server as their state files say: ``ready`` and ``total`` count
    the workers that accept connections (``starting`` or ``ready``)."""

    states: dict[int, WorkerState]
    errors: dict[int, str] = field(default_factory=dict)
    #: What each loading worker is doing (``model 'churn': warming up``).
    stages: dict[int, str] = field(default_factory=dict)

    @property
    def ready_count(self) -> int:
        return sum(state == "ready" for state in self.states.values())

    @property
    def total(self) -> int:
        return sum(state in _COUNTED for state in self.states.values())

    @property
    def ready(self) -> bool:
        return self.total > 0 and self.ready_count == self.total

    def count(self, state: WorkerState) -> int:
        return sum(s == state for s in self.states.values())

    def summary(self) -> dict[str, Any]:
        """``{"ready": N, "total": M}``, plus ``loading``/``failed`` counts, the stage each
        loading worker is at and the last load error of each failed worker when there are
        any (for ``/healthz``). With a
        failed worker, ``"rollout": "failed"``: a worker forked after the first boot (a
        reload, respawn or recycle) cannot load the model, and the others serve on."""
        body: dict[str, Any] = {"ready": self.ready_count, "total": self.total}
        loading = self.count("warming") + self.count("starting")
        if loading:
            body["loading"] = loading
            stages = [
                {"pid": pid, "stage": stage}
                for pid, stage in sorted(self.stages.items())
                if self.states.get(pid) in ("warming", "starting")
            ]
            if stages:
                body["stages"] = stages
        if self.count("failed"):
            body["failed"] = self.count("failed")
            body["rollout"] = "failed"
            body["errors"] = [
                {"pid": pid, "error": error}
                for pid, error in sorted(self.errors.items())
                if self.states.get(pid) == "failed"
            ]
        return body


class Board:
    """One directory of ``<pid>`` JSON files: each worker's state, readable by all.

    Usage::

        board = Board.create()                  # master, before the first fork
        board.write(os.getpid(), "ready")       # worker
        board.read().ready                      # any process
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls) -> Board:
        """A new empty directory under the system temporary directory."""
        return cls(Path(tempfile.mkdtemp(prefix="serving-workers-")))

    def write(
        self, pid: int, state: WorkerState, error: str | None = None, stage: str | None = None
    ) -> None:
        """Publish ``pid``'s state atomically (write, then rename over the old file), with
        its load error or, while it loads, the stage it is at."""
        temporary = self.path / f".{pid}.tmp"
        temporary.write_text(json.dumps({"state": state, "error": error, "stage": stage}))
        os.replace(temporary, self.path / str(pid))

    def remove(self, pid: int) -> None:
        (self.path / str(pid)).unlink(missing_ok=True)

    def read(self) -> Fleet:
        """The state of every live worker with a file (a file whose process is gone, or that
        cannot be parsed, is skipped)."""
        states: dict[int, WorkerState] = {}
        errors: dict[int, str] = {}
        stages: dict[int, str] = {}
        try:
            entries = list(self.path.iterdir())
        except OSError:
            return Fleet(states)
        for entry in entries:
            if not entry.name.isdigit() or not alive(int(entry.name)):
                continue
            try:
                data = json.loads(entry.read_text())
            except (OSError, ValueError):
                continue
            states[int(entry.name)] = data["state"]
            if data.get("error"):
                errors[int(entry.name)] = data["error"]
            if data.get("stage"):
                stages[int(entry.name)] = data["stage"]
        return Fleet(states, errors, stages)

    def destroy(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class RecycleGate:
    """At most one worker at a time is away for ``max_requests``.

    Created by the master before the first fork (a lock and the configured number of
    workers in shared memory, which the forked workers inherit; the master updates the
    number, ``target``, as ``SIGTTIN``/``SIGTTOU`` change it). ``try_leave(pid)`` succeeds
    only when no other worker is loading or failed, at least ``target - 1`` others are
    ``ready`` (the previous leaver's replacement, forked as soon as it left, serves) and
    at most one other is still ``leaving`` (draining: up to 2 s for kept-alive
    connections; so recycles keep at most ``target + 2`` processes; workers the master is
    ``stopping`` after a reload do not count). No slot is held
    between recycles, so nothing has to free one: a reload or ``SIGTTIN`` during a
    recycle once left the slot taken for good, and no worker recycled again.
    """

    def __init__(self, board: Board) -> None:
        self.board = board
        self._lock = multiprocessing.Lock()
        self._target = multiprocessing.RawValue("i", 0)

    @property
    def target(self) -> int:
        return int(self._target.value)

    @target.setter
    def target(self, workers: int) -> None:
        self._target.value = workers

    def try_leave(self, pid: int) -> bool:
        """Whether worker ``pid`` may leave now; if so it is marked ``leaving``."""
        with self._lock:
            others = [s for p, s in self.board.read().states.items() if p != pid]
            if any(state not in ("ready", *_GOING) for state in others):
                return False  # one is loading or failed
            if others.count("leaving") > 1 or others.count("ready") < self.target - 1:
                return False
            self.board.write(pid, "leaving")
            return True


_installed: Board | None = None


def install_board(board: Board) -> None:
    """Make ``board`` this server's (the master, before the first fork)."""
    global _installed
    _installed = board


def readiness(local_state: str) -> tuple[bool, dict[str, Any] | None]:
    """Whether this server is ready, given this worker's models' state, and the workers'
    summary for the probes (None outside our Gunicorn hooks: then this worker is all)."""
    board = _installed
    if board is None:
        return local_state == "ready", None
    fleet = board.read()
    return local_state == "ready" and fleet.ready, fleet.summary()


def roll_over(
    server: Any, board: Board, on_booted: Callable[[], None], gate: RecycleGate | None = None
) -> None:
    """Make the Gunicorn arbiter ``server`` roll workers over one by one and stop halting
    once the first boot is over (see the module docstring and ``_RollOver``);
    ``on_booted()`` is called once, in the master, when every first-boot worker is ready.
    ``gate`` learns the number of workers wanted each time the master looks."""
    _RollOver(server, board, on_booted, gate).install()


class _RollOver:
    """The master's side of ``roll_over``: which workers to stop, and when.

    Each time the master looks (every reap, and at least once a second): a worker that is
    ``leaving`` (recycling) or ``stopping`` no longer counts, so a leaver's replacement is
    forked at once; of the other workers beyond ``num_workers`` (the oldest), every one
    that serves nothing (``failed``, ``warming``: a reload onto a broken file left them) is
    stopped at once, a ``ready`` one only while more than ``num_workers`` are ready. A
    stopped worker that writes another state afterwards did not get the signal (it came
    before the worker had a handler: a fresh fork still runs the master's) and is sent it
    again.

    Gunicorn's ``reload()`` ends by waiting, up to the graceful timeout, for every old
    worker to exit, handling no signal meanwhile: when the new workers cannot load, the
    old ones never exit, and a second ``SIGHUP`` (the fix) or a ``SIGTERM`` waited the
    whole timeout. Here the reload returns once it has forked the new workers, and the
    main loop stops the old ones as above.
    """

    def __init__(
        self,
        server: Any,
        board: Board,
        on_booted: Callable[[], None],
        gate: RecycleGate | None = None,
    ) -> None:
        self.server, self.board, self.on_booted, self.gate = server, board, on_booted, gate
        self.retiring: set[int] = set()
        self.booted = False
        self.reloading = self.spawned = False
        self._reap, self._reload = server.reap_workers, server.reload

    def install(self) -> None:
        self.server.reap_workers = self.reap_workers
        self.server.manage_workers = self.manage_workers
        self.server.reload = self.reload

    def reap_workers(self) -> None:
        self.sync()
        self._reap()
        if self.reloading and self.spawned:
            raise _StopWaiting  # reload() reaps only in its final wait: end it here

    def manage_workers(self) -> None:
        server = self.server
        if len(server.WORKERS) < server.num_workers:
            server.spawn_workers()
        self.sync()
        states = self.board.read().states
        staying = [p for p in server.WORKERS if states.get(p) not in _GOING]
        for _ in range(server.num_workers - len(staying)):
            server.spawn_worker()  # a recycling worker's replacement, while it drains
        self.spawned = self.reloading  # reload() manages its workers once, after forking

    def reload(self) -> None:
        self.reloading, self.spawned = True, False
        try:
            self._reload()
        except _StopWaiting:
            pass
        finally:
            self.reloading = self.spawned = False

    def sync(self) -> None:
        server, fleet = self.server, self.board.read()
        everyone = min(server.num_workers, len(server.WORKERS))
        if not self.booted and fleet.ready and fleet.ready_count >= everyone:
            self.booted = True
            # reap_workers halts on these exit statuses; no process exits with -1 (and
            # None would match a worker killed by a signal, whose exit status is None).
            server.WORKER_BOOT_ERROR = -1
            server.APP_LOAD_ERROR = -1
            self.on_booted()
        if self.gate is not None:
            self.gate.target = server.num_workers
        self.retiring.intersection_update(server.WORKERS)
        for pid in list(self.retiring):
            if fleet.states.get(pid, "stopping") not in _GOING:
                self._stop(pid, "again: it had no handler for the first SIGTERM yet")
        workers = sorted(
            (p for p in server.WORKERS if fleet.states.get(p) not in _GOING),
            key=lambda pid: server.WORKERS[pid].age,
        )
        excess = len(workers) - server.num_workers
        if excess <= 0:
            return
        ready = [pid for pid in workers if fleet.states.get(pid) == "ready"]
        spare = len(set(ready) - self.retiring) - server.num_workers
        for pid in workers[:excess]:
            if pid in self.retiring:
                continue
            if fleet.states.get(pid) != "ready":
                self._stop(pid, "it serves nothing; newer workers replace it")
            elif spare > 0:
                spare -= 1
                self._stop(pid, "a newer worker is ready")

    def _stop(self, pid: int, why: str) -> None:
        self.retiring.add(pid)
        self.board.write(pid, "stopping")  # no longer counted, nor waited for by the gate
        self.server.log.info("worker %s: stopping (%s)", pid, why)
        self.server.kill_worker(pid, signal.SIGTERM)


class _StopWaiting(Exception):
    """Ends Gunicorn's ``reload()`` at its wait for the old workers (``_RollOver``)."""
