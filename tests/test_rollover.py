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
