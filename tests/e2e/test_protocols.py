"""TF Serving and MLflow scoring under the real Gunicorn: the same predictions as
``/predict``, over HTTP, for the demo model and a model trained on a DataFrame."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import pandas as pd
import requests

from serving.settings import DEMO_MODEL_PATH
from tests.e2e.server import GunicornServer

Start = Callable[..., GunicornServer]
Pickled = Callable[[Any, str], Path]


def test_tfserving_routes_answer_the_demo_models_predictions_and_classes(
    gunicorn: Start, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    X, _ = breast_cancer
    rows = X[:40].tolist()
    server = gunicorn(workers=1)
    server.wait_ready(workers=1)
    url = f"{server.url}/v1/models/breast_cancer"

    predict = server.predict(rows)
    row_format = requests.post(f"{url}:predict", json={"instances": rows}, timeout=30)
    columnar = requests.post(f"{url}/versions/1:predict", json={"inputs": rows}, timeout=30)
    examples = [{"input-0": row} for row in rows]
    classify = requests.post(f"{url}:classify", json={"examples": examples}, timeout=30)
    status = requests.get(url, timeout=10)
    metadata = requests.get(f"{url}/metadata", timeout=10)
    unknown = requests.post(
        f"{server.url}/v1/models/nope:predict", json={"instances": rows}, timeout=10
    )

    expected = joblib.load(DEMO_MODEL_PATH).predict(X[:40]).tolist()
    assert predict.status_code == row_format.status_code == columnar.status_code == 200
    assert predict.json()["predictions"] == expected
    instances = row_format.json()["predictions"]
    assert [instance["predictions"] for instance in instances] == expected
    assert [instance["probabilities"] for instance in instances] == predict.json()["probabilities"]
    assert columnar.json()["outputs"]["predictions"] == expected
    assert classify.status_code == 200, classify.text
    scores = [[score for _, score in example] for example in classify.json()["result"]]
    assert scores == joblib.load(DEMO_MODEL_PATH).predict_proba(X[:40]).tolist()
    assert {label for example in classify.json()["result"] for label, _ in example} == {"0", "1"}
    assert status.json()["model_version_status"][0]["state"] == "AVAILABLE"
    signature = metadata.json()["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert signature["inputs"]["input-0"]["tensor_shape"]["dim"][1]["size"] == "30"
    assert unknown.status_code == 404 and set(unknown.json()) == {"error", "code"}
    assert server.terminate() == 0


def test_mlflow_invocations_answer_like_predict_with_named_columns_in_any_order(
    gunicorn: Start, pickled: Pickled, frame_classifier: tuple[Any, pd.DataFrame]
) -> None:
    model, X = frame_classifier
    rows = X.iloc[:50]
    shuffled = rows[list(reversed(X.columns))]
    split = shuffled.to_dict("split")
    del split["index"]
    server = gunicorn(workers=1, model_path=pickled(model, "cancer.pkl"), model_name="cancer")
    server.wait_ready(workers=1)
    invocations = f"{server.url}/invocations"

    ping = requests.get(f"{server.url}/ping", timeout=10)
    predict = server.predict(rows.values.tolist())
    as_json = requests.post(invocations, json={"dataframe_split": split}, timeout=30)
    as_csv = requests.post(
        invocations,
        data=shuffled.to_csv(index=False),
        headers={"Content-Type": "text/csv"},
        timeout=30,
    )
    missing = requests.post(
        invocations,
        data=shuffled.drop(columns=["mean area"]).to_csv(index=False),
        headers={"Content-Type": "text/csv"},
        timeout=10,
    )

    expected = model.predict(rows).tolist()
    assert ping.status_code == 200
    assert predict.json()["predictions"] == expected
    assert as_json.status_code == as_csv.status_code == 200, as_json.text + as_csv.text
    assert as_json.json() == as_csv.json() == {"predictions": expected}
    assert missing.status_code == 422
    assert missing.json()["error_code"] == "INVALID_PARAMETER_VALUE"
    assert "missing feature 'mean area'" in missing.json()["message"]
    assert server.terminate() == 0
