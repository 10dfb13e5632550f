"""Payload log in-process: settings, sampling, the file sink and counted drops (the HTTP
sinks under Gunicorn are in tests/e2e/test_payload_log.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from pydantic import ValidationError

from serving.observe.metrics import ServingMetrics
from serving.observe.payload_log import PayloadLog, bind
from serving.settings import Settings

ROWS = np.array([[1.0, 2.0, 3.0]])
OUTPUTS = {"predictions": np.array([1])}


def lines_of(directory: Path, count: int, timeout_s: float = 10.0) -> list[dict[str, object]]:
    deadline = time.monotonic() + timeout_s
    while True:
        lines = [line for f in directory.iterdir() for line in f.read_text().splitlines()]
        if len(lines) >= count or time.monotonic() > deadline:
            return [json.loads(line) for line in lines]
        time.sleep(0.02)


def test_payload_log_needs_a_sink_and_is_off_by_default(settings: Settings) -> None:
    assert PayloadLog.from_settings(settings, ServingMetrics(CollectorRegistry())) is None
    with pytest.raises(ValidationError, match="needs SERVING_PAYLOAD_LOG_URL"):
        Settings(payload_log="all")
    with pytest.raises(ValidationError, match="payload_log_url"):
        Settings(payload_log="all", payload_log_url="ftp://example/x")


def test_payload_log_file_records_sampled_requests_only(tmp_path: Path) -> None:
    settings = Settings(payload_log="all", payload_log_url=f"file://{tmp_path}/p.jsonl")
    payloads = PayloadLog(settings, ServingMetrics(CollectorRegistry()))

    bind("skipped", "predict", "/predict", 0.0)
    payloads.record("m", "1", ROWS, OUTPUTS)
    bind("kept", "predict", "/predict", 1.0)
    payloads.record("m", "1", ROWS, OUTPUTS)
    bind("failed", "v2", "/v2/models/{model_name}/infer", 1.0)
    payloads.record("m", "1", ROWS, None)  # a failed request: its request record only
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
    bind("r", "predict", "/predict", 1.0)

    started = time.perf_counter()
    for _ in range(50):
        payloads.record("m", "1", ROWS, OUTPUTS)
    elapsed_s = time.perf_counter() - started

    assert elapsed_s < 0.5
    dropped = metrics.registry.get_sample_value(
        "payload_log_dropped_total", {"reason": "queue_full"}
    )
    assert dropped is not None and dropped >= 40
