"""Gunicorn hook helpers that run in the master: metrics directory handling."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from serving.observe import access_log
from serving.server import hooks, pinning
from serving.server.board import Board
from serving.server.recycling import RecycleGate
from serving.server.worker import ServingWorker
from serving.settings import Settings
from tests.conftest import sleeping_processes
from tests.waiting import until


@pytest.fixture(autouse=True)
def _restore_hook_globals(monkeypatch: pytest.MonkeyPatch) -> None:
    """``on_starting`` installs the master's board, ``settings_or_exit`` keeps the
    settings it read: undo both after each test."""
    monkeypatch.setattr(hooks, "_boot", hooks._boot)
    monkeypatch.setattr(hooks, "_settings", None)
    monkeypatch.setattr("serving.server.board._installed", None)


def test_settings_or_exit_exits_at_start_and_keeps_the_running_settings_on_a_reload(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """At start a bad setting is one line and exit status 2; once the master runs, a
    reload that finds one (after ``reload_problem`` looked) keeps what it runs with."""
    model = tmp_path / "m.joblib"
    model.write_bytes(Path("serving/demo/breast_cancer.joblib").read_bytes())
    monkeypatch.setenv("SERVING_MODEL_PATH", str(model))
    monkeypatch.setenv("SERVING_API_KEYS", "")
    monkeypatch.setenv("SERVING_MAX_BATCH_SZE", "8")  # a typo: warned of once
    monkeypatch.setenv("SERVING_MAX_BATCH_SIZE", "nope")
    with pytest.raises(SystemExit) as exited:
        hooks.settings_or_exit()
    monkeypatch.setenv("SERVING_MAX_BATCH_SIZE", "8")
    running = hooks.settings_or_exit()
    model.unlink()
    problem = hooks.reload_problem()
    after = hooks.settings_or_exit()

    assert exited.value.code == 2
    assert problem is not None and problem.startswith("invalid setting SERVING_MODEL_PATH: ")
    assert after is running and hooks.running_settings() is running
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("serving: invalid setting SERVING_MAX_BATCH_SIZE: ")
    assert sum("SERVING_MAX_BATCH_SZE" in line for line in lines) == 1
    assert lines[-1].startswith("serving: invalid setting SERVING_MODEL_PATH: ")


def test_checked_settings_a_served_model_whose_config_json_breaks_serves_on_as_loaded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Found by the second attack: when every served model's config.json broke, the reload
    was refused ("nothing to serve") and the index showed the reload before; and a version
    kept while its config.json was broken, republished with other files, was loaded from
    them, its config never read."""
    import shutil

    from serving.server import in_place, sharing

    root = tmp_path / "models"
    for model in ("a", "c"):
        (root / model / "1").mkdir(parents=True)
        shutil.copy("serving/demo/breast_cancer.joblib", root / model / "1" / "m.joblib")
    monkeypatch.setenv("SERVING_MODEL_REPOSITORY", str(root))
    monkeypatch.setenv("SERVING_API_KEYS", "")
    running = hooks.checked_settings()
    monkeypatch.setattr(hooks, "_settings", running)
    monkeypatch.setattr(hooks, "_identities", in_place.identities(sharing.models_of(running)))
    for model in ("a", "c"):
        (root / model / "config.json").write_text('{"oops": 1}')

    both = hooks.checked_settings()
    republished = root / "a" / "1" / "m.joblib"
    shutil.copy("serving/demo/breast_cancer.joblib", tmp_path / "other")
    os.replace(tmp_path / "other", republished)  # other files under the number that served
    one = hooks.checked_settings()

    assert [(m.name, m.version) for m in both.model_settings()] == [("a", "1"), ("c", "1")]
    kept = "config.json: oops: unknown field; the versions it served serve on (1) until it is fixed"
    assert {(r.model, r.reason) for r in both.refused_models()} == {("a", kept), ("c", kept)}
    assert [(m.name, m.version) for m in one.model_settings()] == [("c", "1")]
    assert {(r.model, r.reason) for r in one.refused_models()} == {
        ("a", "config.json: oops: unknown field"), ("c", kept)
    }  # fmt: skip


