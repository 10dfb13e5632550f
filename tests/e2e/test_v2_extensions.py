"""KServe V2 statistics, model configuration and repository extensions under the real
Gunicorn (two workers), read by the real ``tritonclient[http]``: the statistics are the sum
over both workers of what this test sent."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import joblib
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from serving.settings import DEMO_MODEL_PATH
from tests.e2e.server import GunicornServer
from tests.waiting import until

MODELS = [
    {"name": "breast_cancer", "version": "1", "path": str(DEMO_MODEL_PATH)},
    {"name": "breast_cancer", "version": "2", "path": str(DEMO_MODEL_PATH)},
    {"name": "onnx", "version": "1", "path": str(DEMO_MODEL_PATH.with_suffix(".onnx"))},
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GunicornServer]:
    """Two workers, three model versions each (6 "ready to serve" lines)."""
    tmp_path = tmp_path_factory.mktemp("v2ext")
    settings = {
        "workers": 2,
        "models": json.dumps(MODELS),
        "max_batch_size": 16,
        "batch_policy": "window",
        "max_batch_latency_ms": 2,
    }
    server = GunicornServer(tmp_path, **settings).start()
    try:
        server.wait_ready(workers=6)
        yield server
    finally:
        server.kill()


def client_of(server: GunicornServer) -> Any:
    return triton.InferenceServerClient(url=f"127.0.0.1:{server.port}", network_timeout=30)


def test_tritonclient_statistics_sum_every_request_over_both_workers(
    server: GunicornServer, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    X, _ = breast_cancer
    sizes = [1, 2, 3, 4] * 10  # 40 requests, 100 instances

    def send(size: int) -> None:
        client = client_of(server)
        rows = X[:size]
        tensor = triton.InferInput("input-0", list(rows.shape), "FP64")
        tensor.set_data_from_numpy(rows)
        result = client.infer("breast_cancer", [tensor], model_version="2")
        pipeline = joblib.load(DEMO_MODEL_PATH)
        np.testing.assert_array_equal(result.as_numpy("predictions"), pipeline.predict(rows))
        client.close()

    # Both workers must answer some (each writes its own summary file at its first
    # answered batch): the kernel hands new connections to whichever worker accepts
    # first, and on a busy machine one took ten rounds in a row.
    pids = server.worker_pids()
    summaries = {f"summary_{pid}.db" for pid in pids}
    sent: list[int] = []

    def both_answered_after_a_round() -> bool:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(send, sizes))
        sent.extend(sizes)
        return summaries <= {path.name for path in server.metrics_dir.iterdir()}

    until(both_answered_after_a_round, 120, interval_s=0, what="both workers answering")
    client = client_of(server)
    bad = triton.InferInput("input-0", [1, 29], "FP64")
    bad.set_data_from_numpy(X[:1, :29])
    with pytest.raises(InferenceServerException):
        client.infer("breast_cancer", [bad], model_version="2")

    (stats,) = client.get_inference_statistics("breast_cancer", "2")["model_stats"]
    every = client.get_inference_statistics()["model_stats"]
    by_name = client.get_inference_statistics("breast_cancer")["model_stats"]
    client.close()

    # Both workers answered some of them, and the counts below are of every request sent:
    # the statistics are the sum over the workers.
    written = {path.name for path in server.metrics_dir.iterdir()}
    assert len(pids) == 2 and summaries <= written, written
    assert (stats["name"], stats["version"]) == ("breast_cancer", "2")
    assert stats["inference_count"] == sum(sent)
    infer_stats = stats["inference_stats"]
    assert infer_stats["success"]["count"] == len(sent)
    assert infer_stats["fail"]["count"] == 1
    for stage in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert infer_stats[stage]["count"] == len(sent), stage  # the successful, as Triton
    assert infer_stats["success"]["ns"] >= infer_stats["compute_infer"]["ns"] > 0
    batches = stats["batch_stats"]
    assert sum(b["compute_infer"]["count"] for b in batches) == stats["execution_count"]
    assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in batches) == sum(sent)
    assert all(1 <= b["batch_size"] <= 16 for b in batches)
    assert stats["last_inference"] > 0
    assert [(s["name"], s["version"]) for s in every] == [
        ("breast_cancer", "1"), ("breast_cancer", "2"), ("onnx", "1")
    ]  # fmt: skip
    assert every[0]["inference_count"] == 0 and every[1] == stats
    assert [s["version"] for s in by_name] == ["1", "2"]


def test_tritonclient_model_config_tells_batching_and_tensors(server: GunicornServer) -> None:
    client = client_of(server)
    config = client.get_model_config("onnx")
    versioned = client.get_model_config("breast_cancer", model_version="2")
    with pytest.raises(InferenceServerException) as missing:
        client.get_model_config("nope")
    client.close()

    assert (config["name"], config["platform"], config["max_batch_size"]) == (
        "onnx", "onnxruntime_onnx", 16
    )  # fmt: skip
    assert config["input"] == [{"name": "X", "data_type": "TYPE_FP32", "dims": [30]}]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [
        ("predictions", "TYPE_INT64", [1]),
        ("probabilities", "TYPE_FP32", [2]),
    ]
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
    assert config["instance_group"][0]["count"] == 2
    assert versioned["input"] == [{"name": "input-0", "data_type": "TYPE_FP64", "dims": [30]}]
    assert missing.value.status() == "404"


def test_tritonclient_repository_index_lists_every_version(server: GunicornServer) -> None:
    client = client_of(server)
    index = client.get_model_repository_index()
    metadata = client.get_server_metadata()
    client.close()

    assert [(m["name"], m["version"], m["state"]) for m in index] == [
        ("breast_cancer", "1", "READY"), ("breast_cancer", "2", "READY"), ("onnx", "1", "READY")
    ]  # fmt: skip
    assert {"statistics", "model_configuration", "model_repository"} <= set(metadata["extensions"])
