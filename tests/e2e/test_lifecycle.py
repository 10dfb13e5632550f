"""Worker lifecycle under traffic: HUP reload onto a new model file, max_requests recycling,
and a model that forks."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

from tests.e2e.server import GunicornServer
from tests.models import ForksOnPredict, RowOffset
from tests.waiting import until

Start = Callable[..., GunicornServer]
Pickled = Callable[[Any, str], Path]


def keep_sending(
    server: GunicornServer, stop: threading.Event, n_threads: int = 4, limit_s: float = 90.0
) -> list[Any]:
    """Send single-instance requests from ``n_threads`` sessions until ``stop`` (or
    ``limit_s`` seconds, so a test whose wait fails still ends); every outcome (status and
    the model's offset, or the exception), thread after thread."""
    deadline = time.monotonic() + limit_s

    def loop(caller: int) -> list[Any]:
        session = requests.Session()
        outcomes: list[Any] = []
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                response = session.post(
                    f"{server.url}/predict", json={"instances": [[float(caller)]]}, timeout=30
                )
                body = response.json()
                offset = body["predictions"][0] - caller if response.status_code == 200 else body
                outcomes.append((response.status_code, offset))
            except requests.RequestException as exc:
                outcomes.append(exc)
        return outcomes

    with ThreadPoolExecutor(n_threads) as pool:
        futures = [pool.submit(loop, c) for c in range(n_threads)]
        return [outcome for future in futures for outcome in future.result(120)]


def test_hup_reloads_workers_onto_a_new_model_file_without_a_failed_request(
    gunicorn: Start, pickled: Pickled, tmp_path: Path
) -> None:
    old = pickled(RowOffset(offset=0.0), "v1.pkl")
    new = pickled(RowOffset(offset=1000.0), "v2.pkl")
    current = tmp_path / "current.pkl"
    current.symlink_to(old)
    server = gunicorn(model_path=current)
    server.wait_ready()
    stop = threading.Event()

    with ThreadPoolExecutor(1) as pool:
        traffic = pool.submit(keep_sending, server, stop)
        server.wait_answered(20)  # the traffic flows
        old = set(server.worker_pids())
        current.unlink()
        current.symlink_to(new)
        assert server.proc is not None
        server.proc.send_signal(signal.SIGHUP)
        server.wait_for_log("ready to serve", 4, timeout_s=30)  # two new workers loaded
        until(lambda: not old & set(server.worker_pids()), 30, what="the old workers gone")
        server.wait_answered(server.answered() + 20)  # and the new ones serve the traffic
        stop.set()
        outcomes = traffic.result(120)

    failures = [o for o in outcomes if not (isinstance(o, tuple) and o[0] == 200)]
    assert failures == []
    offsets = [offset for _, offset in outcomes]
    assert set(offsets) == {0.0, 1000.0}, "the new model never answered"
    assert offsets[-1] == 1000.0


def test_max_requests_recycles_workers_without_a_failed_request(
    gunicorn: Start, pickled: Pickled
) -> None:
    model = pickled(RowOffset(offset=0.0), "m.pkl")
    server = gunicorn(model_path=model, max_requests=60, max_requests_jitter=10)
    server.wait_ready()
    stop = threading.Event()

    with ThreadPoolExecutor(1) as pool:
        traffic = pool.submit(keep_sending, server, stop)
        server.wait_for_log("ready to serve", 5, timeout_s=60)  # 3 replacements ready
        stop.set()
        outcomes = traffic.result(120)

    failures = [o for o in outcomes if not (isinstance(o, tuple) and o[0] == 200)]
    assert failures == []
    assert len(outcomes) > 150
    assert "loading before accepting" in server.output()


def test_sigkill_of_a_worker_under_load_fails_only_its_in_flight_requests(
    gunicorn: Start, pickled: Pickled
) -> None:
    model = pickled(RowOffset(offset=0.0), "m.pkl")
    server = gunicorn(model_path=model)
    server.wait_ready()
    victim = server.worker_pids()[0]
    stop = threading.Event()
    n_threads = 12

    with ThreadPoolExecutor(1) as pool:
        traffic = pool.submit(keep_sending, server, stop, n_threads)
        server.wait_answered(20)  # the traffic flows
        os.kill(victim, signal.SIGKILL)
        server.wait_for_log("ready to serve", 3, timeout_s=30)  # the replacement is ready
        server.wait_answered(server.answered() + 20)  # and the traffic goes on
        stop.set()
        outcomes = traffic.result(120)

    answered = [o for o in outcomes if isinstance(o, tuple)]
    dropped = [o for o in outcomes if not isinstance(o, tuple)]
    assert all(status == 200 for status, _ in answered), [o for o in answered if o[0] != 200]
    # At most one request per client thread was in flight on the killed worker.
    assert len(dropped) <= n_threads, dropped
    # A connection dropped mid-request surfaces as ConnectionError, or as
    # ChunkedEncodingError when the worker died while sending the response.
    dropped_kinds = (requests.ConnectionError, requests.exceptions.ChunkedEncodingError)
    assert all(isinstance(o, dropped_kinds) for o in dropped), [type(o) for o in dropped]
    assert len(answered) > 100


def process_gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie nobody reaped counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


def listening_inodes(port: int) -> set[str]:
    """Inodes of the TCP sockets listening on ``port`` (``/proc/net/tcp``)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rpartition(":")[2], 16) == port and fields[3] == "0A":
            inodes.add(fields[9])
    return inodes


def holds_sockets(pid: int, inodes: set[str]) -> bool:
    fds = Path(f"/proc/{pid}/fd")
    return any(
        os.readlink(fd).removeprefix("socket:[").rstrip("]") in inodes for fd in fds.iterdir()
    )


def catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (``SigCgt`` in its status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    raise AssertionError(f"no SigCgt for {pid}")


def test_a_child_the_model_forked_does_not_keep_the_port_after_sigterm(
    gunicorn: Start, pickled: Pickled, tmp_path: Path
) -> None:
    """A forked child inherited the worker's listening socket and Gunicorn's signal
    handlers (a SIGTERM only set a flag): after the server's SIGTERM it held the port until
    it was SIGKILLed."""
    pid_file = tmp_path / "child.pid"
    model = pickled(ForksOnPredict(str(pid_file)), "forks.pkl")
    server = gunicorn(model_path=model, workers=1)
    server.wait_ready(workers=1)
    assert server.predict([[7.0]]).json()["predictions"] == [7.0]
    child = int(pid_file.read_text())
    try:
        assert not process_gone(child)
        listening = listening_inodes(server.port)
        assert listening and holds_sockets(server.worker_pids()[0], listening)
        assert not holds_sockets(child, listening)
        assert not catches(child, signal.SIGTERM)  # the default action: SIGTERM ends it
        assert catches(server.worker_pids()[0], signal.SIGTERM)

        assert server.terminate() == 0, server.output()

        with socket.socket() as again:  # as the next server on this port would
            again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            again.bind(("127.0.0.1", server.port))
            again.listen()
        until(lambda: process_gone(child), 10, what=f"child {child} gone")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)


def test_usr2_upgrade_shares_the_metrics_directory_then_takes_its_lock(
    gunicorn: Start, pickled: Pickled
) -> None:
    """A second server on a metrics directory is refused (its lock is held); the new master
    of a SIGUSR2 upgrade is not, and holds the lock once the old generation is gone."""
    import re

    model = pickled(RowOffset(offset=0.0), "m.pkl")
    server = gunicorn(model_path=model)
    server.wait_ready()
    assert server.proc is not None
    for _ in range(10):
        assert server.predict([[1.0]]).status_code == 200
    lock = server.metrics_dir / "serving.lock"
    assert lock.read_text().strip() == str(server.proc.pid)

    server.proc.send_signal(signal.SIGUSR2)
    server.wait_for_log("ready to serve", 4, timeout_s=60)  # the new generation's workers
    masters = [int(p) for p in re.findall(r"Listening at: \S+ \((\d+)\)", server.output())]
    assert len(masters) == 2, server.output()
    server.proc.send_signal(signal.SIGWINCH)  # the old master stops its workers
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait_exit() == 0, server.output()

    until(
        lambda: lock.read_text().strip() == str(masters[1]), 10,
        what=lambda: f"the lock taken by {masters[1]}:\n{server.output()}",
    )  # fmt: skip
    for _ in range(5):
        assert server.predict([[1.0]]).status_code == 200
    assert server.metric('http_requests_total{route="/predict"}') == 15
    os.kill(masters[1], signal.SIGTERM)
    until(
        lambda: process_gone(masters[1]), 30, interval_s=0.1,
        what=lambda: f"master {masters[1]} gone:\n{server.output()}",
    )  # fmt: skip
