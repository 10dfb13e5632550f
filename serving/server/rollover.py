"""How the master (a Gunicorn ``Arbiter``) rolls workers over: ``roll_over(server, board)``
changes it so that

* a change of the model repository that only models loaded in each worker take is no
  rollover: the running workers take it in place (``in_place``);
* a reload (``SIGHUP``) stops an old worker only once a new one is ready: capacity never
  drops (Gunicorn itself stops all old workers at once, and new ones load for seconds);
  old workers that serve nothing (failed to load) are stopped at once, and the master
  handles the next signal as soon as the new workers are forked;
* a reload whose settings have become invalid (``check``) is refused before Gunicorn
  re-reads its configuration, whose settings check would exit the master (and with it
  every worker); the board says why (``/healthz``: ``"rollout": "failed"``);
* after the first boot, no worker exit halts the server (Gunicorn halts on exit status 3 or
  4 whenever it comes: a model calling ``os._exit(3)`` would stop every worker);
* a worker leaving for ``SERVING_MAX_REQUESTS`` (``serving.server.recycling``) is replaced
  as soon as it leaves, while it drains;
* after workers died while loading (a version whose load crashes the process), no worker
  is forked while ``hold`` says (``serving.server.respawn``: 1 s, doubling to 60 s, until
  the newest workers all serve): Gunicorn forked the next one at once, 28 a second;
* after a reload, every worker forked before it is replaced by one forked after it,
  whatever dies meanwhile: a new worker killed while it loads (the OOM killer during its
  warm-up) is replaced by another new one. It was not (the old and new workers together
  were as many as wanted), so one old worker served the old model until the next reload.

Why the arbiter's methods are replaced on the instance (``install``) rather than through
a documented hook: Gunicorn has no hook between a reload's fork of the new workers and its
stop of the old ones, and ``gunicorn wsgi:app`` builds its own ``Arbiter`` (no setting
names an arbiter class). This is the one place ``serving`` still changes a Gunicorn
object it did not create.

The workers' states come from the board (``serving.server.board``); the master looks at
every reap and at least once a second.

Imports only the standard library.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from serving.server.board import GOING, Board
from serving.server.recycling import RecycleGate
from serving.server.respawn import Backoff

__all__ = ["roll_over"]


def roll_over(
    server: Any,
    board: Board,
    on_booted: Callable[[], None],
    *,
    gate: RecycleGate | None = None,
    on_stop: Callable[[], None] = lambda: None,
    check: Callable[[], str | None] = lambda: None,
    hold: Backoff | None = None,
    in_place: Callable[[], bool] = lambda: False,
) -> None:
    """Make the Gunicorn arbiter ``server`` roll workers over one by one and stop halting
    once the first boot is over (see the module docstring and ``_RollOver``);
    ``on_booted()`` is called once, in the master, when every first-boot worker is ready.
    ``gate`` learns the number of workers wanted each time the master looks;
    ``on_stop()`` is called as the master stops the whole server, before its workers;
    ``check()``, at each reload before anything is re-read, says why the reload would
    fail (an invalid setting), or None; ``hold``, after workers died loading, when to
    fork none; ``in_place()``, at a reload the check passed, whether the running workers
    took it in place (``serving.server.in_place``: then nothing is forked)."""
    _RollOver(
        server, board, on_booted, gate=gate, on_stop=on_stop, check=check, hold=hold,
        in_place=in_place,
    ).install()  # fmt: skip


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
        *,
        gate: RecycleGate | None = None,
        on_stop: Callable[[], None] = lambda: None,
        check: Callable[[], str | None] = lambda: None,
        hold: Backoff | None = None,
        in_place: Callable[[], bool] = lambda: False,
    ) -> None:
        self.server, self.board, self.on_booted, self.gate = server, board, on_booted, gate
        self.on_stop, self.check, self.hold, self.in_place = on_stop, check, hold, in_place
        self._said_held = False
        self.retiring: set[int] = set()
        #: Workers forked before the last reload: none counts towards the new generation.
        self.older: set[int] = set()
        self.booted = False
        self.reloading = self.spawned = False
        self._reap, self._reload, self._stop_all = server.reap_workers, server.reload, server.stop

    def install(self) -> None:
        self.server.reap_workers = self.reap_workers
        self.server.manage_workers = self.manage_workers
        self.server.reload = self.reload
        self.server.stop = self.stop

    def stop(self, graceful: bool = True) -> None:
        """Gunicorn's ``stop`` (one signal to each worker, then reaps until they exit), with
        every worker marked as stopping first: one a reload forked just before may not have
        its handler yet and lose the signal, then load and serve until the graceful
        timeout kills it; ``sync``, at each reap, sends it again as to any stopped worker."""
        self.on_stop()
        for pid in self.server.WORKERS:
            self.retiring.add(pid)
            self.board.write(pid, "stopping")
        self._stop_all(graceful)

    def reap_workers(self) -> None:
        self.sync()
        self._reap()
        if self.reloading and self.spawned:
            raise _StopWaiting  # reload() reaps only in its final wait: end it here

    def manage_workers(self) -> None:
        server = self.server
        states = self.board.read().states
        staying = [p for p in server.WORKERS if states.get(p) not in GOING and p not in self.older]
        if self.hold is not None and sum(states.get(p) == "ready" for p in staying) >= (
            server.num_workers
        ):
            self.hold.settle()  # the newest workers all serve: no pause
        held = self.hold is not None and self.hold.holding()
        if len(server.WORKERS) < server.num_workers and not held:
            server.spawn_workers()
        self.sync()
        states = self.board.read().states
        staying = [p for p in server.WORKERS if states.get(p) not in GOING and p not in self.older]
        if held and len(staying) < server.num_workers and not self._said_held:
            self._said_held = True
            server.log.info("worker replacement paused: workers died while loading")
        self._said_held = self._said_held and held
        for _ in range(0 if held else server.num_workers - len(staying)):
            # a recycling worker's replacement, while it drains; after a reload, a new
            # worker's in place of one that died
            server.spawn_worker()
        self.spawned = self.reloading  # reload() manages its workers once, after forking

    def reload(self) -> None:
        problem = self.check()
        self.board.note_reload(problem)
        if problem is not None:
            self.server.log.error("reload refused: %s; the running workers serve on", problem)
            return
        if self.in_place():
            return
        self.older |= set(self.server.WORKERS)
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
        self.older.intersection_update(server.WORKERS)
        for pid in list(self.retiring):
            if fleet.states.get(pid, "stopping") not in GOING:
                self._stop(pid, "again: it had no handler for the first SIGTERM yet")
        workers = sorted(
            (p for p in server.WORKERS if fleet.states.get(p) not in GOING),
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