def test_on_starting_removes_only_prometheus_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "counter_123.db").write_bytes(b"stale")
    (tmp_path / "histogram_9.db").write_bytes(b"stale")
    (tmp_path / "IMPORTANT.txt").write_text("keep")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))

    server = SimpleNamespace(
        log=logging.getLogger("test"),
        master_pid=0,
        reap_workers=None,
        manage_workers=None,
        reload=None,
        stop=None,
        num_workers=2,
        worker_class=ServingWorker,
        systemd=False,
        cfg=SimpleNamespace(bind=["127.0.0.1:8000"], address=[("127.0.0.1", 0)], reuse_port=False),
    )
    hooks.on_starting(server)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["IMPORTANT.txt"]
    assert hooks._boot is not None and hooks._boot.shared.value == 0  # nothing else listens
    hooks.pre_exec(server)  # a SIGUSR2 upgrade's new master, before its exec
    assert hooks._boot.shared.value == 1


def test_on_starting_under_systemd_socket_activation_marks_the_socket_shared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gunicorn sets ``server.systemd`` only after ``on_starting``, which read it: a
    socket systemd passed was taken for this server's own (an orphaned worker would then
    refuse its new connections), and the port was probed as if free to bind."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setenv("LISTEN_FDS", "1")
    monkeypatch.setenv("LISTEN_PID", str(os.getpid()))
    server = SimpleNamespace(
        log=logging.getLogger("test"), master_pid=0, reap_workers=None, manage_workers=None,
        reload=None, stop=None, num_workers=2, worker_class=ServingWorker, systemd=False,
        cfg=SimpleNamespace(bind=["127.0.0.1:8000"], address=[("256.0.0.1", 1)], reuse_port=False),
    )  # fmt: skip

    hooks.on_starting(server)  # the bogus address is not probed: systemd holds the socket

    assert hooks._boot is not None and hooks._boot.shared.value == 1


def test_on_starting_with_dev_shm_full_stops_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the attack: a full /dev/shm crashed the master at start with a bare
    traceback from multiprocessing (its locks and shared values live there)."""
    import errno
    import multiprocessing

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(multiprocessing, "Value", full)
    monkeypatch.setattr(multiprocessing, "Lock", full)
    server = SimpleNamespace(
        log=logging.getLogger("test"), master_pid=0, num_workers=2,
        worker_class=ServingWorker, systemd=False,
        cfg=SimpleNamespace(bind=["127.0.0.1:8000"], address=[("127.0.0.1", 0)], reuse_port=False),
    )  # fmt: skip

    with pytest.raises(SystemExit) as exited:
        hooks.on_starting(server)

    assert exited.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("serving: cannot create what the workers share")
    assert "/dev/shm" in line and "No space left on device" in line


def test_on_starting_after_usr2_keeps_the_old_generations_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "counter_123.db").write_bytes(b"still written by the old workers")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    server = SimpleNamespace(
        log=logging.getLogger("test"),
        master_pid=1,
        reap_workers=None,
        manage_workers=None,
        reload=None,
        stop=None,
        num_workers=2,
        worker_class=ServingWorker,
        systemd=False,
        cfg=SimpleNamespace(bind=["127.0.0.1:8000"], address=[("127.0.0.1", 0)], reuse_port=False),
    )
    hooks.on_starting(server)

    assert sorted(p.name for p in tmp_path.iterdir()) == ["counter_123.db"]
    assert hooks._boot is not None and hooks._boot.shared.value == 1  # the old one listens


def test_on_starting_refuses_a_worker_class_other_than_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Gunicorn's own gthread (a --worker-class flag) would run without the header and
    body limits, the drain and the counts: the server does not start."""
    from gunicorn.workers.gthread import ThreadWorker  # type: ignore[import-untyped]

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    server = SimpleNamespace(
        log=logging.getLogger("test"),
        master_pid=0,
        num_workers=1,
        worker_class=ThreadWorker,
        cfg=SimpleNamespace(worker_class_str="gthread"),
    )
    with caplog.at_level(logging.ERROR), pytest.raises(SystemExit):
        hooks.on_starting(server)

    assert "worker_class must be serving.server.worker.ServingWorker" in caplog.text
    assert "(got gthread)" in caplog.text


