"""Load once, fork many (serving/server/sharing.py): which models the master loads for every
worker, and what a worker does with the model it inherits."""

from __future__ import annotations

import gc
import json
import logging
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from sklearn.ensemble import RandomForestClassifier

from serving.model_settings import ModelSettings
from serving.observe.metrics import ServingMetrics
from serving.runtime import ModelRuntime
from serving.server import sharing
from serving.settings import DEMO_MODEL_PATH, Settings
from tests.models import Ballast, RunsOnLoad, UnevenLoading

log = logging.getLogger("test")


@pytest.fixture(autouse=True)
def _forget_shared(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(sharing, "_handles", {})
    yield
    gc.unfreeze()


def _settings(settings: Settings, **update: object) -> Settings:
    return Settings(**{**settings.model_dump(), **update})


def _pickle(model: object, path: Path) -> Path:
    path.write_bytes(pickle.dumps(model))
    return path


@pytest.mark.parametrize(
    ("suffix", "shared"),
    [(".pkl", True), (".joblib", True), (".skops", True), (".onnx", False)],
)
def test_choose_shares_pickle_joblib_and_skops_not_onnx(
    settings: Settings, tmp_path: Path, suffix: str, shared: bool
) -> None:
    path = tmp_path / f"m{suffix}"
    path.write_bytes(b"")
    (choice,) = sharing.choose(_settings(settings, model_path=path))
    assert choice.shared is shared
    assert choice.why.startswith(suffix.lstrip(".").replace("pkl", "pickle"))


def test_choose_keeps_your_own_class_and_everything_under_off_per_worker(
    settings: Settings, tmp_path: Path
) -> None:
    path = _pickle(UnevenLoading(), tmp_path / "m.pkl")
    (custom,) = sharing.choose(
        _settings(settings, model_path=path, model_class="tests.models:TypedChurn")
    )
    assert not custom.shared and "your class" in custom.why
    (off,) = sharing.choose(_settings(settings, model_path=path, share_model="off"))
    assert not off.shared and off.why == "SERVING_SHARE_MODEL=off"
    # ... and a model whose own entry says "share": "off", beside one that shares
    entries = json.dumps([
        {"name": "own", "path": str(path), "share": "off"}, {"name": "one", "path": str(path)}
    ])  # fmt: skip
    own, one = sharing.choose(_settings(settings, models=entries))
    assert (own.shared, own.why, one.shared) == (False, "share: off", True)


def test_describe_names_each_model_and_why_in_one_line(settings: Settings, tmp_path: Path) -> None:
    pkl = _pickle(UnevenLoading(), tmp_path / "a.pkl")
    onnx = tmp_path / "b.onnx"
    onnx.write_bytes(b"")
    models = json.dumps(
        [{"name": "a", "version": "1", "path": str(pkl)}, {"name": "b", "path": str(onnx)}]
    )
    line = sharing.describe(sharing.choose(_settings(settings, models=models)))
    assert "\n" not in line
    assert line.startswith("model sharing: 'a' version '1' shared (pickle: loaded once")
    assert "'b' version '1' per worker (onnx: an ONNX Runtime session is built" in line


def test_the_master_loads_once_and_a_worker_warms_up_the_inherited_model_without_the_file(
    settings: Settings, tmp_path: Path, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    X, y = breast_cancer
    forest = RandomForestClassifier(n_estimators=5, random_state=0).fit(X, y)
    path = _pickle(forest, tmp_path / "forest.pkl")
    configured = _settings(settings, model_path=path)
    lines: list[str] = []

    sharing.load_in_master(configured, lambda msg, *a: lines.append(msg % a), log.error)
    assert gc.get_freeze_count() > 0
    assert "shared" in lines[0] and "loaded 1 model(s) in the master" in lines[1]

    model = configured.model_settings()[0]  # as the worker forked now takes it
    path.unlink()  # a worker that read the file now would fail
    inherited = sharing.inherited(model)
    assert inherited is not None
    runtime = ModelRuntime(model, ServingMetrics(CollectorRegistry()), inherited=inherited)
    runtime.load()
    handle, batcher = runtime.require_ready()
    try:
        # the master's forest, compiled in the worker (SERVING_COMPILE=auto)
        assert handle.estimator is inherited.estimator and handle.engine == "onnxruntime"
        answer = batcher.submit(X[:20]).outputs
        np.testing.assert_array_equal(answer["predictions"], forest.predict(X[:20]))
        np.testing.assert_allclose(answer["probabilities"], forest.predict_proba(X[:20]), atol=1e-6)
    finally:
        runtime.stop(timeout_s=5)


def test_the_master_measures_the_one_copy_its_workers_share(
    settings: Settings, tmp_path: Path
) -> None:
    path = _pickle(Ballast(n_features=3, mib=48), tmp_path / "ballast.pkl")
    configured = _settings(settings, model_path=path)
    sharing.load_in_master(configured, log.info, log.error)
    inherited = sharing.inherited(configured.model_settings()[0])
    assert inherited is not None and inherited.loaded_bytes is not None
    assert 46 * 2**20 <= inherited.loaded_bytes <= 120 * 2**20

    registry = CollectorRegistry()
    model = configured.model_settings()[0]
    runtime = ModelRuntime(model, ServingMetrics(registry), inherited=inherited)
    runtime.load()
    try:
        assert runtime.shared_memory_bytes == inherited.loaded_bytes
        assert runtime.memory_bytes is not None and runtime.memory_bytes < 24 * 2**20
        labels = {"model": model.name, "version": model.version}
        shared = registry.get_sample_value("serving_model_shared_memory_bytes", labels)
        assert shared == inherited.loaded_bytes
    finally:
        runtime.stop(timeout_s=5)


def test_inherited_is_only_for_the_same_file_name_version_and_sha256(
    settings: Settings, tmp_path: Path
) -> None:
    path = _pickle(UnevenLoading(), tmp_path / "m.pkl")
    configured = _settings(settings, model_path=path)
    sharing.load_in_master(configured, log.info, log.error)
    assert sharing.inherited(configured.model_settings()[0]) is not None
    assert sharing.inherited(_settings(configured, model_version="2").model_settings()[0]) is None
    other = _pickle(UnevenLoading(), tmp_path / "other.pkl")
    assert (
        sharing.inherited(
            _settings(configured, model_path=other, model_name="m").model_settings()[0]
        )
        is None
    )


def test_a_failed_load_in_the_master_shares_nothing_and_says_why(
    settings: Settings, tmp_path: Path
) -> None:
    path = _pickle(UnevenLoading(), tmp_path / "m.pkl")
    configured = _settings(settings, model_path=path)
    sharing.load_in_master(configured, log.info, log.error)
    assert sharing.inherited(configured.model_settings()[0]) is not None
    path.write_bytes(b"not a pickle")  # the reload's new file is broken
    errors: list[str] = []

    sharing.load_in_master(configured, log.info, lambda msg, *a: errors.append(msg % a))
    assert (
        sharing.inherited(configured.model_settings()[0]) is None
    )  # workers load for themselves (and fail)
    assert f"the master cannot load 'm' version '1': cannot load model {path}" in errors[0]


def test_a_reload_keeps_the_masters_copy_of_a_model_whose_file_did_not_change(
    settings: Settings, tmp_path: Path
) -> None:
    same = _pickle(UnevenLoading(), tmp_path / "same.pkl")
    moved = _pickle(UnevenLoading(), tmp_path / "moved.pkl")
    models = [{"name": "same", "path": str(same)}, {"name": "moved", "path": str(moved)}]
    configured = _settings(settings, models=models)
    lines: list[str] = []
    sharing.load_in_master(configured, log.info, log.error)
    first = {m.name: sharing.inherited(m) for m in configured.model_settings()}
    _pickle(UnevenLoading(), tmp_path / "new.pkl").rename(moved)  # published over it

    sharing.load_in_master(configured, lambda msg, *a: lines.append(msg % a), log.error)
    second = {m.name: sharing.inherited(m) for m in configured.model_settings()}

    assert first["same"] is not None and second["same"] is first["same"]  # not read again
    assert second["moved"] is not None and second["moved"] is not first["moved"]
    assert any("'same' version '1' unchanged" in line for line in lines), lines
    assert "loaded 1 model(s) in the master" in lines[-1], lines


def test_under_off_the_master_loads_nothing(settings: Settings, tmp_path: Path) -> None:
    tickets = tmp_path / "tickets"
    tickets.mkdir()
    path = _pickle(UnevenLoading((0.0,), str(tickets)), tmp_path / "m.pkl")
    configured = _settings(settings, model_path=path, share_model="off")
    sharing.load_in_master(configured, log.info, log.error)
    assert sharing.inherited(configured.model_settings()[0]) is None
    assert list(tickets.iterdir()) == []  # never unpickled


def test_a_model_file_gone_before_a_reload_does_not_stop_the_master(
    settings: Settings, tmp_path: Path
) -> None:
    path = _pickle(UnevenLoading(), tmp_path / "m.pkl")
    configured = _settings(settings, model_path=path)
    model = configured.model_settings()[0]
    path.unlink()  # the settings were read (a HUP), then the file vanished
    errors: list[str] = []

    sharing.load_in_master(configured, log.info, lambda msg, *a: errors.append(msg % a))
    assert sharing.inherited(model) is None
    assert errors and errors[0].startswith("model sharing: none (")


class _Segfaults:
    """Unpickling it reads address 0: the process dies of SIGSEGV."""

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        import ctypes

        return ctypes.string_at, (0,)


def test_trial_load_says_whether_a_separate_process_loads_the_models(tmp_path: Path) -> None:
    from serving.server.trial import trial_load

    good = ModelSettings(name="demo", version="1", path=DEMO_MODEL_PATH, format="joblib")
    crashing = tmp_path / "crash.pkl"
    crashing.write_bytes(pickle.dumps(_Segfaults()))
    truncated = tmp_path / "cut.joblib"
    truncated.write_bytes(DEMO_MODEL_PATH.read_bytes()[:100])

    assert trial_load([good], timeout_s=60) is None
    assert trial_load([good, good.model_copy(update={"path": crashing, "format": "pickle"})],
                      timeout_s=60) == "died of SIGSEGV"  # fmt: skip
    # an error: the master's own load fails the same way, and says so as it always has
    assert trial_load([good.model_copy(update={"path": truncated})], timeout_s=60) is None
    hangs = tmp_path / "hangs.pkl"
    (tmp_path / "tickets").mkdir()
    hangs.write_bytes(pickle.dumps(UnevenLoading((30.0,), str(tmp_path / "tickets"))))
    assert trial_load([good.model_copy(update={"path": hangs, "format": "pickle"})],
                      timeout_s=2) == "took longer than 2 s (SERVING_LOAD_TIMEOUT_S)"  # fmt: skip


def test_trial_load_tells_a_crash_while_a_handler_reaps_every_child(tmp_path: Path) -> None:
    """Gunicorn's master reaps every child in its SIGCHLD handler (``waitpid(-1)``): a
    trial whose exit status it took was read as a clean exit, and the master then loaded
    the file that crashes it."""
    import os
    import signal

    from serving.server.trial import trial_load

    crashing = tmp_path / "crash.pkl"
    crashing.write_bytes(pickle.dumps(_Segfaults()))
    model = ModelSettings(name="crash", version="1", path=crashing, format="pickle")

    def reap(_signum: int, _frame: object) -> None:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass

    previous = signal.signal(signal.SIGCHLD, reap)
    try:
        outcomes = {trial_load([model], timeout_s=60) for _ in range(3)}
    finally:
        signal.signal(signal.SIGCHLD, previous)
    assert None not in outcomes and all(o.startswith("died") for o in outcomes), outcomes


def test_trial_load_from_a_thread_tells_a_good_load(tmp_path: Path) -> None:
    """The master runs the trial on its loading thread: the forked child must still set
    its signals and load (a child that failed there would read as a death)."""
    import threading

    from serving.server.trial import trial_load

    good = ModelSettings(name="demo", version="1", path=DEMO_MODEL_PATH, format="joblib")
    outcome: list[str | None] = []
    thread = threading.Thread(target=lambda: outcome.append(trial_load([good], timeout_s=60)))
    thread.start()
    thread.join(60)
    assert outcome == [None]


def _runs(tmp_path: Path, code: str) -> ModelSettings:
    path = tmp_path / "runs.pkl"
    path.write_bytes(pickle.dumps(RunsOnLoad(code)))
    return ModelSettings(name="runs", version="1", path=path, format="pickle")


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def test_trial_load_a_child_that_forks_and_dies_is_told_at_once_and_its_fork_ended(
    tmp_path: Path,
) -> None:
    """Found by the attack: a load that forked a sleeper and then aborted read as past
    the timeout (the sleeper held the pipe), and the sleeper outlived it with the
    master's listening socket."""
    import time

    from serving.server.trial import trial_load

    pid_file = tmp_path / "grandchild"
    code = (
        "import os, time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    time.sleep(120); os._exit(0)\n"
        f"open({str(pid_file)!r}, 'w').write(str(pid))\n"
        "os.abort()\n"
    )
    started = time.monotonic()
    assert trial_load([_runs(tmp_path, code)], timeout_s=30) == "died of SIGABRT"
    assert time.monotonic() - started < 10
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(grandchild)


def test_trial_load_child_keeps_none_of_the_masters_descriptors(tmp_path: Path) -> None:
    """Found by the attack: a hung trial kept the listening socket and the metrics lock
    of a master that had exited."""
    import socket

    from serving.server.trial import trial_load

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen()
    held = tmp_path / "held"
    code = (
        "import os\n"
        "fds = os.listdir('/proc/self/fd')\n"
        "links = []\n"
        "for fd in fds:\n"
        "    try:\n"
        "        links.append(os.readlink(f'/proc/self/fd/{fd}')) if int(fd) > 2 else None\n"
        "    except OSError:\n"
        "        pass  # the listing's own, closed since\n"
        f"open({str(held)!r}, 'w').write('\\n'.join(links))\n"
    )
    try:
        assert trial_load([_runs(tmp_path, code)], timeout_s=30) is None
    finally:
        listening.close()
    links = held.read_text().splitlines()
    assert [link for link in links if link.startswith("socket:")] == [], links
    assert len(links) <= 2, links  # the pipe to the master (and the listing's own)


def test_trial_load_stop_ends_a_hanging_trial_and_its_child(tmp_path: Path) -> None:
    """Found by the attack: SIGTERM during a hung trial left the child running after the
    master exited; ``stop_trials`` (called when a stop signal ends the master's wait)
    kills it."""
    import threading
    import time

    from serving.server.trial import stop_trials, trial_load

    pid_file = tmp_path / "child"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    outcome: list[str | None] = []
    thread = threading.Thread(
        target=lambda: outcome.append(trial_load([_runs(tmp_path, code)], timeout_s=60))
    )
    thread.start()
    deadline = time.monotonic() + 20
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    stop_trials()
    thread.join(10)
    assert outcome and outcome[0] is not None and outcome[0].startswith("died"), outcome
    assert not _alive(child)


def test_a_stop_signal_during_a_trial_ends_the_trial_child(tmp_path: Path) -> None:
    """Found by the attack: SIGTERM while a trial hung ended the master's wait, and the
    master exited, but the child lived on (holding the port) until its load ended."""
    import os
    import signal
    import threading
    import time

    from serving.server.trial import trial_load

    pid_file = tmp_path / "child"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    model = _runs(tmp_path, code)
    came: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: came.append(signum))

    def terminate() -> None:
        deadline = time.monotonic() + 20
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=terminate, daemon=True).start()
    try:
        done, _, stopped_by = sharing._bounded(lambda: trial_load([model], 60), 60)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert (done, stopped_by, came) == (False, signal.SIGTERM, [signal.SIGTERM])
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child)


