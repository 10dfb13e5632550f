"""Payload log in-process: settings, sampling, the file sink and counted drops (the HTTP
sinks under Gunicorn are in tests/e2e/test_payload_log.py)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from serving.cache import ModelCache
from serving.context import Call
from serving.dataplane import DataPlane
from serving.inputs.instances import Frame
from serving.model.handle import ModelHandle
from serving.observe.metrics import ServingMetrics
from serving.observe.payload_log import PayloadLog
from serving.runtime import ModelRuntime
from serving.settings import Settings
from tests.waiting import until

ROWS = np.array([[1.0, 2.0, 3.0]])
OUTPUTS = {"predictions": np.array([1])}


def call_of(request_id: str, protocol: str = "predict", route: str = "/predict") -> Call:
    """A sampled call: its records go to the payload log."""
    return Call(request_id, time.monotonic() + 30, protocol, route, sampled=True)


def lines_of(directory: Path, count: int, timeout_s: float = 10.0) -> list[dict[str, object]]:
    def lines() -> list[str]:
        return [line for f in directory.iterdir() for line in f.read_text().splitlines()]

    with contextlib.suppress(AssertionError):  # fewer: the caller's assertions say which
        until(lambda: len(lines()) >= count, timeout_s)
    return [json.loads(line) for line in lines()]


def test_payload_log_needs_a_sink_and_is_off_by_default(settings: Settings) -> None:
    assert PayloadLog.from_settings(settings, ServingMetrics(CollectorRegistry())) is None
    with pytest.raises(ValidationError, match="needs SERVING_PAYLOAD_LOG_URL"):
        Settings(payload_log="all")
    with pytest.raises(ValidationError, match="payload_log_url"):
        Settings(payload_log="all", payload_log_url="ftp://example/x")


def test_payload_log_sampling_is_drawn_once_per_call_by_the_data_plane(
    tmp_path: Path,
) -> None:
    metrics = ServingMetrics(CollectorRegistry())
    url = f"file://{tmp_path}/p.jsonl"

    def calls(**settings: Any) -> list[bool]:
        plane = DataPlane(Settings(**settings), metrics, lambda: None)  # type: ignore[arg-type,return-value]
        return [plane.call(str(i)).sampled for i in range(200)]

    assert not any(calls())  # payload logging off
    assert not any(calls(payload_log="all", payload_log_url=url, payload_log_sample=0.0))
    assert all(calls(payload_log="all", payload_log_url=url, payload_log_sample=1.0))
    half = calls(payload_log="all", payload_log_url=url, payload_log_sample=0.5)
    assert 40 < sum(half) < 160  # binomial(200, 0.5): outside is a 1e-17 chance


def test_payload_log_file_records_a_calls_request_and_response(tmp_path: Path) -> None:
    settings = Settings(payload_log="all", payload_log_url=f"file://{tmp_path}/p.jsonl")
    payloads = PayloadLog(settings, ServingMetrics(CollectorRegistry()))

    payloads.record(call_of("kept"), "m", "1", ROWS, OUTPUTS)
    failed = call_of("failed", "v2", "/v2/models/{model_name}/infer")
    payloads.record(failed, "m", "1", ROWS, None)  # a failed request: its request record only
    records = lines_of(tmp_path, 3)
    payloads.stop(5)

    assert [(r["id"], r["type"]) for r in records] == [
        ("kept", "org.kubeflow.serving.inference.request"),
        ("kept", "org.kubeflow.serving.inference.response"),
        ("failed", "org.kubeflow.serving.inference.request"),
    ]
    assert records[0]["data"] == {"model_name": "m", "model_version": "1", "instances": [[1, 2, 3]]}
    assert records[1]["data"]["outputs"] == {"predictions": [1]}  # type: ignore[index]
    assert records[2]["endpoint"] == "/v2/models/{model_name}/infer"


def test_payload_log_full_queue_drops_and_counts_without_waiting(tmp_path: Path) -> None:
    settings = Settings(
        payload_log="request",
        payload_log_url="http://127.0.0.1:9/never",  # the discard port: nothing answers
        payload_log_queue_size=1,
        payload_log_retries=0,
    )
    metrics = ServingMetrics(CollectorRegistry())
    payloads = PayloadLog(settings, metrics)
    call = call_of("r")

    started = time.perf_counter()
    for _ in range(50):
        payloads.record(call, "m", "1", ROWS, OUTPUTS)
    elapsed_s = time.perf_counter() - started

    payloads.stop(5)
    assert elapsed_s < 0.5
    dropped = metrics.registry.get_sample_value(
        "payload_log_dropped_total", {"reason": "queue_full"}
    )
    assert dropped is not None and dropped >= 40


def test_payload_log_records_left_when_the_worker_stops_are_counted(
    hung_sink: socket.socket,
) -> None:
    """Found by the attack: with a hung sink, ~8,100 records queued at SIGTERM vanished
    with no count and no line. Each record is now sent, or counted in one reason."""
    settings = Settings(
        payload_log="request",
        payload_log_url=f"http://127.0.0.1:{hung_sink.getsockname()[1]}/events",
        payload_log_timeout_ms=60_000,
        payload_log_retries=0,
    )
    metrics = ServingMetrics(CollectorRegistry())
    payloads = PayloadLog(settings, metrics)
    for i in range(20):
        payloads.record(call_of(str(i)), "m", "1", ROWS, None)

    payloads.stop(0.2)  # the sender is stuck on its first post

    stopped = metrics.registry.get_sample_value("payload_log_dropped_total", {"reason": "stopped"})
    assert stopped == 19  # the one being sent is the sink's to fail; the rest counted
    assert payloads.held_bytes == ROWS.nbytes  # only the record in flight is still held


@pytest.fixture
def hung_sink() -> Iterator[socket.socket]:
    """A listening socket that accepts connections (the kernel's backlog) and never
    answers: a post to it waits for its whole timeout, until the socket is closed."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    yield server
    server.close()


def test_payload_log_queue_is_bounded_in_bytes_and_drops_are_counted(
    hung_sink: socket.socket,
) -> None:
    # Reported: a hung sink and 437 requests of 2 MB rows took a worker from 177 MB to
    # 1,081 MB, the queue counting records (10,000), not bytes.
    record_bytes = 2048 * 32 * 8  # 512 KiB of float64 rows per record
    settings = Settings(
        payload_log="request",
        payload_log_url=f"http://127.0.0.1:{hung_sink.getsockname()[1]}/events",
        payload_log_timeout_ms=60_000,
        payload_log_retries=0,
        payload_log_queue_bytes=4 * 2**20,
    )
    metrics = ServingMetrics(CollectorRegistry())
    payloads = PayloadLog(settings, metrics)
    call = call_of("r")

    tracemalloc.start()
    try:
        held_before, _ = tracemalloc.get_traced_memory()
        for i in range(100):  # 50 MiB of rows, each record its own array
            payloads.record(call, "m", "1", np.full((2048, 32), float(i)), None)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    # The queue's 4 MiB, and the record being sent: its rows, and its JSON being built
    # (Python floats and their text: about 6 times the rows' bytes).
    assert held - held_before < 4 * 2**20 + 8 * record_bytes
    assert payloads.held_bytes <= 4 * 2**20
    sample = metrics.registry.get_sample_value
    dropped = sample("payload_log_dropped_total", {"reason": "queue_full"})
    dropped_bytes = sample("payload_log_dropped_bytes_total", {"reason": "queue_full"})
    assert dropped is not None and dropped >= 100 - 9
    assert dropped_bytes == dropped * record_bytes
    hung_sink.close()  # the posts fail at once now: the queue drains
    payloads.stop(10)


def drops(metrics: ServingMetrics, reason: str, count: int, timeout_s: float = 10.0) -> float:
    """``payload_log_dropped_total{reason}`` once it reached ``count`` (or the timeout)."""

    def value() -> float:
        labels = {"reason": reason}
        return metrics.registry.get_sample_value("payload_log_dropped_total", labels) or 0

    with contextlib.suppress(AssertionError):  # fewer: the caller's assertions say how many
        until(lambda: value() >= count, timeout_s)
    return value()


def test_payload_log_removed_directory_drops_counts_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Reported: a payload log file that cannot be opened made every /predict a 500.
    directory = tmp_path / "payloads"
    directory.mkdir()
    settings = Settings(payload_log="all", payload_log_url=f"file://{directory}/p.jsonl")
    metrics = ServingMetrics(CollectorRegistry())
    payloads = PayloadLog(settings, metrics)
    directory.rmdir()
    call = call_of("r")

    with caplog.at_level(logging.WARNING, "serving.observe.payload_log"):
        for _ in range(50):
            payloads.record(call, "m", "1", ROWS, OUTPUTS)  # never raises
        assert drops(metrics, "sink_error", 100) == 100
        payloads.stop(5)

    said = [r for r in caplog.records if r.name == "serving.observe.payload_log"]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert said[0].exc_info is None and str(directory) in said[0].getMessage()


def test_payload_log_full_disk_drops_without_tracebacks_then_recovers(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # Reported: each record lost to a full disk printed a full traceback (2.2 MB of
    # stderr for 300 requests). /dev/full is a real full device: every write is ENOSPC.
    settings = Settings(payload_log="request", payload_log_url=f"file://{tmp_path}/p.jsonl")
    own = tmp_path / f"p-{os.getpid()}.jsonl"  # this process's file
    own.symlink_to("/dev/full")
    metrics = ServingMetrics(CollectorRegistry())
    payloads = PayloadLog(settings, metrics)
    call = call_of("full")

    with caplog.at_level(logging.WARNING, "serving.observe.payload_log"):
        for _ in range(30):
            payloads.record(call, "m", "1", ROWS, OUTPUTS)
        assert drops(metrics, "sink_error", 30) == 30
        own.unlink()  # space again: the next record goes to a new file
        call = call_of("later")
        for _ in range(3):
            payloads.record(call, "m", "1", ROWS, OUTPUTS)
        records = lines_of(tmp_path, 3)
        payloads.stop(5)

    assert [r["id"] for r in records] == ["later"] * 3
    assert "Traceback" not in capfd.readouterr().err
    said = [r.getMessage() for r in caplog.records if r.name == "serving.observe.payload_log"]
    assert len(said) == 2 and "No space left" in said[0], said  # dropping; writing again
    assert drops(metrics, "sink_error", 30) == 30


def test_payload_log_records_what_the_client_sent_when_the_model_writes_into_its_input(
    tmp_path: Path,
) -> None:
    # Reported: the payload log recorded the input after the model mutated it.
    def predict(rows: Any) -> Any:
        rows *= -1  # a model that scales its input in place
        return rows[:, 0].copy()

    handle = ModelHandle.from_callable(predict, name="mutates", version="1", n_features=3)
    settings = Settings(payload_log="request", payload_log_url=f"file://{tmp_path}/p.jsonl")
    metrics = ServingMetrics(CollectorRegistry())
    runtime = ModelRuntime(settings.model_settings()[0], metrics)
    runtime.load(handle)
    cache = ModelCache([runtime])
    plane = DataPlane(settings, metrics, lambda: cache)
    try:
        call = plane.call("mutated", protocol="predict", route="/predict")
        answer = plane.infer(call, None, None, Frame([[1.0, 2.0, 3.0]]))
        assert answer.outputs["predictions"].tolist() == [-1.0]
        records = lines_of(tmp_path, 1)
    finally:
        cache.stop(timeout_s=10)
        if plane.payloads is not None:
            plane.payloads.stop(5)
    assert records[0]["data"]["instances"] == [[1.0, 2.0, 3.0]]  # type: ignore[index]


def test_payload_log_file_sink_that_cannot_be_written_is_refused_naming_the_path() -> None:
    from serving.errors import SettingsError
    from serving.observe.payload_sinks import check_sink

    for url, why in [
        ("file:///no/such/dir/p.jsonl", "No such file or directory"),
        ("file:///sys/p.jsonl", "Permission denied"),  # even for root
    ]:
        settings = Settings(payload_log="request", payload_log_url=url)
        with pytest.raises(SettingsError, match=why) as raised:
            check_sink(settings)
        assert raised.value.variable == "SERVING_PAYLOAD_LOG_URL"
        assert url.removeprefix("file://") in raised.value.problem
    check_sink(Settings(payload_log="off", payload_log_url="file:///no/such/dir/p.jsonl"))