def test_prepare_metrics_dir_creates_and_exports_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # setenv first: a delenv of an absent variable records nothing to undo, and
    # prepare_metrics_dir exports the variable, which then leaked into later tests.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "")
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    target = tmp_path / "a" / "b"

    path = hooks.prepare_metrics_dir(Settings(metrics_dir=target))

    assert path == target and target.is_dir()
    import os

    assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == str(target)


def test_prepare_metrics_dir_that_cannot_be_made_exits_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # setenv first: a delenv of an absent variable records nothing to undo, and
    # prepare_metrics_dir exports the variable, which then leaked into later tests.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "")
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    with pytest.raises(SystemExit) as info:
        hooks.prepare_metrics_dir(Settings(metrics_dir=Path("/proc/no/such/dir")))
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("serving: invalid setting SERVING_METRICS_DIR")


def test_pre_fork_gives_each_new_worker_the_lowest_free_slot() -> None:
    live = {101: SimpleNamespace(serving_slot=0), 102: SimpleNamespace(serving_slot=2)}
    server = SimpleNamespace(WORKERS=live)
    worker = SimpleNamespace()

    hooks.pre_fork(server, worker)

    assert worker.serving_slot == 1
    live[103] = worker
    another = SimpleNamespace()
    hooks.pre_fork(server, another)
    assert another.serving_slot == 3


@pytest.mark.parametrize(
    ("slot", "cpus", "per_worker", "expected"),
    [
        (0, [0, 1], 1, [0, 1]),
        (1, [0, 1], 1, [1, 0]),
        (2, [0, 1], 1, [0, 1]),  # more workers than CPUs: round-robin
        (1, [4, 5, 6, 7], 2, [6, 7, 4, 5]),  # a cpuset that does not start at 0
        (0, [3], 4, [3]),  # never more CPUs than there are
    ],
)
def test_cpus_for_slot_round_robins_over_the_allowed_cpus(
    slot: int, cpus: list[int], per_worker: int, expected: list[int]
) -> None:
    assert pinning.cpus_for_slot(slot, cpus, per_worker) == expected


#: Active connections of one worker sampled every 50 ms (docs/batching.md, "Third pass"):
#: one keep-alive client (in flight or between requests), then 64 clients over 2 workers.
ONE_CLIENT = [0, 1, 1, 0, 1, 0, 0, 1, 1, 1, 0, 1] * 4
SIXTY_FOUR_CLIENTS = [29, 31, 33, 30, 32, 34, 28, 31, 30, 33, 27, 32]


def samples(gate: pinning.QuietGate, active: list[int]) -> list[bool]:
    return [gate.update(n) for n in active]


def test_quiet_gate_keeps_one_client_pinned_and_unpins_under_load_at_once() -> None:
    gate = pinning.QuietGate()

    assert all(samples(gate, ONE_CLIENT))
    busy = samples(gate, SIXTY_FOUR_CLIENTS)
    assert busy[2:] == [False] * (len(busy) - 2)  # within 3 samples (150 ms)
    quiet_again = samples(gate, [0] * 20)
    assert quiet_again[-1] and quiet_again.index(True) <= 12  # the average settles


def test_quiet_gate_does_not_flap_between_two_and_three_requests_in_flight() -> None:
    """Between the thresholds (1.5 and 2.5 on average) the gate keeps its state."""
    gate = pinning.QuietGate()
    samples(gate, [10] * 10)

    assert samples(gate, [2, 2, 3, 2, 2, 2, 3, 2] * 5) == [False] * 40
    samples(gate, [0] * 20)
    assert samples(gate, [1, 2, 1, 2, 2, 1, 2, 1] * 5) == [True] * 40


def test_cpu_claims_of_two_servers_never_share_a_cpu_while_another_is_free(
    tmp_path: Path,
) -> None:
    """Two one-worker servers on one host, both preferring CPU 0 (the first CPU used to
    be the master's pid modulo the CPU count: same parity, same CPU)."""
    first, second, third = (pinning.CpuClaims(tmp_path) for _ in range(3))

    assert first.claim([0, 1], count=1) == {0}
    assert second.claim([0, 1], count=1) == {1}  # CPU 0 is taken: the next free one
    assert third.claim([0, 1], count=1) is None  # none free: pin nothing
    assert third.held == set()
    first.release()
    assert third.claim([0, 1], count=1) == {0}  # free again once released


