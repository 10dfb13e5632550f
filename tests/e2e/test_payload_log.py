"""Payload logging under the real Gunicorn (two workers) to sinks on loopback: a CloudEvents
HTTP receiver parsing with the ``cloudevents`` SDK, and rotated JSON-line files. Every
answered request is logged exactly once (sample 1), request and response tied by the
request id; a slow or dead sink changes no answer, and drops are counted."""

from __future__ import annotations

import json
import socket
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import pytest
import requests
from cloudevents.core.bindings.http import HTTPMessage, from_structured_event

from serving.settings import DEMO_MODEL_PATH
from tests.e2e.server import GunicornServer
from tests.e2e.sinks import CloudEventSink
from tests.waiting import until

Start = Callable[..., GunicornServer]
KEY = "payload-log-test-key-0123456789"


def send_every_protocol(server: GunicornServer, X: np.ndarray, count: int) -> dict[str, Any]:
    """``count`` requests spread over /predict, V2, TF Serving and MLflow, 1-3 rows each,
    8 at a time; returns request id -> (rows sent, predictions answered)."""
    auth = {"Authorization": f"Bearer {KEY}"}

    def call(i: int) -> tuple[str, Any, Any]:
        rows = X[i : i + 1 + i % 3]
        request_id = f"req-{i}"
        headers = {**auth, "X-Request-ID": request_id}
        kind = i % 4
        if kind == 0:
            url, body = "/predict", {"instances": rows.tolist()}
        elif kind == 1:
            url = "/v2/models/breast_cancer/infer"
            tensor = {"name": "input-0", "shape": list(rows.shape), "datatype": "FP64"}
            body = {"inputs": [{**tensor, "data": rows.ravel().tolist()}]}
        elif kind == 2:
            url, body = "/v1/models/breast_cancer:predict", {"inputs": rows.tolist()}
        else:
            url, body = "/invocations", {"instances": rows.tolist()}
        response = requests.post(server.url + url, json=body, headers=headers, timeout=30)
        assert response.status_code == 200, response.text
        answer = response.json()
        if kind == 1:
            predictions = answer["outputs"][0]["data"]
        elif kind == 2:
            predictions = answer["outputs"]["predictions"]
        else:
            predictions = answer["predictions"]
        return request_id, rows, predictions

    with ThreadPoolExecutor(8) as pool:
        return {rid: (rows, pred) for rid, rows, pred in pool.map(call, range(count))}


@pytest.mark.parametrize("mode", ["binary", "structured"])
def test_payload_log_sends_each_request_and_response_once_as_cloudevents(
    gunicorn: Start, breast_cancer: tuple[np.ndarray, np.ndarray], mode: str
) -> None:
    X, _ = breast_cancer
    pipeline = joblib.load(DEMO_MODEL_PATH)
    with CloudEventSink() as sink:
        server = gunicorn(
            payload_log="all", payload_log_url=sink.url, payload_log_mode=mode, api_keys=KEY
        )
        server.wait_ready()
        sent = send_every_protocol(server, X, 40)
        events = sink.wait_for(80)
        assert server.terminate() == 0  # a stopped server sends nothing more
        assert len(sink.events) == 80

    for rows, predictions in sent.values():
        assert predictions == pipeline.predict(rows).tolist()
    kinds = Counter((e.get_id(), e.get_type()) for e in events)
    assert set(kinds.values()) == {1}
    assert {rid for rid, _ in kinds} == set(sent)
    for event in events:
        rows, predictions = sent[event.get_id()]
        data = event.get_data()
        assert event.get_source().startswith("/serving/")
        assert event.get_extension("inferenceservicename") == "breast_cancer"
        assert (data["model_name"], data["model_version"]) == ("breast_cancer", "1")
        if event.get_type() == "org.kubeflow.serving.inference.request":
            np.testing.assert_array_equal(np.array(data["instances"]), rows)
        else:
            assert event.get_type() == "org.kubeflow.serving.inference.response"
            assert data["outputs"]["predictions"] == predictions
            np.testing.assert_allclose(
                data["outputs"]["probabilities"], pipeline.predict_proba(rows)
            )
    protocols = {e.get_extension("protocol") for e in events}
    assert protocols == {"predict", "v2", "tfserving", "mlflow"}
    raw = b"".join(json.dumps(h).encode() + body for h, body in sink.raw)
    assert KEY.encode() not in raw and b"Bearer" not in raw
    headers = [{k.lower(): v for k, v in h.items()} for h, _ in sink.raw]
    if mode == "binary":
        assert all(h["ce-id"].startswith("req-") for h in headers)
    else:
        assert all("cloudevents+json" in h["content-type"] for h in headers)


