"""serving.server.in_place and worker_change: which repository changes the running
workers take in place, the plan they follow, and a worker applying it to its real
models (the demo joblib and ONNX files) while the board says where it is."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from serving import cache as cache_module
from serving.cache import ModelCache
from serving.context import Call
from serving.dataplane import DataPlane
from serving.inputs.instances import Frame
from serving.observe.metrics import ServingMetrics
from serving.server import applied, in_place, worker_change
from serving.server.board import Board
from serving.server.repository import Quarantine
from serving.server.unloads import Unloads
from serving.settings import DEMO_MODEL_PATH, Settings
from tests.conftest import sleeping_processes
from tests.waiting import until

DEMO_ONNX = DEMO_MODEL_PATH.with_suffix(".onnx")


@pytest.fixture
def workers() -> Iterator[list[int]]:
    yield from sleeping_processes(2)


def version(root: Path, model: str, number: str, source: Path = DEMO_ONNX) -> Path:
    (root / model / number).mkdir(parents=True)
    return Path(shutil.copy(source, root / model / number / source.name))


def repository(tmp_path: Path) -> Path:
    """onnx/1 (the demo ONNX model) and shared/1 (the demo joblib model)."""
    root = tmp_path / "models"
    version(root, "onnx", "1")
    version(root, "shared", "1", DEMO_MODEL_PATH)
    return root


def rolled(old: Settings, new: Settings, read: in_place.Identities | None = None) -> str | None:
    models = old.model_settings()
    read = in_place.identities(models) if read is None else read
    return in_place.why_rolled(old, new, models, new.model_settings(), read)


def test_why_rolled_a_change_of_per_worker_models_only_is_taken_in_place(tmp_path: Path) -> None:
    root = repository(tmp_path)
    old = Settings(model_repository=root)
    version(root, "onnx", "2")  # replaces onnx/1 (the latest version serves)
    assert rolled(old, Settings(model_repository=root)) is None
    version(root, "other", "1")  # a model added
    assert rolled(old, Settings(model_repository=root)) is None
    shutil.rmtree(root / "onnx")  # a model removed
    assert rolled(old, Settings(model_repository=root)) is None
    assert rolled(old, Settings(model_repository=root, max_batch_size=8)) == (
        "a server setting changed"
    )


def test_why_rolled_names_the_shared_versions_a_change_adds_or_drops(tmp_path: Path) -> None:
    root = repository(tmp_path)
    old = Settings(model_repository=root)
    version(root, "shared", "2", DEMO_MODEL_PATH)
    assert rolled(old, Settings(model_repository=root)) == (
        "loads shared/2, drops shared/1: loaded once in the master and shared"
    )
    # Each version named once (the new-user trial read "credit/2, credit/1, credit/2,
    # credit/1"): a version whose settings changed is reloaded.
    (root / "shared" / "config.json").write_text('{"version_policy": {"all": {}}}')
    both = Settings(model_repository=root)
    (root / "shared" / "config.json").write_text(
        '{"version_policy": {"all": {}}, "max_batch_size": 4}'
    )
    assert rolled(both, Settings(model_repository=root)) == (
        "reloads shared/2, shared/1: loaded once in the master and shared"
    )
    off = Settings(model_repository=root, share_model="off")  # nothing shared: in place
    assert rolled(off, Settings(model_repository=root, share_model="off")) is None
    # The model's own config.json: "share": "off" (one copy per worker) is taken in place.
    (root / "shared" / "config.json").write_text('{"share": "off"}')
    own = Settings(model_repository=root)
    assert [m.share for m in own.model_settings()] == ["auto", "off"]  # onnx, shared
    version(root, "shared", "3", DEMO_MODEL_PATH)
    assert rolled(own, Settings(model_repository=root)) is None


def test_why_rolled_a_label_moved_is_no_change_of_a_model(tmp_path: Path) -> None:
    root = repository(tmp_path)
    version(root, "shared", "2", DEMO_MODEL_PATH)
    policy = {"version_policy": {"all": {}}}
    (root / "shared" / "config.json").write_text(json.dumps(policy | {"labels": {"stable": 1}}))
    old = Settings(model_repository=root)
    (root / "shared" / "config.json").write_text(json.dumps(policy | {"labels": {"stable": 2}}))

    assert rolled(old, Settings(model_repository=root)) is None


def test_why_rolled_a_file_replaced_under_the_same_settings_is_a_change(tmp_path: Path) -> None:
    root = repository(tmp_path)
    old = Settings(model_repository=root)
    read = in_place.identities(old.model_settings())
    file = root / "shared" / "1" / DEMO_MODEL_PATH.name
    shutil.copy(DEMO_MODEL_PATH, file.with_name("new"))
    os.replace(file.with_name("new"), file)  # another inode, the same settings

    assert rolled(old, Settings(model_repository=root), read) == (
        "reloads shared/1: loaded once in the master and shared"
    )
    assert rolled(Settings(model_path=DEMO_MODEL_PATH), Settings(model_path=DEMO_MODEL_PATH)) == (
        "no model repository"
    )


def test_plan_published_is_read_whole_and_only_when_newer(tmp_path: Path) -> None:
    root = repository(tmp_path)
    (root / "bad name").mkdir()
    board = Board(tmp_path)
    assert in_place.read_plan(board, -1) is None  # none yet
    settings = Settings(model_repository=root)
    in_place.publish(board, in_place.Plan(3, settings, settings.model_settings()))

    plan = in_place.read_plan(board, 2)
    assert plan is not None and plan.generation == 3
    assert plan.models == settings.model_settings()
    assert [r.model for r in plan.settings.refused_models()] == ["bad name"]
    assert in_place.read_plan(board, 3) is None  # followed already
    in_place.plan_path(board).write_bytes(b"\x80\x05cut")
    assert in_place.read_plan(board, 2) is None


def test_board_a_worker_changing_in_place_names_its_version_and_a_failure_shows(
    tmp_path: Path, workers: list[int]
) -> None:
    changing, failed = workers
    board = Board(tmp_path)
    board.generation = 4
    board.write(changing, "ready", None, "model 'onnx': warming up", model=("onnx", "2"))
    board.write(failed, "ready", "cannot load model onnx/2/m.onnx: cut", model=("onnx", "2"))

    fleet = board.read()
    assert board.loading(changing) == ("onnx", "2")  # a crash now is named
    assert board.loading(failed) is None
    assert (fleet.failed(changing), fleet.failed(failed)) == (False, True)
    assert not fleet.alone(4)
    assert fleet.ready  # both serve what they served
    summary = fleet.summary()
    assert summary["rollout"] == "failed"
    assert summary["errors"] == [{"pid": failed, "error": "cannot load model onnx/2/m.onnx: cut"}]
    board.write(changing, "ready")
    board.write(failed, "ready")
    assert board.read().alone(4)


def test_applied_outcome_waits_for_workers_changing_in_place_and_answers_their_failure(
    tmp_path: Path, workers: list[int]
) -> None:
    first, second = workers
    board = Board(tmp_path)
    board.generation = 2
    board.write(first, "ready")
    board.write(second, "ready", None, "model 'onnx': loading", model=("onnx", "2"))
    applied.note_applied(board, 1, 2, None)

    with pytest.raises(TimeoutError):  # the second still loads beside what it serves
        applied.outcome(board, 1, deadline_s=0.3, name="onnx")
    board.write(second, "ready", "the load raised SystemExit(4)", model=("onnx", "2"))
    assert applied.outcome(board, 1, 1, "onnx") == applied.Failed(
        f"worker {second}: the load raised SystemExit(4)"
    )
    board.write(second, "ready")
    assert applied.outcome(board, 1, 1, "onnx") is None


def test_quarantine_and_unloads_a_version_a_worker_could_not_take_in_place(
    tmp_path: Path, workers: list[int]
) -> None:
    root = repository(tmp_path)
    version(root, "onnx", "2").write_bytes(b"cut short")
    board = Board(tmp_path / "board")
    (tmp_path / "board").mkdir()
    reloads: list[int] = []
    quarantine = Quarantine(root, board, lambda: reloads.append(1), lambda line: None,
                            {("onnx", "1")})  # fmt: skip
    unloads = Unloads(board)
    unloads.note(0, {("onnx", "1")})
    unloads.note(1, {("onnx", "2")})
    board.generation = 1
    for pid in workers:
        board.write(pid, "ready", "cannot load model onnx/2/onnx.onnx: cut", model=("onnx", "2"))

    assert quarantine.look(1, {("onnx", "2")}) is True  # left out: a reload asked for
    assert reloads == [1]
    assert unloads.look(1) == set()  # onnx/1 serves on: not unloaded


@pytest.fixture
def metrics(monkeypatch: pytest.MonkeyPatch) -> ServingMetrics:
    """This process's metrics for the test (a worker's ``default_metrics``)."""
    made = ServingMetrics(CollectorRegistry())
    monkeypatch.setattr("serving.observe.metrics.default_metrics", lambda: made)
    return made


@pytest.fixture
def installed() -> Iterator[None]:
    yield
    cache = cache_module.installed_cache()
    if cache is not None:
        cache.retire()
        cache.stop(timeout_s=5)
    cache_module.install_cache(None)  # type: ignore[arg-type]


class Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def info(self, text: str, *args: object) -> None:
        self.lines.append(text % args)

    error = info


def served(root: Path, metrics: ServingMetrics) -> ModelCache:
    """The models ``root`` serves, loaded and installed as this process's."""
    cache = ModelCache.of(Settings(model_repository=root).model_settings(), metrics)
    cache.start_loading().join(60)
    cache_module.install_cache(cache)
    return cache