def test_cpu_claims_take_every_cpu_a_worker_needs_or_none(tmp_path: Path) -> None:
    first, second = pinning.CpuClaims(tmp_path), pinning.CpuClaims(tmp_path)

    assert first.claim([0, 1, 2], count=2) == {0, 1}
    assert second.claim([0, 1, 2], count=2) is None  # one free CPU of the two it needs
    assert second.held == set()  # and it holds not even that one
    assert second.claim([0, 1, 2], count=1) == {2}


def test_cpu_claims_end_with_the_process_that_held_them(tmp_path: Path) -> None:
    import multiprocessing

    context = multiprocessing.get_context("fork")
    claimed, done = context.Event(), context.Event()

    def hold() -> None:
        pinning.CpuClaims(tmp_path).claim([5], count=1)
        claimed.set()
        done.wait(10)

    holder = context.Process(target=hold)
    holder.start()
    try:
        assert claimed.wait(10)
        assert pinning.CpuClaims(tmp_path).claim([5], count=1) is None
    finally:
        done.set()
        holder.join(10)
    assert pinning.CpuClaims(tmp_path).claim([5], count=1) == {5}  # killed or exited


@pytest.fixture
def no_access_writer() -> Iterator[None]:
    """No access log writer running after the test."""
    yield
    access_log.stop()


def test_access_log_is_written_by_its_own_thread_not_the_caller(
    monkeypatch: pytest.MonkeyPatch, no_access_writer: None
) -> None:
    import io
    import json
    import threading

    written: list[tuple[str, str]] = []

    class Recorder(io.StringIO):
        def write(self, text: str) -> int:
            written.append((threading.current_thread().name, text))
            return len(text)

    monkeypatch.setattr("sys.stdout", Recorder())
    access_log.configure(enabled=True)
    before = time.time()
    try:
        access_log.record({"status": 200, "route": "/p"})
        access_log.record({"status": 404, "route": "<unmatched>", "note": Path("/x")})
    finally:
        access_log.stop()  # writes what is queued
    after = time.time()

    lines = [json.loads(line) for _, text in written for line in text.splitlines()]
    assert lines == [
        {"time": lines[0]["time"], "level": "INFO", "message": "request", "status": 200,
         "route": "/p"},
        {"time": lines[1]["time"], "level": "INFO", "message": "request", "status": 404,
         "route": "<unmatched>", "note": "/x"},
    ]  # fmt: skip
    # logging's asctime: local time, milliseconds after a comma
    stamp = time.mktime(time.strptime(lines[0]["time"].split(",")[0], "%Y-%m-%d %H:%M:%S"))
    assert int(before) <= stamp <= after and len(lines[0]["time"].split(",")[1]) == 3
    assert written and all(name == "serving-access-log" for name, _ in written)


def test_access_log_writes_lines_queued_together_in_one_write(
    monkeypatch: pytest.MonkeyPatch, no_access_writer: None
) -> None:
    import io

    writes: list[str] = []

    class Recorder(io.StringIO):
        def write(self, text: str) -> int:
            writes.append(text)
            return len(text)

    monkeypatch.setattr("sys.stdout", Recorder())
    writer = access_log.AccessLog(linger_s=0.5).start()
    for status in range(100):
        writer.write({"status": status})
    writer.stop()

    assert len(writes) == 1 and writes[0].count("\n") == 100


def test_access_log_off_writes_no_request_lines(
    monkeypatch: pytest.MonkeyPatch, no_access_writer: None
) -> None:
    import io

    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    access_log.configure(enabled=False)
    access_log.record({"status": 200})
    access_log.stop()

    assert out.getvalue() == ""
    assert access_log._writer is None


