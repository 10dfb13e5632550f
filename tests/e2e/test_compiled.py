"""A scikit-learn forest compiled to ONNX Runtime in each worker under the real Gunicorn
(SERVING_COMPILE): its answers over every protocol are the forest's in-process, and the
engine that answers is shown in /healthz, V2 metadata, the metrics and the log."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from sklearn.ensemble import RandomForestClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from tests.e2e.server import GunicornServer

Start = Callable[..., GunicornServer]
Pickled = Callable[[Any, str], Path]
TOLERANCE = 1e-6  # SERVING_COMPILE_TOLERANCE's default


@pytest.fixture(scope="module")
def forest(breast_cancer: tuple[np.ndarray, np.ndarray]) -> Any:
    X, y = breast_cancer
    model = RandomForestClassifier(n_estimators=60, random_state=0)
    return make_pipeline(StandardScaler(), model).fit(X, y)


def assert_answers(body: dict[str, Any], forest: Any, rows: np.ndarray) -> None:
    np.testing.assert_array_equal(body["predictions"], forest.predict(rows))
    np.testing.assert_allclose(
        body["probabilities"], forest.predict_proba(rows), rtol=0, atol=TOLERANCE
    )


def test_a_compiled_forest_answers_every_protocol_as_in_process_and_says_so(
    gunicorn: Start,
    pickled: Pickled,
    forest: Any,
    breast_cancer: tuple[np.ndarray, np.ndarray],
    cpu_hog: None,
) -> None:
    X, _ = breast_cancer
    noisy = X + np.random.default_rng(0).normal(0, 0.05, X.shape) * X.std(axis=0)
    rows = np.vstack([X, noisy])
    server = gunicorn(model_path=pickled(forest, "forest.pkl"))
    server.wait_ready(timeout_s=120)

    for start in range(0, len(rows), 64):  # both workers answer some
        chunk = rows[start : start + 64]
        response = server.predict(chunk.tolist())
        assert response.status_code == 200, response.text
        assert_answers(response.json(), forest, chunk)
    tensor = {"name": "input-0", "shape": [40, 30], "datatype": "FP64"}
    tensor["data"] = noisy[:40].ravel().tolist()
    v2 = requests.post(
        f"{server.url}/v2/models/forest/infer", json={"inputs": [tensor]}, timeout=10
    )
    tf = requests.post(
        f"{server.url}/v1/models/forest:predict", json={"instances": noisy[40:80].tolist()},
        timeout=10,
    )  # fmt: skip
    health = requests.get(f"{server.url}/healthz", timeout=5).json()
    metadata = requests.get(f"{server.url}/v2/models/forest", timeout=5).json()
    scrape = requests.get(f"{server.url}/metrics", timeout=10).text

    assert v2.status_code == 200, v2.text
    outputs = {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in v2.json()["outputs"]}
    assert_answers(outputs, forest, noisy[:40])
    assert tf.status_code == 200, tf.text
    labels = [p["predictions"] for p in tf.json()["predictions"]]
    np.testing.assert_array_equal(labels, forest.predict(noisy[40:80]))
    assert [m["engine"] for m in health["models"]] == ["onnxruntime"]
    assert metadata["platform"] == "onnxruntime_onnx"
    assert server.metric('inference_duration_seconds_count{engine="onnxruntime"', scrape) > 0
    output = server.output()
    assert output.count("compiled to ONNX Runtime on CPUExecutionProvider") == 2  # per worker
    assert "Traceback" not in output
    assert server.terminate() == 0


def test_compile_off_for_one_model_serves_it_by_scikit_learn_exactly(
    gunicorn: Start,
    pickled: Pickled,
    forest: Any,
    breast_cancer: tuple[np.ndarray, np.ndarray],
    tmp_path: Path,
) -> None:
    X, _ = breast_cancer
    path = pickled(forest, "forest.pkl")
    models = [
        {"name": "plain", "path": str(path), "compile": "off"},
        {"name": "compiled", "path": str(path)},
    ]
    config = tmp_path / "models.json"
    config.write_text(json.dumps(models))
    server = gunicorn(models=config)
    server.wait_ready(workers=4, timeout_s=120)

    plain = requests.post(f"{server.url}/predict/plain", json={"instances": X.tolist()}, timeout=30)
    compiled = requests.post(
        f"{server.url}/predict/compiled", json={"instances": X.tolist()}, timeout=30
    )
    health = requests.get(f"{server.url}/healthz", timeout=5).json()
    platforms = [
        requests.get(f"{server.url}/v2/models/{name}", timeout=5).json()["platform"]
        for name in ("plain", "compiled")
    ]

    assert plain.status_code == 200 and compiled.status_code == 200
    np.testing.assert_array_equal(plain.json()["probabilities"], forest.predict_proba(X))
    assert_answers(compiled.json(), forest, X)
    assert {m["name"]: m["engine"] for m in health["models"]} == {
        "plain": "sklearn",
        "compiled": "onnxruntime",
    }
    assert platforms == ["pickle", "onnxruntime_onnx"]
    assert server.terminate() == 0
