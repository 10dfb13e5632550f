"""serving.server.control: when a load or unload call is over, read from the board the
master and the workers write (real processes standing for workers: the board skips dead
pids)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from serving.model_settings import ModelSpec
from serving.repository import Loaded
from serving.server import applied, control
from serving.server.board import Board
from serving.settings import DEMO_MODEL_PATH
from tests.conftest import sleeping_processes


@pytest.fixture
def workers() -> Iterator[list[int]]:
    yield from sleeping_processes(3)


def board_of(tmp_path: Path) -> Board:
    board = Board(tmp_path)
    control.begin(board, [spec("cancer", "2"), spec("cancer", "1"), spec("churn", "1")])
    return board


def spec(name: str, version: str) -> ModelSpec:
    return ModelSpec(name=name, version=version, path=DEMO_MODEL_PATH)


def test_control_outcome_waits_until_every_worker_staying_is_of_the_new_generation(
    tmp_path: Path, workers: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(applied, "OLD_WAIT_S", 0.3)
    old, new, newer = workers
    board = board_of(tmp_path)
    board.generation = 0
    board.write(old, "ready")
    board.generation = 1
    board.write(new, "ready")
    applied.note_applied(board, 0, 1, None)

    with pytest.raises(TimeoutError):  # the old worker still serves
        applied.outcome(board, 0, deadline_s=0.2)
    with pytest.raises(TimeoutError):  # a change not applied yet
        applied.outcome(board, 1, deadline_s=0.2)
    board.generation = None
    board.write(old, "stopping")  # the master stops it: on its way out
    board.generation = 2
    board.write(newer, "warming")
    applied.note_applied(board, 1, 2, None)
    with pytest.raises(TimeoutError):  # the newer generation still loads
        applied.outcome(board, 1, deadline_s=0.2)
    board.write(newer, "ready")
    with pytest.raises(TimeoutError):  # the generation-1 worker still serves
        applied.outcome(board, 1, deadline_s=0.2)
    board.generation = None
    board.write(new, "stopping")

    started = time.monotonic()
    assert applied.outcome(board, 1, deadline_s=5) is None  # the old ones left to go
    assert time.monotonic() - started >= 0.3  # waited for them, a while
    assert applied.outcome(board, 0, deadline_s=5) is None  # a later reload applied it too


def test_control_outcome_does_not_wait_for_an_old_worker_waiting_on_a_call(
    tmp_path: Path, workers: list[int]
) -> None:
    """Found by the attack's concurrent calls, by reading: two old workers each waiting
    on a call would each wait for the other to exit."""
    old, new, _ = workers
    board = board_of(tmp_path)
    board.generation = 0
    board.write(old, "ready")
    board.generation = 1
    board.write(new, "ready")
    board.generation = None
    board.write(old, "stopping")
    applied.note_applied(board, 1, 1, None)
    (tmp_path / f"waiting.{old}").touch()  # as control.outcome marks the worker waiting

    started = time.monotonic()
    assert applied.outcome(board, 1, deadline_s=5) is None
    assert time.monotonic() - started < applied.OLD_WAIT_S


def test_control_outcome_answers_a_new_workers_load_error_or_a_refused_reload(
    tmp_path: Path, workers: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new, _ = workers
    board = board_of(tmp_path)
    board.generation = 0
    board.write(old, "ready")
    board.generation = 1
    error = "cannot load model broken/1/m.joblib: EOF"
    board.write(new, "failed", error, model=("broken", "1"))
    applied.note_applied(board, 3, 1, None)

    assert applied.outcome(board, 3, 1, "broken") == applied.Failed(f"worker {new}: {error}")
    with pytest.raises(TimeoutError):  # another call's failure: its own to undo
        applied.outcome(board, 3, deadline_s=0.3, name="churn")
    monkeypatch.setattr(applied, "OTHER_WAIT_S", 0.2)  # nobody undid it: ours too
    assert applied.outcome(board, 3, 5, "churn") == applied.Failed(
        f"worker {new}: {error}", other=True
    )
    applied.note_applied(board, 4, 2, "invalid setting SERVING_MODEL_REPOSITORY: ...")
    assert applied.outcome(board, 4, deadline_s=1) == applied.Failed(
        "invalid setting SERVING_MODEL_REPOSITORY: ..."
    )


def test_control_outcome_answers_a_new_worker_that_died_while_loading(
    tmp_path: Path, workers: list[int]
) -> None:
    """Found by the attack: an explicit load of a version whose load aborts the process
    answered 504 after 55 s (the dead workers left no failed state), and was not undone."""
    old, new, _ = workers
    board = board_of(tmp_path)
    board.generation = 0
    board.write(old, "ready")
    board.generation = 1
    board.write(new, "warming", model=("broken", "2"))
    board.generation = None  # the master notes the death, from the worker's own file
    board.note_death(new, ("broken", "2"))
    board.remove(new)
    applied.note_applied(board, 3, 1, None)

    failed = applied.outcome(board, 3, 5, "broken")
    assert failed is not None and not failed.other
    assert failed.why.startswith(f"worker {new} died while loading broken/2")
    assert [tuple(d) for d in board.deaths()] == [(new, 1, "broken", "2")]


def test_control_begin_wants_the_versions_served_at_start_and_counts_no_change(
    tmp_path: Path,
) -> None:
    board = board_of(tmp_path)

    assert control.wanted(board) == control.Wanted(
        {"cancer": Loaded(None, ("2", "1")), "churn": Loaded(None, ("1",))}, 0
    )
    assert control.changes(board) == 0
    assert control.wanted(Board(tmp_path / "elsewhere")) is None


def test_quarantine_leaves_out_a_new_version_a_worker_could_not_load_until_it_changes(
    tmp_path: Path, workers: list[int]
) -> None:
    """Issue 32 item 3: a version a reload brought that a worker of that reload could not
    load is left out (one reload asked for), until its files change."""
    from serving.server.repository import Quarantine

    root = tmp_path / "models"
    (root / "churn" / "2").mkdir(parents=True)
    (root / "churn" / "2" / "m.joblib").write_bytes(b"cut short")
    board = Board(tmp_path / "board")
    (tmp_path / "board").mkdir()
    reloads: list[int] = []
    lines: list[str] = []
    at_start = {("churn", "1"), ("cancer", "1")}
    quarantine = Quarantine(root, board, lambda: reloads.append(1), lines.append, at_start)
    old, new, _ = workers
    board.generation = 0
    board.write(old, "ready")
    board.generation = 1
    board.write(new, "failed", "cannot load model churn/2/m.joblib: EOF", model=("churn", "2"))
    served = {("churn", "2"), ("cancer", "1")}

    assert quarantine.look(1, served) is True
    assert quarantine.look(1, served) is False  # once
    assert reloads == [1]
    assert quarantine.excluded() == {
        ("churn", "2"): "a worker could not load it: cannot load model churn/2/m.joblib: EOF"
    }
    assert lines == [
        "model repository: churn/2 left out until its files change: a worker could not "
        "load it: cannot load model churn/2/m.joblib: EOF"
    ]
    (root / "churn" / "2" / "m.joblib").write_bytes(b"a whole file now")
    assert quarantine.excluded() == {}  # tried again


def test_quarantine_a_file_completed_after_its_workers_failed_is_tried_again(
    tmp_path: Path, workers: list[int]
) -> None:
    """Found by the attack: a version whose file was completed between the workers'
    failure and the quarantine's look was recorded as it was then, so the completed file
    stayed left out until it changed again."""
    from serving.server.repository import Quarantine

    root = tmp_path / "models"
    (root / "churn" / "2").mkdir(parents=True)
    (root / "churn" / "2" / "m.joblib").write_bytes(b"cut short")
    (tmp_path / "board").mkdir()
    board = Board(tmp_path / "board")
    quarantine = Quarantine(root, board, lambda: None, lambda line: None, {("churn", "1")})
    served = {("churn", "2")}
    quarantine.loading(served)  # the reload that brings churn/2: its files as read
    old, new, _ = workers
    board.generation = 0
    board.write(old, "ready")
    board.generation = 1
    board.write(new, "failed", "cannot load model churn/2/m.joblib: EOF", model=("churn", "2"))
    (root / "churn" / "2" / "m.joblib").write_bytes(b"the whole file, before the look")

    assert quarantine.look(1, served) is True
    assert quarantine.excluded() == {}  # its files changed since they were read: tried again


def test_quarantine_never_leaves_out_a_version_that_served_before(
    tmp_path: Path, workers: list[int]
) -> None:
    """A version the last all-ready generation served that fails in a new worker (short of
    memory) is not left out: a glitch unloads nothing, the old workers serve on."""
    from serving.server.repository import Quarantine

    board = Board(tmp_path)
    quarantine = Quarantine(tmp_path, board, lambda: None, lambda line: None, {("churn", "1")})
    old, new, _ = workers
    board.generation = 2
    board.write(new, "failed", "MemoryError", model=("churn", "1"))
    board.write(old, "ready")

    assert quarantine.look(2, {("churn", "1")}) is False
    assert quarantine.excluded() == {}


def test_quarantine_leaves_out_a_version_that_served_once_its_files_changed(
    tmp_path: Path, workers: list[int]
) -> None:
    """Found by the new-user trial: clf/2 served, was removed, then published again with
    a truncated file under the same number: never left out (it had served), and the
    new workers of a rollover retried it for good beside the old ones."""
    from serving.server.repository import Quarantine

    root = tmp_path / "models"
    (root / "clf" / "2").mkdir(parents=True)
    (root / "clf" / "2" / "m.onnx").write_bytes(b"a whole graph")
    board = Board(tmp_path / "board")
    (tmp_path / "board").mkdir()
    lines: list[str] = []
    quarantine = Quarantine(root, board, lambda: None, lines.append, {("clf", "2")})
    first, second, _ = workers
    board.generation = 1
    board.write(first, "ready")
    quarantine.loading({("clf", "2")})
    board.write(second, "failed", "MemoryError", model=("clf", "2"))  # served: kept
    assert quarantine.look(1, {("clf", "2")}) is False
    (root / "clf" / "2" / "m.onnx").write_bytes(b"cut")  # republished, broken
    assert quarantine.excluded() == {}  # the reload that reads it
    quarantine.loading({("clf", "2")})
    board.generation = 2
    board.write(first, "ready", "cannot load model clf/2/m.onnx: cut", model=("clf", "2"))

    assert quarantine.look(2, {("clf", "2")}) is True
    assert set(quarantine.excluded()) == {("clf", "2")}
    assert lines[0] == (
        "model repository: clf/2 not left out: it served before, with the same files; the "
        "old workers serve on (a worker could not load it: MemoryError)"
    )


def test_quarantine_never_leaves_out_a_version_served_generations_ago_nor_a_models_last(
    tmp_path: Path, workers: list[int]
) -> None:
    """Found by the second attack: f/1 served, then f/2; rolled back onto f/1, a glitch
    failed its load, f/1 was left out and model f was gone for good (the proven set was
    only the last all-ready generation's; and nothing kept a model's last version)."""
    from serving.server.repository import Quarantine

    board = Board(tmp_path)
    lines: list[str] = []
    keeps = {("g", "2"): False}  # leaving g/2 out would leave g no version
    quarantine = Quarantine(
        tmp_path, board, lambda: None, lines.append, {("f", "1")},
        keeps_model=lambda key, excluded: keeps.get(key, True),
    )  # fmt: skip
    first, second, third = workers
    board.generation = 1
    board.write(first, "ready")
    quarantine.look(1, {("f", "2")})  # f/2 served by an all-ready generation
    board.generation = 2
    board.write(second, "failed", "MemoryError", model=("f", "1"))  # rolled back onto f/1
    board.write(third, "failed", "EOF", model=("g", "2"))

    assert quarantine.look(2, {("f", "1"), ("g", "2")}) is False
    assert quarantine.excluded() == {}
    assert sorted(lines) == [  # one line each, in the order the workers are read
        "model repository: f/1 not left out: it served before, with the same files; the "
        "old workers serve on (a worker could not load it: MemoryError)",
        "model repository: g/2 not left out: it is the last version of its model; the old "
        "workers serve on (a worker could not load it: EOF)",
    ]


def test_quarantine_leaves_out_a_new_version_a_worker_died_loading(tmp_path: Path) -> None:
    """Found by the second attack: a version whose load crashed its workers (SIGSEGV in
    native code) left no error on the board, so 606 workers were forked in 30 s."""
    from serving.server.repository import Quarantine

    root = tmp_path / "models"
    (root / "a" / "2").mkdir(parents=True)
    board = Board(tmp_path / "board")
    (tmp_path / "board").mkdir()
    reloads: list[int] = []
    quarantine = Quarantine(root, board, lambda: reloads.append(1), lambda line: None, set())
    board.write(12345, "warming", stage="model 'a': loading", model=("a", "2"))
    assert board.loading(12345) == ("a", "2")  # read from a dead worker's file

    quarantine.died(12345, ("a", "2"), generation=3)
    quarantine.died(12346, ("a", "2"), generation=2)  # an older generation's: not counted

    assert quarantine.look(3, {("a", "2")}) is True
    assert reloads == [1]
    assert quarantine.excluded() == {("a", "2"): "worker 12345 died while loading it"}