@pytest.mark.usefixtures("installed")
def test_worker_change_keeps_what_did_not_change_loads_the_new_and_drops_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, metrics: ServingMetrics
) -> None:
    monkeypatch.setattr(worker_change, "DROP_AFTER_S", 0.0)
    root = repository(tmp_path)
    board = Board(tmp_path)
    cache = served(root, metrics)
    kept = cache.resolve("shared", "1")
    version(root, "onnx", "2")
    version(root, "added", "1")
    after = Settings(model_repository=root)
    problems: list[str] = []

    log = Log()
    assert worker_change.apply(
        in_place.Plan(1, after, after.model_settings()), board, slot=0,
        on_problem=problems.append, log=log,
    )  # fmt: skip

    now = cache_module.installed_cache()
    assert now is not None and now is not cache
    assert now.resolve("shared", "1") is kept  # not loaded again
    assert [(r.model_name, r.model_version, r.state) for r in now.runtimes] == [
        ("added", "1", "ready"), ("onnx", "2", "ready"), ("shared", "1", "ready")
    ]  # fmt: skip
    dropped = cache.resolve("onnx", "1")
    deadline = time.monotonic() + 10
    while dropped.state != "stopping" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert dropped.state == "stopping"
    assert board.generation == 1
    assert board.read().states == {os.getpid(): "ready"} and board.read().errors == {}
    assert "loading added/1, onnx/2, dropping onnx/1; 1 other version(s) serve on" in log.lines[0]
    assert problems == []