def test_stop_children_ends_a_child_that_ignores_sigterm_and_reaps_it() -> None:
    import subprocess
    import sys

    from serving.server import children

    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + (
        "print('ready', flush=True); time.sleep(60)"
    )
    polite = "import time; print('ready', flush=True); time.sleep(60)"
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
        for code in (stubborn, polite)
    ]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    pids = [proc.pid for proc in procs]
    assert set(pids) <= set(children.children())
    lines: list[str] = []

    stopped = children.stop_children(timeout_s=0.5, log=lines.append, pids=pids)

    assert stopped == pids and len(lines) == 1 and str(pids) in lines[0]
    assert not set(pids) & set(children.children())
    for pid in pids:  # reaped: no zombie left
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    for proc in procs:  # Popen learns it is gone (waitpid: no such child)
        proc.wait(5)
        assert proc.stdout is not None
        proc.stdout.close()


@pytest.fixture
def live_pids() -> Iterator[list[int]]:
    """Four live processes' pids (the board skips the state of a process that is gone)."""
    yield from sleeping_processes(4)


def test_recycle_gate_lets_one_worker_away_at_a_time_and_holds_no_slot(
    tmp_path: Path, live_pids: list[int]
) -> None:
    board = Board(tmp_path)
    gate = RecycleGate(board)
    gate.target = 2
    first, second, replacement, newer = live_pids
    board.write(first, "ready")
    board.write(second, "ready")

    assert gate.try_leave(first)
    assert board.read().states[first] == "leaving"
    assert not gate.try_leave(second)  # first's replacement is not even forked yet
    board.write(replacement, "warming")
    assert not gate.try_leave(second)  # ... nor ready
    board.write(replacement, "ready")
    assert gate.try_leave(second)  # first may still be draining: it holds nothing
    # A worker readied while both leavers still drain (a reload, SIGTTIN) does not wedge
    # the gate (it once did: the slot was freed only by a replacement readied afterwards).
    board.write(newer, "ready")
    assert not gate.try_leave(replacement)  # two leavers draining already
    board.remove(first)
    assert gate.try_leave(replacement)
    board.write(newer, "failed")
    board.remove(second)
    assert not gate.try_leave(newer) and not gate.try_leave(replacement)


class _StallingBoard(Board):
    """A board whose read stalls forever in process ``stall_in`` (a worker inside the
    gate when it dies), after saying so on ``inside``."""

    def __init__(self, path: Path, stall_in: int, inside: Path) -> None:
        super().__init__(path)
        self.stall_in, self.inside = stall_in, inside

    def read(self) -> Any:
        if os.getpid() == self.stall_in:
            self.inside.touch()
            time.sleep(60)
        return super().read()


def test_recycle_gate_is_not_wedged_by_a_worker_that_dies_inside_it(
    tmp_path: Path, live_pids: list[int]
) -> None:
    """A worker stopped (a reload's SIGTERM, the graceful timeout's SIGKILL) while its
    recycle watcher was inside the gate left the gate's lock taken: no worker recycled
    again (the e2e test's "recycling stops for good after a reload")."""
    inside = tmp_path / "inside"
    board = _StallingBoard(tmp_path / "board", stall_in=-1, inside=inside)
    board.path.mkdir()
    gate = RecycleGate(board)
    gate.target = 2
    first, second = live_pids[:2]
    board.write(first, "ready")
    board.write(second, "ready")
    pid = os.fork()
    if pid == 0:  # the dying worker: inside the gate for good
        board.stall_in = os.getpid()
        try:
            gate.try_leave(os.getpid())
        finally:
            os._exit(0)
    try:
        until(inside.exists, 10, what="the child inside the gate")
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)

    left = ThreadPoolExecutor(1).submit(gate.try_leave, first)
    assert left.result(timeout=10)


def test_prepare_metrics_dir_refuses_a_directory_another_server_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess
    import sys

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "")
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    shared = tmp_path / "metrics"
    hooks.prepare_metrics_dir(Settings(metrics_dir=shared))  # this process: the first server
    hooks.prepare_metrics_dir(Settings(metrics_dir=shared))  # a HUP reads the config again

    second = subprocess.run(
        [sys.executable, "-c", "from serving.server import hooks; from serving.settings "
         f"import Settings; hooks.prepare_metrics_dir(Settings(metrics_dir='{shared}'))"],
        check=False, capture_output=True, text=True, timeout=60,
        env={"PATH": os.environ["PATH"]},
    )  # fmt: skip

    assert second.returncode == 2
    assert second.stderr == (
        f"serving: invalid setting SERVING_METRICS_DIR: {shared} is in use by another "
        f"server (master pid {os.getpid()}); give each server its own directory\n"
    )


