"""TF Serving version labels under the real Gunicorn: ``/v1/models/{name}/labels/{label}``
predicts, reports status and metadata with the version the label names in
``SERVING_MODELS``."""

from __future__ import annotations

import json
from collections.abc import Callable

import joblib
import numpy as np
import requests

from serving.settings import DEMO_MODEL_PATH
from tests.e2e.server import GunicornServer

Start = Callable[..., GunicornServer]


def test_tf_labels_route_each_request_to_the_version_they_name(
    gunicorn: Start, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    X, _ = breast_cancer
    labels = {"stable": "1", "canary": "2"}
    models = [
        {"name": "bc", "version": "1", "path": str(DEMO_MODEL_PATH), "labels": labels},
        {"name": "bc", "version": "2", "path": str(DEMO_MODEL_PATH.with_suffix(".onnx"))},
    ]
    server = gunicorn(models=json.dumps(models), workers=1)
    server.wait_ready(workers=2)
    url = f"{server.url}/v1/models/bc/labels"
    pipeline = joblib.load(DEMO_MODEL_PATH)

    stable = requests.post(f"{url}/stable:predict", json={"instances": X[:3].tolist()}, timeout=30)
    canary = requests.post(f"{url}/canary:predict", json={"inputs": X[:5].tolist()}, timeout=30)
    status = requests.get(f"{url}/canary", timeout=10)
    metadata = requests.get(f"{url}/stable/metadata", timeout=10)
    unknown = requests.post(f"{url}/beta:predict", json={"instances": X[:1].tolist()}, timeout=30)
    no_model = requests.get(f"{server.url}/v1/models/nope/labels/stable", timeout=10)

    assert stable.status_code == 200, stable.text
    assert [row["predictions"] for row in stable.json()["predictions"]] == (
        pipeline.predict(X[:3]).tolist()
    )
    assert canary.status_code == 200, canary.text
    assert canary.json()["outputs"]["predictions"] == pipeline.predict(X[:5]).tolist()
    scrape = requests.get(f"{server.url}/metrics", timeout=10).text
    assert server.metric('inference_batch_size_sum{model="bc",version="1"}', scrape) == 3
    assert server.metric('inference_batch_size_sum{model="bc",version="2"}', scrape) == 5
    assert [v["version"] for v in status.json()["model_version_status"]] == ["2"]
    assert metadata.json()["model_spec"]["version"] == "1"
    assert unknown.status_code == 404
    assert unknown.json() == {
        "error": "model 'bc' has no version label 'beta' (its labels: canary, stable)",
        "code": "label_not_found",
    }
    assert (no_model.status_code, no_model.json()["code"]) == (404, "model_not_found")