@pytest.mark.usefixtures("installed")
def test_worker_change_a_dropped_version_is_freed_without_a_full_collection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, metrics: ServingMetrics
) -> None:
    """Each change ran a full ``gc.collect()`` in every serving worker: 78 ms holding the
    GIL in a worker with pandas, scikit-learn and ONNX Runtime imported, every request
    waiting (the p99 of back-to-back changes in place). A dropped version is freed by its
    references alone: its batcher was in a reference cycle (with its predict calls), which
    held the ONNX session until a full collection, and the data plane's rules held each
    version's handle for good (the attack: a worker grew 150 MB per version published)."""
    monkeypatch.setattr(worker_change, "DROP_AFTER_S", 0.0)
    root = repository(tmp_path)
    served(root, metrics)
    board = Board(tmp_path)

    def change(generation: int, number: str) -> None:
        version(root, "onnx", number)
        after = Settings(model_repository=root)
        plan = in_place.Plan(generation, after, after.model_settings())
        assert worker_change.apply(plan, board, slot=0, on_problem=lambda _: None, log=Log())

    change(1, "2")  # onnx/2, loaded in place as a worker does
    runtime = cache_module.installed_cache().resolve("onnx", "2")  # type: ignore[union-attr]
    handle, batcher = runtime.require_ready()
    plane = DataPlane(Settings(model_repository=root), metrics, cache_module.installed_cache)  # type: ignore[arg-type]
    rows = Frame(np.zeros((1, handle.n_features or 0)).tolist())
    plane.infer(Call.start("r", timeout_s=30), "onnx", "2", rows)  # through the rules
    dropped = [weakref.ref(handle), weakref.ref(batcher), weakref.ref(runtime)]
    del runtime, handle, batcher
    gc.collect()
    generations: list[int] = []

    def collecting(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            generations.append(info["generation"])

    gc.freeze()  # a worker that served a while: what it holds is past the young collections
    gc.disable()  # only the collections the change asks for
    gc.callbacks.append(collecting)
    try:
        change(2, "3")  # drops onnx/2
        freed = [False]
        with contextlib.suppress(AssertionError):  # not within the time: said below
            freed[0] = until(lambda: all(ref() is None for ref in dropped), 10)
        alive = [ref() is not None for ref in dropped]
    finally:
        gc.callbacks.remove(collecting)
        gc.enable()
        gc.unfreeze()
    assert freed == [True], alive  # handle, batcher, runtime
    assert generations and 2 not in generations, generations


@pytest.mark.usefixtures("installed")
def test_worker_change_a_version_that_fails_leaves_what_served_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, metrics: ServingMetrics
) -> None:
    root = repository(tmp_path)
    board = Board(tmp_path)
    cache = served(root, metrics)
    version(root, "onnx", "2").write_bytes(b"cut short")
    after = Settings(model_repository=root)
    log = Log()

    assert not worker_change.apply(
        in_place.Plan(1, after, after.model_settings()), board, slot=0,
        on_problem=lambda reason: None, log=log,
    )  # fmt: skip

    assert cache_module.installed_cache() is cache
    assert [(r.model_name, r.model_version, r.state) for r in cache.runtimes] == [
        ("onnx", "1", "ready"), ("shared", "1", "ready")
    ]  # fmt: skip
    fleet = board.read()
    me = os.getpid()
    assert fleet.states[me] == "ready" and fleet.generations[me] == 1 and fleet.failed(me)
    assert fleet.failed_models[me] == ("onnx", "2")
    assert "onnx/2" in fleet.errors[me] and "onnx/2 could not be loaded" in log.lines[-1]
    assert metrics.load_failures.labels("onnx", "2")._value.get() == 1


