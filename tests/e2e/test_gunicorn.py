"""The real ``gunicorn wsgi:app -c gunicorn.conf.py`` on 127.0.0.1 with 2 gthread workers."""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import pytest
import requests
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from serving.settings import DEMO_MODEL_PATH
from tests.e2e.server import GunicornServer
from tests.models import HangsOn42, RowEcho, RowOffset, SlowLoading
from tests.waiting import until

Start = Callable[..., GunicornServer]
Pickled = Callable[[Any, str], Path]


def burst(
    server: GunicornServer,
    n_callers: int,
    make_rows: Callable[[int], list[list[float]]],
) -> list[requests.Response]:
    """One request per caller, all released together; the responses in caller order."""
    barrier = threading.Barrier(n_callers)

    def call(caller: int) -> requests.Response:
        barrier.wait(30)
        return server.predict(make_rows(caller))

    with ThreadPoolExecutor(n_callers) as pool:
        return list(pool.map(call, range(n_callers)))


def test_demo_model_predicts_real_rows_like_the_artifact_itself(
    gunicorn: Start, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    X, y = breast_cancer
    expected = joblib.load(DEMO_MODEL_PATH).predict(X)  # the artifact, without our code
    server = gunicorn()
    server.wait_ready()

    predictions: list[int] = []
    for chunk in np.array_split(X, 8):
        response = server.predict(chunk.tolist())
        assert response.status_code == 200, response.text
        body = response.json()
        assert (body["model_name"], body["model_version"], body["classes"]) == (
            "breast_cancer",
            "1",
            [0, 1],
        )
        predictions += body["predictions"]

    np.testing.assert_array_equal(predictions, expected)
    assert float(np.mean(np.array(predictions) == y)) > 0.95


def test_concurrent_single_instance_requests_are_batched_and_each_gets_its_own_row(
    gunicorn: Start, pickled: Pickled
) -> None:
    model = pickled(RowEcho(n_features=3, delay_s=0.01), "echo.pkl")
    server = gunicorn(model_path=model, max_batch_latency_ms=20, max_batch_size=32)
    server.wait_ready()

    responses = burst(server, 64, lambda caller: [[float(caller), 0.0, 1.0]])

    for caller, response in enumerate(responses):
        assert response.status_code == 200, response.text
        assert response.json()["predictions"] == [float(caller)]
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    calls = server.metric("inference_batch_size_count", text)
    rows = server.metric("inference_batch_size_sum", text)
    single_row_calls = server.metric('inference_batch_size_bucket{le="1.0"}', text)
    assert rows == 64  # warmup calls the model directly and is not counted
    assert single_row_calls < calls, "no predict call merged several requests"
    assert rows / calls > 1.5


def test_bad_input_over_http_gets_json_errors(gunicorn: Start) -> None:
    server = gunicorn(max_body_bytes=4096)
    server.wait_ready()
    url = f"{server.url}/predict"
    json_headers = {"Content-Type": "application/json"}

    def chunked_body() -> Any:
        yield b'{"instances": ['
        for _ in range(300):
            yield b"[" + b",".join([b"1.0"] * 30) + b"],"
        yield b"[1.0]]}"

    cases = [
        (requests.post(url, data=b"{oops", headers=json_headers), 400, "malformed_json"),
        (
            requests.post(url, data=b"{}", headers={"Content-Type": "text/csv"}),
            415,
            "unsupported_media_type",
        ),
        (server.predict([[1.0] * 29]), 422, "invalid_input"),
        (server.predict([[1.0] * 30, [1.0] * 31]), 422, "invalid_input"),
        (server.predict([["1.5"] * 30]), 422, "invalid_input"),
        (requests.post(url, data=b"x" * 5000, headers=json_headers), 413, "payload_too_large"),
        (requests.post(url, data=chunked_body(), headers=json_headers), 413, "payload_too_large"),
        (server.predict([[1.0] * 30], headers={"X-Request-ID": "r-1"}), 200, None),
        (
            requests.post(url, json={"instances": [[1.0] * 30], "model_version": "2"}),
            409,
            "version_conflict",
        ),
        (requests.get(f"{server.url}/nope"), 404, "not_found"),
        (requests.delete(url), 405, "method_not_allowed"),
    ]
    for response, status, code in cases:
        assert response.status_code == status, (status, response.text)
        assert response.headers["Content-Type"] == "application/json"
        if code is not None:
            assert response.json()["error"]["code"] == code
    assert cases[7][0].headers["X-Request-ID"] == "r-1"


def test_head_on_a_prediction_route_is_405_with_no_body_and_no_log_line(
    gunicorn: Start,
) -> None:
    """Found by the attack: the dispatcher sent its 405 body on HEAD, and Gunicorn logged
    a warning for each such request (a log flood for anyone sending HEAD)."""
    server = gunicorn()
    server.wait_ready()
    for _ in range(5):
        for path in ("/predict", "/v2/models/breast_cancer/infer", "/invocations"):
            connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
            connection.request("HEAD", path)
            response = connection.getresponse()
            assert response.status == 405, path
            assert "POST" in (response.getheader("Allow") or ""), path
            assert response.read() == b""
            connection.close()
    get = requests.get(f"{server.url}/predict", timeout=10)  # GET still has its JSON body
    server.wait_for_log('"method":"HEAD"', 15)

    assert get.status_code == 405 and get.json()["error"]["code"] == "method_not_allowed"
    assert "no-body response" not in server.output()


def test_healthz_is_503_while_the_model_loads_and_200_after(
    gunicorn: Start, pickled: Pickled
) -> None:
    model = pickled(SlowLoading(n_features=3, load_s=3.0), "slow.pkl")
    # One worker: every answer is its state. It loads the model itself (a shared model is
    # loaded by the master before any worker exists: connections wait in the backlog).
    server = gunicorn(model_path=model, workers=1, share_model="off")

    statuses: list[str] = []

    def probe_until_ready() -> bool:
        try:
            response = requests.get(f"{server.url}/healthz", timeout=5)
        except requests.ConnectionError:
            return False
        body = response.json()
        assert response.status_code == (200 if body["status"] == "ready" else 503)
        statuses.append(body["status"])
        if body["status"] == "loading" and statuses.count("loading") == 1:
            # Checked once, at the start of the 3 s load, so the load cannot finish between
            # the /healthz answer and these two requests.
            assert requests.get(f"{server.url}/livez", timeout=5).status_code == 200
            early = server.predict([[1.0, 2.0, 3.0]])
            assert early.status_code == 503 and early.json()["error"]["code"] == "not_ready"
        return body["status"] == "ready"

    until(probe_until_ready, 30, interval_s=0.05, what=lambda: f"ready ({statuses})")
    assert statuses[0] == "loading" and statuses[-1] == "ready", statuses
    server.wait_ready(workers=1)
    assert server.predict([[1.0, 2.0, 3.0]]).json()["predictions"] == [1.0]


def predict_count_per_worker(metrics_dir: Path, tmp_path: Path) -> list[float]:
    """Each worker's own count of answered /predict requests, read from its counter file alone."""
    counts = []
    for path in sorted(metrics_dir.glob("counter_*.db")):
        alone = tmp_path / f"alone-{path.stem}"
        alone.mkdir(exist_ok=True)
        shutil.copy(path, alone / path.name)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(alone))
        labels = {"method": "POST", "route": "/predict", "status": "200"}
        counts.append(registry.get_sample_value("http_requests_total", labels) or 0.0)
    return counts


