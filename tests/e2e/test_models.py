"""SERVING_MODELS under the real Gunicorn: two versions warm in every worker, each request
answered by the version it pinned, each version batched and counted on its own."""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import joblib
import numpy as np
import requests

from serving.settings import DEMO_MODEL_PATH
from tests.e2e.server import GunicornServer

Start = Callable[..., GunicornServer]


def test_two_versions_in_one_server_answer_as_pinned(
    gunicorn: Start, breast_cancer: tuple[np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    X, _ = breast_cancer
    models = [
        {"name": "bc", "version": "joblib-1", "path": str(DEMO_MODEL_PATH)},
        {"name": "bc", "version": "onnx-2", "path": str(DEMO_MODEL_PATH.with_suffix(".onnx")),
         "max_batch_size": 8},
    ]  # fmt: skip
    config = tmp_path / "models.json"
    config.write_text(json.dumps(models))
    server = gunicorn(models=config)
    server.wait_ready(workers=4)  # 2 workers x 2 models, each logs "ready to serve"
    expected = joblib.load(DEMO_MODEL_PATH).predict(X)

    def call(i: int) -> tuple[int, str, int]:
        version = models[i % 2]["version"]
        response = requests.post(
            f"{server.url}/predict",
            json={"instances": [X[i].tolist()], "model_version": version},
            timeout=30,
        )
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["model_version"] == version
        return i, version, body["predictions"][0]

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(call, range(len(X))))

    assert [p for _, _, p in answers] == expected.tolist()  # both versions agree on labels
    health = requests.get(f"{server.url}/healthz", timeout=5).json()
    assert [(m["version"], m["status"]) for m in health["models"]] == [
        ("joblib-1", "ready"), ("onnx-2", "ready")
    ]  # fmt: skip
    scrape = requests.get(f"{server.url}/metrics", timeout=10).text
    for first, version in enumerate(("joblib-1", "onnx-2")):
        rows = server.metric(f'inference_batch_size_sum{{model="bc",version="{version}"}}', scrape)
        assert rows == len(range(first, len(X), 2))  # its own requests' rows, no others
    conflict = requests.post(
        f"{server.url}/predict", json={"instances": [X[0].tolist()], "model_version": "3"},
        timeout=30,
    )  # fmt: skip
    assert conflict.status_code == 409
    assert "serves 'joblib-1, onnx-2'" in conflict.json()["error"]["message"]