def test_why_unsettled_a_rollover_not_over_is_left_to_the_rollover(
    tmp_path: Path, workers: list[int]
) -> None:
    old, new = workers
    board = Board(tmp_path)
    board.generation = 1
    board.write(old, "ready")
    board.generation = 2
    board.write(new, "failed", "cannot load model churn/1/m.joblib: SHA-256 ...")

    assert in_place.why_unsettled(board.read(), [old, new], 2) == (
        f"worker {old} is ready, of generation 1"
    )
    assert (
        in_place.why_unsettled(board.read(), [new], 2) == f"worker {new} is failed, of generation 2"
    )
    assert in_place.why_unsettled(board.read(), [new, 99], 2) is not None  # forked, no file yet
    board.write(new, "ready", "cannot load model churn/2: cut")  # in place, failed: serves
    board.generation = None
    board.write(old, "stopping")
    assert in_place.why_unsettled(board.read(), [old, new], 2) is None


@pytest.mark.usefixtures("installed")
def test_worker_change_follow_says_what_a_change_raised_and_takes_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_change, "LOOK_S", 0.02)
    root = repository(tmp_path)
    served(root, ServingMetrics(CollectorRegistry()))
    board = Board(tmp_path)
    board.generation = 0
    settings = Settings(model_repository=root)
    taken: list[int] = []
    said: list[str] = []

    def change(plan: in_place.Plan) -> None:
        taken.append(plan.generation)
        board.generation = plan.generation
        if plan.generation == 1:
            raise OSError("disk full")

    thread = worker_change.follow(board, change, said.append)
    for generation in (1, 2):
        in_place.publish(board, in_place.Plan(generation, settings, settings.model_settings()))
        deadline = time.monotonic() + 10
        while generation not in taken and time.monotonic() < deadline:
            time.sleep(0.02)

    assert taken == [1, 2] and thread.is_alive()
    assert said == [f"worker {os.getpid()}: generation 1 not taken: OSError('disk full')"]


@pytest.mark.usefixtures("installed")
def test_worker_change_a_label_moved_keeps_every_runtime_and_answers_the_new_label(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, metrics: ServingMetrics
) -> None:
    root = repository(tmp_path)
    version(root, "shared", "2", DEMO_MODEL_PATH)
    policy = {"version_policy": {"all": {}}}
    (root / "shared" / "config.json").write_text(json.dumps(policy | {"labels": {"stable": 1}}))
    cache = served(root, metrics)
    (root / "shared" / "config.json").write_text(json.dumps(policy | {"labels": {"stable": 2}}))
    after = Settings(model_repository=root)

    assert worker_change.apply(
        in_place.Plan(1, after, after.model_settings()), Board(tmp_path), slot=0,
        on_problem=lambda reason: None, log=Log(),
    )  # fmt: skip

    now = cache_module.installed_cache()
    assert now is not None and now.runtimes == cache.runtimes  # the same objects
    assert now.version_labels("shared") == {"stable": "2"}