def test_board_says_the_stage_each_loading_worker_is_at(
    tmp_path: Path, live_pids: list[int]
) -> None:
    board = Board(tmp_path)
    loading, warming, ready, failed = live_pids
    board.write(loading, "starting", stage="model 'churn': loading")
    board.write(warming, "warming", stage="model 'churn': warming up")
    board.write(ready, "ready", stage="model 'cancer': warming up")  # a change in place
    board.write(failed, "failed", "cannot load model /m.pkl: gone", stage="model 'x': loading")

    summary = board.read().summary()

    assert summary["loading"] == 2
    assert summary["stages"] == [
        {"pid": pid, "stage": stage}
        for pid, stage in sorted([
            (loading, "model 'churn': loading"), (warming, "model 'churn': warming up"),
            (ready, "model 'cancer': warming up"),
        ])
    ]  # fmt: skip
    for pid in (loading, warming, ready):
        board.write(pid, "ready")
    assert "stages" not in board.read().summary()


def test_child_exit_survives_a_dead_workers_metric_file_it_cannot_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker killed while it created a metric file leaves it shorter than its header:
    folding it raised struct.error in the master's child_exit; while halting (a first
    boot that failed) that was a traceback and exit status 1 instead of 3. The file is
    left, logged, and the master goes on."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    (tmp_path / "counter_4242.db").write_bytes(b"\x01\x00")
    server = SimpleNamespace(log=logging.getLogger("test.child_exit"))

    with caplog.at_level(logging.WARNING, logger="test.child_exit"):
        hooks.child_exit(server, SimpleNamespace(pid=4242))

    assert "worker 4242: metrics not archived" in caplog.text
    assert (tmp_path / "counter_4242.db").exists()


@pytest.mark.unit
def test_load_error_line_names_what_is_no_exception_or_says_nothing() -> None:
    from serving.errors import ModelLoadError
    from serving.server.worker_boot import load_error_line

    assert load_error_line(SystemExit(4)) == "the load raised SystemExit(4)"
    assert load_error_line(KeyboardInterrupt()) == "the load raised KeyboardInterrupt"
    assert load_error_line(ValueError("")) == "the load raised ValueError"
    error = ModelLoadError(Path("m.pkl"), "EOF\nat byte 3")
    assert load_error_line(error) == " ".join(str(error).split())  # one line


@pytest.mark.unit
def test_the_master_imports_what_a_worker_imports_to_serve(tmp_path: Path) -> None:
    """Each fork imported the app, Flask, werkzeug and prometheus-client again: 0.2 s of
    CPU per worker, at every rollover. The master imports them once, before it forks."""
    import subprocess
    import sys

    script = (
        "import os, sys\n"
        f"os.environ['PROMETHEUS_MULTIPROC_DIR'] = {str(tmp_path)!r}\n"
        "from serving.server import hooks\n"
        "hooks._import_what_workers_import()\n"
        "before = set(sys.modules)\n"
        "import wsgi\n"  # what a worker does at boot (gunicorn's load_wsgi)
        "print(' '.join(sorted(set(sys.modules) - before)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120,
        cwd=Path(__file__).resolve().parent.parent,
    )  # fmt: skip
    new = done.stdout.split()
    late = [m for m in new if m.split(".")[0] in ("flask", "werkzeug", "prometheus_client")]
    assert late == [], late
    assert [m for m in new if m.startswith("serving")] == [], new


def test_reload_problem_a_refused_reload_takes_its_ask(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the second attack: a reload refused (the repository left with nothing to
    serve) left the poller's ask, and the operator's SIGHUP after it was taken in place."""
    from serving.errors import SettingsError
    from serving.server import hooks, in_place

    monkeypatch.setattr(in_place, "asks", in_place.Asks())
    in_place.asks.add()  # the poller asks for the repository emptied

    def refused() -> None:
        raise SettingsError("SERVING_MODEL_REPOSITORY", "nothing to serve")

    monkeypatch.setattr(hooks, "checked_settings", refused)
    assert hooks.reload_problem() is not None

    assert in_place.asks.take() is False  # the next SIGHUP is no ask of the server's