def test_metrics_sum_a_counter_over_both_workers(
    gunicorn: Start, pickled: Pickled, tmp_path: Path
) -> None:
    model = pickled(RowEcho(n_features=1, delay_s=0.005), "echo.pkl")
    server = gunicorn(model_path=model)
    server.wait_ready()

    sent = 0

    def both_workers_answered() -> bool:
        nonlocal sent
        responses = burst(server, 32, lambda caller: [[float(caller)]])
        assert all(r.status_code == 200 for r in responses)
        sent += len(responses)
        return sum(c > 0 for c in predict_count_per_worker(server.metrics_dir, tmp_path)) == 2

    until(both_workers_answered, 60, interval_s=0, what="requests reaching both workers")

    per_worker = predict_count_per_worker(server.metrics_dir, tmp_path)
    assert len(per_worker) == 2 and sum(per_worker) == sent
    label = 'http_requests_total{method="POST",route="/predict",status="200"}'
    for _ in range(6):  # whichever worker answers the scrape, it reports the sum
        assert server.metric(label) == sent


def test_sigterm_during_a_burst_answers_every_accepted_request(
    gunicorn: Start, pickled: Pickled
) -> None:
    model = pickled(RowEcho(n_features=2, delay_s=0.25), "slow_predict.pkl")
    server = gunicorn(model_path=model, max_batch_size=4, max_batch_latency_ms=1)
    server.wait_ready()

    with ThreadPoolExecutor(24) as pool:
        futures = [pool.submit(server.predict, [[float(c), 0.0]]) for c in range(24)]
        # Every request is accepted (queued behind the slow model), none left in the backlog.
        until(lambda: server.accepted_connections() == 24, 30, what="24 connections accepted")
        assert server.proc is not None
        server.proc.send_signal(15)
        responses = [future.result(60) for future in futures]

    for caller, response in enumerate(responses):
        assert response.status_code == 200, response.text
        assert response.json()["predictions"] == [float(caller)]
    assert server.wait_exit() == 0