def test_asks_each_reload_asked_for_is_taken_once_and_an_old_ask_expires(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found by the attack: two asks before the master took the first (two load calls
    at once; the poller and the quarantine) left the second reload unmarked, and it
    rolled every worker over."""
    now = [100.0]
    monkeypatch.setattr(in_place.time, "monotonic", lambda: now[0])
    asks = in_place.Asks()
    asks.add(2)  # two calls, or the poller and the quarantine, before one reload

    assert asks.take() and asks.take()
    assert not asks.take()  # a SIGHUP sent by hand
    asks.add()
    now[0] += in_place.ASK_EXPIRES_S + 1  # its SIGHUP merged with another: not taken
    assert not asks.take()


@pytest.mark.usefixtures("installed")
def test_worker_change_a_served_version_whose_file_went_since_the_plan_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, metrics: ServingMetrics
) -> None:
    """Found by the attack: a version removed just after the master read the repository
    was loaded again from its file, gone, and the whole plan failed."""
    root = repository(tmp_path)
    cache = served(root, metrics)
    version(root, "added", "1")
    after = Settings(model_repository=root)
    plan = in_place.Plan(1, after, after.model_settings())
    shutil.rmtree(root / "onnx")  # gone before this worker's turn: the next poll drops it

    assert worker_change.apply(
        plan, Board(tmp_path), slot=0, on_problem=lambda reason: None, log=Log()
    )  # fmt: skip
    now = cache_module.installed_cache()
    assert now is not None and now.resolve("onnx", "1") is cache.resolve("onnx", "1")


@pytest.mark.usefixtures("installed")
def test_worker_change_follow_a_worker_stopped_by_a_rollover_takes_no_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, metrics: ServingMetrics
) -> None:
    """Found by the lowest-versions run: an old worker a rollover was stopping took the
    next change in place, loading the shared models it had never had, itself."""
    monkeypatch.setattr(worker_change, "LOOK_S", 0.02)
    root = repository(tmp_path)
    served(root, metrics)
    board = Board(tmp_path)
    board.generation = 0
    board.write(os.getpid(), "stopping")
    settings = Settings(model_repository=root)
    taken: list[int] = []

    worker_change.follow(board, lambda plan: taken.append(plan.generation), lambda line: None)
    in_place.publish(board, in_place.Plan(1, settings, settings.model_settings()))
    time.sleep(0.3)

    assert taken == []


@pytest.mark.usefixtures("installed")
def test_worker_change_labels_stay_with_the_versions_serving_until_the_new_set_serves(
    tmp_path: Path, metrics: ServingMetrics
) -> None:
    """Found by the second attack: a new version published took its model's labels (the
    repository gives them with the newest) off the versions still serving while it
    loaded: /labels/stable answered 404; and for good when it failed."""
    root = repository(tmp_path)
    version(root, "onnx", "2")
    labels = {"version_policy": {"all": {}}, "labels": {"stable": 1, "canary": 2}}
    (root / "onnx" / "config.json").write_text(json.dumps(labels))
    cache = served(root, metrics)
    version(root, "onnx", "3").write_bytes(b"cut short")
    after = Settings(model_repository=root)

    assert not worker_change.apply(
        in_place.Plan(1, after, after.model_settings()), Board(tmp_path), slot=0,
        on_problem=lambda reason: None, log=Log(),
    )  # fmt: skip

    assert cache_module.installed_cache() is cache
    assert cache.version_labels("onnx") == {"stable": "1", "canary": "2"}


def test_worker_change_a_process_the_load_forks_does_not_hold_the_turn(tmp_path: Path) -> None:
    """Found by the second attack: a model whose load started a multiprocessing pool
    kept the change lock through the pool's process, and no worker took a change again."""
    import subprocess
    import sys

    board = Board(tmp_path)
    with worker_change._Turn(board):
        child = os.fork()
        if child == 0:  # pragma: no cover (the forked process: it sleeps, holding nothing)
            time.sleep(10)
            os._exit(0)
    try:
        probe = subprocess.run(
            [sys.executable, "-c", (
                "import signal, sys; from pathlib import Path; signal.alarm(5)\n"
                "from serving.server.board import Board\n"
                "from serving.server.worker_change import _Turn\n"
                "with _Turn(Board(Path(sys.argv[1]))): pass"
            ), str(tmp_path)],
            check=False, capture_output=True, timeout=30,
        )  # fmt: skip
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)

    assert probe.returncode == 0, probe.stderr
