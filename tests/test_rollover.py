"""The master's rollover (``serving.server.rollover``) against a stand-in arbiter."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from serving.server.board import Board
from serving.server.rollover import roll_over
from tests.conftest import sleeping_processes


class Arbiter:
    """What ``roll_over`` uses of Gunicorn's ``Arbiter``; ``stop`` as Gunicorn's: one
    signal to every worker, then reaps while they exit (here once, after ``meanwhile``)."""

    def __init__(self, pids: list[int], meanwhile: Callable[[], None]) -> None:
        self.WORKERS = {pid: SimpleNamespace(age=age) for age, pid in enumerate(pids)}
        self.num_workers = len(pids)
        self.signals: list[tuple[int, int]] = []
        self.log = SimpleNamespace(info=lambda *args: None)
        self.meanwhile = meanwhile

    def kill_worker(self, pid: int, sig: int) -> None:
        self.signals.append((pid, sig))

    def reap_workers(self) -> None:
        pass

    def manage_workers(self) -> None:
        pass

    def reload(self) -> None:
        pass

    def stop(self, graceful: bool = True) -> None:
        for pid in self.WORKERS:
            self.kill_worker(pid, signal.SIGTERM)
        self.meanwhile()
        self.reap_workers()


@pytest.fixture
def workers() -> Iterator[list[int]]:
    """Two live processes standing for workers (the board skips dead pids)."""
    yield from sleeping_processes(2)


def test_roll_over_stop_signals_again_a_worker_forked_too_late_for_the_first(
    tmp_path: Path, workers: list[int]
) -> None:
    """Found by the attack: SIGTERM right after SIGHUP reached a worker the reload had just
    forked before it had a handler (the master's own, which only queues it, ran): it loaded,
    accepted connections after the shutdown began, and was killed at the graceful timeout
    (the master exited after 15 s, not 2). A worker that writes a state after the stop's
    SIGTERM is sent it again, as a worker stopped by the rollover is."""
    old, fresh = workers
    board = Board(tmp_path)
    board.write(old, "ready")
    board.write(fresh, "warming")
    server: Any = Arbiter([old, fresh], meanwhile=lambda: board.write(fresh, "warming"))
    roll_over(server, board, on_booted=lambda: None)

    server.stop()

    assert server.signals.count((fresh, signal.SIGTERM)) == 2
    assert server.signals.count((old, signal.SIGTERM)) == 1


class ReloadingArbiter(Arbiter):
    """A stand-in arbiter whose ``reload`` forks ``fresh`` workers (Gunicorn's: spawn,
    then manage) and whose ``spawn_worker`` takes the next of ``spares``."""

    def __init__(self, pids: list[int], fresh: list[int], spares: list[int]) -> None:
        super().__init__(pids, meanwhile=lambda: None)
        self.fresh, self.spares = fresh, spares
        self.spawned: list[int] = []

    def spawn_worker(self) -> None:
        pid = self.spares.pop(0)
        self.WORKERS[pid] = SimpleNamespace(age=100 + len(self.spawned))
        self.spawned.append(pid)

    def spawn_workers(self) -> None:
        while len(self.WORKERS) < self.num_workers:
            self.spawn_worker()

    def reload(self) -> None:
        for age, pid in enumerate(self.fresh, start=10):
            self.WORKERS[pid] = SimpleNamespace(age=age)
        self.manage_workers()


@pytest.fixture
def five() -> Iterator[list[int]]:
    yield from sleeping_processes(5)


def test_a_new_worker_killed_while_it_loads_is_replaced_by_another_new_one(
    tmp_path: Path, five: list[int]
) -> None:
    """Found by the attack: after a HUP, a new worker SIGKILLed during its warm-up was not
    replaced (two old and one new worker were as many as wanted), the rollover retired one
    old worker, and the other served the old model until the next reload."""
    old_a, old_b, new_a, new_b, spare = five
    board = Board(tmp_path)
    for pid in (old_a, old_b):
        board.write(pid, "ready")
    server: Any = ReloadingArbiter([old_a, old_b], fresh=[new_a, new_b], spares=[spare])
    roll_over(server, board, on_booted=lambda: None)
    server.reload()
    for pid in (new_a, new_b):
        board.write(pid, "warming")

    del server.WORKERS[new_a]  # killed while it loads
    board.remove(new_a)
    server.manage_workers()

    assert server.spawned == [spare]  # a new one in its place
    board.write(new_b, "ready")
    board.write(spare, "ready")
    server.manage_workers()
    stopped = {pid for pid, sig in server.signals if sig == signal.SIGTERM}
    assert stopped == {old_a, old_b}  # every old worker goes, once the new ones serve


def test_the_board_shows_a_fleet_of_two_generations_as_a_rollout_in_progress(
    tmp_path: Path, five: list[int]
) -> None:
    old_a, old_b, new_a, _, _ = five
    board = Board(tmp_path)
    board.generation = 0
    board.write(old_a, "ready")
    board.write(old_b, "ready")
    board.generation = 1
    board.write(new_a, "warming")
    master = Board(tmp_path)  # the master's writes keep each worker's generation
    master.write(old_b, "stopping")

    summary = board.read().summary()

    assert summary["rollout"] == "in_progress"
    assert summary["generations"] == [
        {"generation": 0, "ready": 1, "workers": 1},  # old_b is stopping: not counted
        {"generation": 1, "ready": 0, "workers": 1},
    ]
    board.write(new_a, "ready")
    master.write(old_a, "stopping")
    assert "rollout" not in board.read().summary()  # one generation serves: it is over


def test_a_worker_retrying_a_failed_load_keeps_the_rollout_failed(
    tmp_path: Path, five: list[int]
) -> None:
    """/healthz lost ``"rollout": "failed"`` in ~7 % of samples during a failed rollout,
    while the new workers were between retries (warming again, their error cleared)."""
    ready, retrying = five[:2]
    board = Board(tmp_path)
    board.write(ready, "ready")
    board.write(retrying, "warming", "model 'm': cannot load")

    summary = board.read().summary()

    assert summary["rollout"] == "failed"
    assert summary["errors"] == [{"pid": retrying, "error": "model 'm': cannot load"}]


def test_a_reload_with_invalid_settings_is_refused_and_the_board_says_why(
    tmp_path: Path, workers: list[int]
) -> None:
    """A reload whose ``check`` finds a problem forks nothing and stops nobody (Gunicorn's
    reload, which would re-read the settings and exit the master, is not called); the
    board shows it until a reload goes ahead."""
    board = Board(tmp_path)
    for pid in workers:
        board.write(pid, "ready")
    server = Arbiter(workers, meanwhile=lambda: None)
    reloads: list[int] = []
    server.reload = lambda: reloads.append(1)  # type: ignore[method-assign]
    logged: list[str] = []
    server.log = SimpleNamespace(info=lambda *args: None, error=lambda m, *a: logged.append(m % a))
    problems = ["invalid setting SERVING_MODEL_PATH: gone", None]
    roll_over(server, board, on_booted=lambda: None, check=lambda: problems.pop(0))

    server.reload()
    refused = board.read().summary()
    server.reload()
    accepted = board.read().summary()

    assert reloads == [1]  # the second only
    assert server.signals == []
    assert logged == [
        "reload refused: invalid setting SERVING_MODEL_PATH: gone; the running workers serve on"
    ]
    assert refused["rollout"] == "failed"
    assert refused["errors"][0]["error"] == "invalid setting SERVING_MODEL_PATH: gone"
    assert refused["ready"] == 2
    assert "rollout" not in accepted and "errors" not in accepted


def _held(tmp_path: Path, five: list[int]) -> tuple[Any, Board, Any, list[float]]:
    """Two old workers ready and the arbiter rolling over with a backoff on a clock:
    (server, board, backoff, the clock's now)."""
    from serving.server.respawn import Backoff

    old_a, old_b, new_a, new_b, spare = five
    now = [0.0]
    backoff = Backoff(clock=lambda: now[0])
    board = Board(tmp_path)
    for pid in (old_a, old_b):
        board.write(pid, "ready")
    server: Any = ReloadingArbiter([old_a, old_b], fresh=[new_a, new_b], spares=[spare])
    roll_over(server, board, on_booted=lambda: None, hold=backoff)
    return server, board, backoff, now


def test_no_worker_is_forked_while_the_backoff_holds_after_deaths_while_loading(
    tmp_path: Path, five: list[int]
) -> None:
    """Found by the attack: a version whose load aborts the process killed each new
    worker, and the master forked the next at once (28 a second, without end)."""
    _, _, new_a, new_b, spare = five
    server, board, backoff, now = _held(tmp_path, five)
    server.reload()
    for pid in (new_a, new_b):
        board.write(pid, "warming")

    del server.WORKERS[new_a]  # died while loading
    board.remove(new_a)
    backoff.died_loading()
    server.manage_workers()
    assert server.spawned == []  # held: the old workers serve on
    assert server.signals == []
    now[0] += 1.5
    server.manage_workers()
    assert server.spawned == [spare]  # the pause is over


def test_the_backoff_ends_once_the_newest_workers_serve(tmp_path: Path, five: list[int]) -> None:
    """Found by the second attack: after a crash loop, the newest workers served, then
    one was killed (no load involved) and was not replaced until the pause ran out."""
    _, _, new_a, new_b, spare = five
    server, board, backoff, _ = _held(tmp_path, five)
    for _ in range(7):
        backoff.died_loading()  # a crash loop, 60 s pause
    server.reload()
    for pid in (new_a, new_b):
        board.write(pid, "ready")  # the fixed version serves
    server.manage_workers()
    del server.WORKERS[new_a]  # a healthy worker killed
    board.remove(new_a)
    server.manage_workers()
    assert server.spawned == [spare]  # at once