@pytest.mark.usefixtures("cpu_hog")
def test_sigterm_under_keep_alive_traffic_resets_no_request_it_let_in(
    gunicorn: Start, pickled: Pickled
) -> None:
    """Found by the attack: clients on keep-alive connections, told ``Connection: close``
    by a stopping worker, reconnected at once; the worker, draining for up to 2 s, still
    held its copy of the listening socket, so the kernel took their connections into the
    backlog and their requests were sent, and when the worker closed it at exit each was
    reset (13-16 of 16 clients, with one worker). A stopping worker now stops listening
    when it stops accepting: a client that comes after is refused, before it sends. Still
    1 to 6 of 16 were reset in about one run of three: those the kernel completed into the
    backlog just before the close. The last worker now stops handshakes first, then
    answers the backlog, then closes (20 runs in a row with a CPU hog on every core)."""
    model = pickled(RowOffset(offset=0.0), "m.pkl")
    server = gunicorn(model_path=model, workers=1)
    server.wait_ready(workers=1)
    body = b'{"instances": [[1.0]]}'
    stop = threading.Event()
    outcomes: list[str] = []

    def loop() -> None:
        connection: http.client.HTTPConnection | None = None
        while not stop.is_set():
            try:
                if connection is None:
                    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
                    connection.connect()
            except ConnectionRefusedError:
                outcomes.append("refused")
                connection = None
                time.sleep(0.01)
                continue
            try:
                connection.request("POST", "/predict", body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                response.read()
                outcomes.append(str(response.status))
                if response.getheader("Connection", "").lower() == "close":
                    connection.close()
                    connection = None
            except (OSError, http.client.HTTPException) as exc:
                outcomes.append(f"{type(exc).__name__} after the request was sent")
                connection.close()
                connection = None

    clients = [threading.Thread(target=loop, daemon=True) for _ in range(16)]
    for client in clients:
        client.start()
    try:
        server.wait_answered(200)
        assert server.terminate() == 0
        until(lambda: outcomes.count("refused") >= 16, 10, what="clients refused")
    finally:
        stop.set()
        for client in clients:
            client.join(40)

    assert outcomes.count("200") >= 200
    assert set(outcomes) == {"200", "refused"}, [o for o in outcomes if o != "200"][:20]


def test_sigterm_while_a_reload_loads_lets_no_client_in_to_be_reset(
    gunicorn: Start, pickled: Pickled
) -> None:
    """Found by the attack: a worker a reload had forked, still loading, left on SIGTERM
    with its copy of the listening socket open until it exited (its model load goes on
    meanwhile): the kernel took new connections into the backlog and reset them then (8 of
    8 keep-alive clients with SIGTERM 0.3 s after SIGHUP). It closes it when it leaves."""
    model = pickled(SlowLoading(n_features=1, load_s=4.0), "slow.pkl")
    server = gunicorn(model_path=model, share_model="off")
    server.wait_ready()
    assert server.proc is not None
    server.proc.send_signal(signal.SIGHUP)
    server.wait_for_log("loading before accepting", 2)
    server.proc.send_signal(signal.SIGTERM)
    server.wait_for_log("stopping while loading", 2)
    time.sleep(0.5)  # the old workers have stopped listening, the master too

    outcome = "answered"
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as client:
            client.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
            client.recv(1)
    except ConnectionRefusedError:
        outcome = "refused"
    except OSError as exc:
        outcome = f"{type(exc).__name__} after the request was sent"
    assert outcome == "refused"
    assert server.wait_exit() == 0


def test_a_model_that_fails_to_load_stops_the_server_with_a_clear_line(
    gunicorn: Start, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.pkl"
    broken.write_bytes(b"this is not a pickle")
    server = gunicorn(model_path=broken)

    status = server.wait_exit(timeout_s=60)

    assert status == 3, server.output()  # WORKER_BOOT_ERROR: the master halts, no respawn loop
    output = server.output()
    assert f"cannot load model {broken}: UnpicklingError" in output
    assert output.count("Booting worker") <= 2


def test_a_bad_setting_stops_gunicorn_before_it_starts(gunicorn: Start) -> None:
    server = gunicorn(max_batch_latency_ms="soon")

    assert server.wait_exit(timeout_s=60) == 2
    lines = server.output().strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("serving: invalid setting SERVING_MAX_BATCH_LATENCY_MS: got 'soon'")


def test_a_hung_predict_answers_504_and_the_worker_is_recycled(
    gunicorn: Start, pickled: Pickled
) -> None:
    model = pickled(HangsOn42(n_features=2), "hangs.pkl")
    server = gunicorn(
        model_path=model, workers=1, request_timeout_ms=1500, inference_timeout_ms=1000
    )
    server.wait_ready(workers=1)
    first_worker = server.output().count("Booting worker")

    hung = server.predict([[42.0, 0.0]])
    assert hung.status_code == 504, hung.text
    assert hung.json()["error"]["code"] == "timeout"

    server.wait_for_log("ready to serve", 2, timeout_s=30)  # a fresh worker replaced it
    assert "recycling it" in server.output()
    assert server.output().count("Booting worker") == first_worker + 1
    assert server.predict([[7.0, 0.0]]).json()["predictions"] == [7.0]


def allowed_cpus(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list for {pid}")


def thread_cpus(pid: int) -> set[str]:
    """The CPU lists every thread of process ``pid`` may run on."""
    found = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, AssertionError):  # a thread that ended
            found.add(allowed_cpus(int(task.name)))
    return found


def test_each_worker_is_pinned_to_its_own_cpu_while_quiet_and_everywhere_when_busy(
    gunicorn: Start, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    """SERVING_CPU_AFFINITY=adaptive (the default): one request at a time, each worker's
    threads share one CPU (the lowest latency); 16 clients at once, they may run on every
    CPU (a worker pinned to a CPU that the clients or nginx also need got batches of 1.7
    there); quiet again, pinned again."""
    import os

    everywhere = len(os.sched_getaffinity(0))
    X, _ = breast_cancer
    server = gunicorn()
    server.wait_ready()
    assert server.proc is not None
    workers = server.worker_pids()
    for _ in range(20):  # one at a time
        assert server.predict([X[0].tolist()]).status_code == 200

    pinned = [thread_cpus(pid) for pid in workers]

    assert len(workers) == 2
    assert all(len(cpus) == 1 for cpus in pinned), pinned  # every thread on the same CPUs
    assert all("," not in c and "-" not in c for cpus in pinned for c in cpus), pinned
    if everywhere >= 2:
        assert pinned[0] != pinned[1]
        assert allowed_cpus(server.proc.pid) not in pinned[0]  # the master is not pinned
    stop = threading.Event()

    def client() -> None:
        with requests.Session() as session:
            while not stop.is_set():
                session.post(f"{server.url}/predict", json={"instances": [X[1].tolist()]})

    everywhere_seen: set[int] = set()  # workers seen with every thread on every CPU

    def busiest_seen_everywhere() -> bool:
        assert server.proc is not None
        everywhere_seen.update(
            pid for pid in workers if thread_cpus(pid) == {allowed_cpus(server.proc.pid)}
        )
        held = server.connections_per_worker()
        busiest = max(workers, key=lambda pid: held.get(pid, 0))
        return held.get(busiest, 0) >= 8 and busiest in everywhere_seen

    with ThreadPoolExecutor(16) as pool:
        for _ in range(16):
            pool.submit(client)
        try:
            # The busiest: the kernel may split the 16 connections unevenly (14 and 2 in
            # bench/connection_spread.py), and a worker holding 2 is quiet, so pinned; one
            # holding 6 on a machine another job keeps busy answered about 2 at a time (a
            # new user's trial), under the 2.5 it unpins at.
            until(
                busiest_seen_everywhere, timeout_s=20, interval_s=0.05,
                what=lambda: f"the busiest worker on every CPU ({server.connections_per_worker()})",
            )  # fmt: skip
        finally:
            stop.set()
    until(
        lambda: [thread_cpus(pid) for pid in workers] == pinned,
        timeout_s=20,
        what=lambda: f"quiet workers pinned again ({[thread_cpus(p) for p in workers]})",
    )


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to choose from")
def test_two_servers_on_one_host_pin_their_workers_to_different_cpus(
    gunicorn: Start, pickled: Pickled
) -> None:
    """Two one-worker servers: the first CPU was the master's pid modulo the CPU count, so
    masters whose pids had the same parity pinned both workers to CPU 0 (combined 4,689
    answers where unpinned gave 8,717). Each worker now claims its CPU across the host."""
    model = pickled(RowOffset(offset=0.0), "m.pkl")
    servers = [gunicorn(model_path=model, workers=1, cpu_affinity="auto") for _ in range(2)]
    for server in servers:
        server.wait_ready(workers=1)
    pinned = [
        until(lambda s=s: _pinned_cpu(s.worker_pids()[0]), 10, what="a pinned worker")
        for s in servers
    ]

    assert pinned[0] != pinned[1], pinned


def _pinned_cpu(pid: int) -> str | None:
    """The one CPU every thread of ``pid`` is pinned to, or None."""
    cpus = thread_cpus(pid)
    only = next(iter(cpus)) if len(cpus) == 1 else ""
    return only if only.isdigit() else None


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to choose from")
def test_a_cpu_mask_set_from_outside_is_never_overridden(gunicorn: Start, pickled: Pickled) -> None:
    """``taskset -a -p`` on a worker: its pinning thread moved every thread back at its
    next change. Now it stops pinning and says so, and gives up its claim on the CPU at
    once, while still quiet (the attack found a quiet worker kept it, and kept another
    server off a CPU nothing was pinned to)."""
    model = pickled(RowOffset(offset=0.0), "m.pkl")
    server = gunicorn(model_path=model, workers=1)  # adaptive: pinned while quiet
    server.wait_ready(workers=1)
    worker = server.worker_pids()[0]
    pinned = until(lambda: _pinned_cpu(worker), 10, what="the quiet worker pinned")
    mine = {cpu for cpu in os.sched_getaffinity(0) if str(cpu) != pinned}
    for task in Path(f"/proc/{worker}/task").iterdir():  # as taskset -a -p does
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(task.name), mine)
    server.wait_for_log("no longer pins itself", 1, timeout_s=5)  # quiet: no load needed
    claims = [
        fd for fd in Path(f"/proc/{worker}/fd").iterdir()
        if "serving-cpu-" in os.readlink(fd)
    ]  # fmt: skip
    assert claims == []
    stop = threading.Event()

    def client() -> None:  # busy: the worker would unpin, setting every CPU again
        with requests.Session() as session:
            while not stop.is_set():
                session.post(f"{server.url}/predict", json={"instances": [[1.0]]})

    with ThreadPoolExecutor(16) as pool:
        for _ in range(16):
            pool.submit(client)
        try:
            server.wait_answered(200)
        finally:
            stop.set()
    for _ in range(20):  # quiet again: it would pin again
        assert server.predict([[1.0]]).status_code == 200
    time.sleep(1.5)  # longer than a pinning attempt's retry (1 s): nothing comes

    assert thread_cpus(worker) == {_cpu_list(mine)}


def _cpu_list(cpus: set[int]) -> str:
    """``cpus`` as /proc writes a CPU list (``0``, ``0-1``, ``2,5``)."""
    ordered = sorted(cpus)
    if len(ordered) > 1 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}-{ordered[-1]}"
    return ",".join(map(str, ordered))


def test_a_killed_worker_comes_back_without_answering_503_while_it_loads(
    gunicorn: Start, pickled: Pickled
) -> None:
    import os
    import signal

    model = pickled(SlowLoading(n_features=1, load_s=2.0), "slow.pkl")
    server = gunicorn(model_path=model)
    server.wait_ready()
    assert server.proc is not None
    victim = server.worker_pids()[0]

    statuses: list[int | str] = []
    killed_at = 0

    def send_until_replaced() -> bool:
        """One request; True once the replacement is ready and 20 more were answered."""
        nonlocal killed_at
        if not killed_at and len(statuses) >= 20:
            os.kill(victim, signal.SIGKILL)
            killed_at = len(statuses)
        try:
            statuses.append(server.predict([[3.0]]).status_code)
        except requests.ConnectionError:
            statuses.append("connection error")
        if killed_at and server.output().count("ready to serve") < 3:
            killed_at = len(statuses)  # the replacement still loads
        return bool(killed_at) and len(statuses) >= killed_at + 20

    until(send_until_replaced, 60, interval_s=0, what="the replacement worker serving")
    assert len(statuses) >= 40  # 20 before the kill, 20 once the replacement serves
    # Only a request in flight on the killed worker may fail; none gets a 503 from the
    # replacement worker while its model loads (2 s here).
    assert statuses.count(503) == 0, statuses
    assert sum(s != 200 for s in statuses) <= 1, statuses
    assert "loading before accepting" in server.output()


def test_access_log_is_one_json_line_per_request(gunicorn: Start, pickled: Pickled) -> None:
    import json

    model = pickled(RowEcho(n_features=1, delay_s=0.01), "echo.pkl")
    key = "secret-key-0123456789"
    server = gunicorn(model_path=model, api_keys=key)
    server.wait_ready()
    headers = {"X-Request-ID": "trace-7", "Authorization": f"Bearer {key}"}

    assert server.predict([[1.0], [2.0]], headers=headers).status_code == 200
    assert server.predict([[1.0]]).status_code == 401
    requests.get(f"{server.url}/healthz", timeout=5)

    def access_lines() -> list[dict[str, Any]]:
        lines = [json.loads(line) for line in server.output().splitlines() if line.startswith("{")]
        return [line for line in lines if line.get("message") == "request"]

    lines = until(lambda: a if len(a := access_lines()) >= 3 else [], 10, what=server.output)
    traced = next(line for line in lines if line.get("request_id") == "trace-7")
    assert traced["route"] == "/predict" and traced["status"] == 200
    assert traced["instances"] == 2 and traced["batch_size"] >= 2
    assert traced["model_version"] == "1" and traced["latency_ms"] > 0
    statuses = [line["status"] for line in lines]  # wait_ready's /healthz is logged too
    assert statuses.count(401) == 1 and statuses.count(200) >= 2
    assert key not in server.output()


def test_a_port_in_use_stops_the_server_at_once_and_leaves_no_temporary_directory(
    pickled: Pickled, tmp_path: Path
) -> None:
    """Gunicorn exits without calling on_exit when it cannot bind: the metrics directory
    and the workers' board it had made were left behind. It also tried for 5 s first,
    while a health check could reach whatever held the port (issue 34): the start now
    stops at once, in one line naming the address."""
    import socket

    model = pickled(RowEcho(n_features=1), "echo.pkl")
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = GunicornServer(tmp_path, model_path=model)
        del server.env["SERVING_METRICS_DIR"]  # the default: a new temporary directory
        server.env["TMPDIR"] = str(temporary)
        server.env["SERVING_BIND"] = f"127.0.0.1:{taken.getsockname()[1]}"
        started = time.monotonic()
        try:
            status = server.start().wait_exit(timeout_s=60)
        finally:
            server.kill()
        took = time.monotonic() - started
    assert status == 2, server.output()
    address = server.env["SERVING_BIND"]
    lines = [line for line in server.output().splitlines() if line.startswith("serving:")]
    assert lines == [f"serving: cannot listen on {address}: Address already in use "
                     "(another process holds it: stop it, or set SERVING_BIND)"], lines  # fmt: skip
    assert took < 4.5, server.output()  # Gunicorn's own retries take 5 s
    assert list(temporary.iterdir()) == []


def test_a_second_server_on_the_same_metrics_directory_is_refused(
    gunicorn: Start, pickled: Pickled
) -> None:
    """Both servers used to run: the second wiped the first's counter files at start and
    their workers' files mixed, so each server's /metrics counted the other's requests."""
    model = pickled(RowEcho(n_features=1), "echo.pkl")
    first = gunicorn(model_path=model)
    first.wait_ready()
    assert first.proc is not None
    sent = 0
    for _ in range(5):
        assert first.predict([[1.0]]).status_code == 200
        sent += 1

    second = gunicorn(model_path=model, metrics_dir=first.metrics_dir)

    assert second.wait_exit(timeout_s=60) == 2
    lines = second.output().strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0] == (
        f"serving: invalid setting SERVING_METRICS_DIR: {first.metrics_dir} is in use by "
        f"another server (master pid {first.proc.pid}); give each server its own directory"
    )
    assert first.predict([[1.0]]).status_code == 200
    sent += 1
    assert first.metric('http_requests_total{route="/predict"}') == sent