def test_bounded_calls_meanwhile_while_it_waits() -> None:
    """Found by the attack: a worker killed during a 30 s trial stayed a zombie, and was
    not replaced, until the trial ended (Gunicorn 27 only queues SIGCHLD): the master now
    reaps between looks."""
    import time

    calls: list[float] = []
    done, result, stopped_by = sharing._bounded(
        lambda: time.sleep(0.5) or "loaded", 10, lambda: calls.append(time.monotonic())
    )
    assert (done, result, stopped_by) == (True, "loaded", None)
    assert len(calls) >= 5


def test_trial_load_a_child_that_says_it_loaded_and_then_dies_is_a_death(tmp_path: Path) -> None:
    """Found by the second attack: a load that wrote the trial's byte itself and then
    aborted passed the trial, and the master's own load aborted the master."""
    from serving.server.trial import trial_load

    code = "import os; os.write(3, b'.'); os.abort()"
    assert trial_load([_runs(tmp_path, code)], timeout_s=30) == "died of SIGABRT"


def test_trial_load_a_child_that_closes_its_pipe_and_hangs_is_said_so(tmp_path: Path) -> None:
    """Found by the second attack: it was said to have died of SIGKILL, the master's own."""
    from serving.server.trial import trial_load

    code = "import os, time; os.close(3); time.sleep(60)"
    outcome = trial_load([_runs(tmp_path, code)], timeout_s=30)
    assert outcome == "closed its pipe to the master while it loaded", outcome