def test_payload_log_file_sink_writes_a_line_per_record_and_rotates(
    gunicorn: Start, breast_cancer: tuple[np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    X, _ = breast_cancer
    path = tmp_path / "payloads" / "log.jsonl"
    path.parent.mkdir()
    server = gunicorn(
        payload_log="request",
        payload_log_url=f"file://{path}",
        payload_log_file_max_bytes=4096,
        payload_log_file_backups=100,
        api_keys=KEY,
    )
    server.wait_ready()
    sent = send_every_protocol(server, X, 40)

    def written() -> list[str]:
        try:
            files = path.parent.iterdir()
            return [line for file in files for line in file.read_text().splitlines()]
        except FileNotFoundError:  # rotated (renamed) between the listing and the read
            return []

    lines = until(lambda: f if len(f := written()) >= 40 else [], 30, what="40 lines")

    assert len(lines) == 40
    files = {file.name for file in path.parent.iterdir()}
    assert any(name.endswith(".jsonl.1") for name in files), files  # rotated at 4 KiB
    assert all(name.startswith("log-") for name in files)
    events = [from_structured_event(HTTPMessage(headers={}, body=line.encode())) for line in lines]
    assert sorted(e.get_id() for e in events) == sorted(sent)
    for event in events:
        assert event.get_type() == "org.kubeflow.serving.inference.request"
        rows, _ = sent[event.get_id()]
        np.testing.assert_array_equal(np.array(event.get_data()["instances"]), rows)


def test_payload_log_slow_or_dead_sink_changes_no_answer_and_drops_are_counted(
    gunicorn: Start, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    X, _ = breast_cancer
    pipeline = joblib.load(DEMO_MODEL_PATH)
    with CloudEventSink(delay_s=2.0) as slow:
        dead = CloudEventSink()
        dead_url = dead.url
        dead.server.server_close()  # nothing listens there any more
        servers = {
            name: gunicorn(
                payload_log="all",
                payload_log_url=url,
                payload_log_queue_size=4,
                payload_log_retries=1,
                api_keys=KEY,
            )
            for name, url in (("slow", slow.url), ("dead", dead_url))
        }
        for server in servers.values():
            server.wait_ready()
        for name, server in servers.items():
            started = time.perf_counter()
            sent = send_every_protocol(server, X, 60)
            elapsed_s = time.perf_counter() - started
            for rows, predictions in sent.values():
                assert predictions == pipeline.predict(rows).tolist()
            # 60 requests 8 at a time: well under one 2 s post of the slow sink each.
            assert elapsed_s < 10, (name, elapsed_s)
            dropped = server.metric('payload_log_dropped_total{reason="queue_full"}')
            assert dropped > 0, name


@pytest.mark.parametrize(
    "path, reason",
    [("/no/such/dir/p.jsonl", "No such file or directory"), ("/sys/p.jsonl", "Permission denied")],
)
def test_payload_log_file_that_cannot_be_written_stops_start_up_naming_it(
    gunicorn: Start, path: str, reason: str
) -> None:
    # Reported: every /predict answered 500 while /healthz said 200.
    server = gunicorn(payload_log="request", payload_log_url=f"file://{path}")
    assert server.wait_exit(30) == 2
    lines = server.output().strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("serving: invalid setting SERVING_PAYLOAD_LOG_URL: ")
    assert path in lines[0] and reason in lines[0]


def test_payload_log_full_disk_changes_no_answer_and_is_said_once_per_worker(
    gunicorn: Start, breast_cancer: tuple[np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    # Reported: each record lost to a full disk printed a traceback (2.2 MB of stderr for
    # 300 requests). Each worker's file is /dev/full, a real full device (ENOSPC).
    X, _ = breast_cancer
    pipeline = joblib.load(DEMO_MODEL_PATH)
    directory = tmp_path / "payloads"
    directory.mkdir()
    server = gunicorn(
        payload_log="all", payload_log_url=f"file://{directory}/log.jsonl", api_keys=KEY
    )
    server.wait_ready()
    for pid in server.worker_pids():  # each opens its file at its first record
        (directory / f"log-{pid}.jsonl").symlink_to("/dev/full")

    sent = send_every_protocol(server, X, 100)

    for rows, predictions in sent.values():
        assert predictions == pipeline.predict(rows).tolist()
    until(
        lambda: server.metric('payload_log_dropped_total{reason="sink_error"}') >= 200, 30,
        interval_s=0.1, what=lambda: f"200 drops:\n{server.output()}",
    )  # fmt: skip
    output = server.output()
    assert output.count("Traceback") == 0, f"{len(output)} bytes of output"
    assert server.metric('payload_log_dropped_bytes_total{reason="sink_error"}') > 0
    said = [line for line in output.splitlines() if "payload log records" in line]
    assert 1 <= len(said) <= 2 and all("No space left on device" in s for s in said), said


def test_payload_log_hung_sink_holds_at_most_its_queue_bytes(
    gunicorn: Start, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    # Reported: a hung sink and 437 requests of 2 MB rows took a worker from 177 MB to
    # 1,081 MB: the queue counted records (10,000), not bytes.
    X, _ = breast_cancer
    pipeline = joblib.load(DEMO_MODEL_PATH)
    hung = socket.socket()  # accepts (the kernel's backlog), never answers
    hung.bind(("127.0.0.1", 0))
    hung.listen(64)
    try:
        server = gunicorn(
            payload_log="request",
            payload_log_url=f"http://127.0.0.1:{hung.getsockname()[1]}/events",
            payload_log_timeout_ms=60_000,
            payload_log_queue_bytes=1024 * 1024,
            max_instances_per_request=512,
        )
        server.wait_ready()
        rows = np.tile(X, (1, 1))[:512]  # 512 x 30 float64: 120 KiB a record
        for _ in range(40):  # 4.7 MiB of records for two workers holding 1 MiB each
            response = server.predict(rows.tolist())
            assert response.json()["predictions"] == pipeline.predict(rows).tolist()
        dropped = server.metric('payload_log_dropped_bytes_total{reason="queue_full"}')
    finally:
        hung.close()
    assert dropped >= 40 * rows.nbytes - 2 * 1024 * 1024 - 2 * rows.nbytes