def _closing_client(
    port: int, stop: threading.Event, outcomes: list[str], killed_at: list[float]
) -> None:
    """Predicts on one keep-alive connection at a time until ``stop``: each outcome is
    ``200``, ``close`` (the answer said it closes), ``late keep-alive`` (a keep-alive
    answer more than 1.5 s after ``killed_at[0]``), ``refused`` or an exception's name."""
    connection: http.client.HTTPConnection | None = None
    while not stop.is_set():
        try:
            if connection is None:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                connection.connect()
            connection.request("POST", "/predict", b'{"instances": [[1.0]]}',
                               {"Content-Type": "application/json"})  # fmt: skip
            response = connection.getresponse()
            response.read()
            closes = response.getheader("Connection", "").lower() == "close"
            late = time.monotonic() > killed_at[0] + 1.5  # the worker has noticed
            outcomes.append("close" if closes else "late keep-alive" if late else "200")
            if closes:
                connection.close()
                connection = None
        except ConnectionRefusedError:
            outcomes.append("refused")
            connection = None
            time.sleep(0.01)
        except (OSError, http.client.HTTPException) as exc:
            outcomes.append(type(exc).__name__)
            if connection is not None:
                connection.close()
            connection = None


def test_workers_whose_master_is_killed_stop_at_once_and_free_the_port(
    gunicorn: Start, pickled: Pickled
) -> None:
    """After a master SIGKILL under load, its workers served keep-alive clients without
    ``Connection: close`` until the graceful timeout (20 s here), then reset them, and held
    the port until then. Now they stop as if told to: every answer says it closes, nothing
    is reset, and they are gone, the port with them, well before the graceful timeout."""
    model = pickled(RowOffset(offset=0.0), "m.pkl")
    server = gunicorn(model_path=model)
    server.wait_ready()
    assert server.proc is not None
    workers = server.worker_pids()
    stop = threading.Event()
    outcomes: list[str] = []
    killed_at = [float("inf")]

    clients = [
        threading.Thread(
            target=_closing_client, args=(server.port, stop, outcomes, killed_at), daemon=True
        )
        for _ in range(8)
    ]
    for client in clients:
        client.start()
    try:
        until(lambda: len(outcomes) > 100, 20, what="traffic")
        killed_at[0] = time.monotonic()
        os.kill(server.proc.pid, signal.SIGKILL)
        until(
            lambda: not any(Path(f"/proc/{pid}").exists() for pid in workers), 10,
            interval_s=0.1, what="the orphaned workers gone",
        )  # fmt: skip
        until(lambda: outcomes.count("refused") >= 8, 10, what="clients refused")
    finally:
        stop.set()
        for client in clients:
            client.join(40)

    unexpected = set(outcomes) - {"200", "close", "refused"}
    assert not unexpected, [o for o in outcomes if o in unexpected][:10]
    assert "close" in outcomes
    with socket.socket() as probe:  # nothing listens on the port (TIME_WAIT aside)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", server.port))
