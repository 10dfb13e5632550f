"""serving.server.unloads: a version is counted unloaded once a generation that no longer
serves it is all ready and alone, not when a reload's settings leave it out."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from serving.server.board import Board
from serving.server.unloads import Unloads
from tests.conftest import sleeping_processes

pytestmark = pytest.mark.unit


@pytest.fixture
def pids() -> Iterator[list[int]]:
    yield from sleeping_processes(4)


def _counter() -> Counter:
    return Counter("serving_model_unloads", "test", ["model", "version"],
                   registry=CollectorRegistry())  # fmt: skip


def _count(counter: Counter, model: str, version: str) -> float:
    return counter.labels(model, version)._value.get()


def _write(board: Board, pid: int, state: str, generation: int) -> None:
    board.generation = generation
    board.write(pid, state)  # type: ignore[arg-type]


def test_unloads_counts_a_version_once_its_successor_serves_alone(
    tmp_path: Path, pids: list[int]
) -> None:
    board, counter = Board(tmp_path), _counter()
    unloads = Unloads(board, counter)
    unloads.note(0, {("churn", "1"), ("cancer", "1")})
    _write(board, pids[0], "loading", 0)  # no look while the first boot serves alone
    unloads.note(1, {("churn", "2"), ("cancer", "1")})  # a reload
    _write(board, pids[1], "loading", 1)  # the new generation, not ready yet
    assert unloads.look(1) == set()
    _write(board, pids[1], "ready", 1)  # ready, but the old worker still serves
    assert unloads.look(1) == set()
    _write(board, pids[0], "stopping", 0)  # it takes no new request: finishing its own
    assert unloads.look(1) == {("churn", "1")}
    assert unloads.look(1) == set()  # once
    assert _count(counter, "churn", "1") == 1 and _count(counter, "cancer", "1") == 0


def test_unloads_a_change_undone_or_left_out_counts_nothing(
    tmp_path: Path, pids: list[int]
) -> None:
    """Found by the attack: a version that never served (a failed explicit load, a
    quarantined version) was counted, and so was the one serving throughout."""
    board, counter = Board(tmp_path), _counter()
    unloads = Unloads(board, counter)
    unloads.note(0, {("b", "1")})
    _write(board, pids[0], "ready", 0)
    assert unloads.look(0) == set()
    unloads.note(1, {("b", "2")})
    _write(board, pids[1], "failed", 1)  # b/2 cannot load: generation 1 never serves
    assert unloads.look(1) == set()
    board.remove(pids[1])
    unloads.note(2, {("b", "1")})
    _write(board, pids[2], "ready", 2)  # the change undone: b/1 again
    board.remove(pids[0])
    assert unloads.look(2) == set()
    assert _count(counter, "b", "1") == _count(counter, "b", "2") == 0


def test_unloads_a_generation_alone_only_between_two_looks_is_counted_at_the_next_reload(
    tmp_path: Path, pids: list[int]
) -> None:
    board, counter = Board(tmp_path), _counter()
    unloads = Unloads(board, counter)
    unloads.note(0, {("a", "1"), ("b", "1")})
    _write(board, pids[0], "ready", 0)
    unloads.note(1, {("a", "1")})  # unload b
    board.remove(pids[0])
    _write(board, pids[1], "ready", 1)  # alone at once, and no look before the next call
    unloads.note(2, {("a", "1"), ("b", "1")})  # load b again
    assert _count(counter, "b", "1") == 1
