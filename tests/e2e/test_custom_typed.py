"""A team's own class with a declared schema (string columns, numbers that may be missing)
and a DataFrame input, under the real Gunicorn on every protocol: each answer equals the
pipeline it wraps, called in-process on the same rows."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import requests
import tritonclient.http as triton

from tests.e2e.server import GunicornServer
from tests.tabular import churn_rows, frame_of, write_churn

COLUMNS = ["plan", "region", "seats", "usage_hours"]


def test_custom_typed_class_answers_as_its_pipeline_on_every_protocol(
    tmp_path: Path, gunicorn: Callable[..., GunicornServer]
) -> None:
    model, _, _ = write_churn(tmp_path)
    server = gunicorn(workers=1, model_class="tests.models:TypedChurn", model_dir=tmp_path)
    server.wait_ready(workers=1)
    rows = churn_rows()  # strings, ints, floats and nulls
    frame = frame_of(rows)
    labels = model.predict(frame).tolist()
    probabilities = model.predict_proba(frame)

    def post(path: str, body: object) -> requests.Response:
        return requests.post(f"{server.url}{path}", json=body, timeout=30)

    predicted = post("/predict", {"instances": rows})
    name = predicted.json()["model_name"]
    tf = post(f"/v1/models/{name}:predict", {"instances": rows})
    split = {"columns": COLUMNS, "data": [[r[c] for c in COLUMNS] for r in rows]}
    mlflow = post("/invocations", {"dataframe_split": split})
    client = triton.InferenceServerClient(url=f"127.0.0.1:{server.port}", network_timeout=30)
    inputs = []
    for column in COLUMNS:
        if column in ("plan", "region"):
            tensor = triton.InferInput(column, [len(rows)], "BYTES")
            tensor.set_data_from_numpy(np.array([r[column] for r in rows], dtype=object))
        else:
            tensor = triton.InferInput(column, [len(rows)], "FP64")
            tensor.set_data_from_numpy(
                np.array([np.nan if r[column] is None else r[column] for r in rows])
            )
        inputs.append(tensor)
    v2 = client.infer(name, inputs)
    client.close()
    unknown = post("/predict", {"instances": [{**rows[0], "plan": "gold"}]})

    assert predicted.status_code == 200, predicted.text
    assert predicted.json()["predictions"] == labels
    np.testing.assert_allclose(predicted.json()["probabilities"], probabilities, rtol=1e-12)
    assert [p["predictions"] for p in tf.json()["predictions"]] == labels, tf.text
    assert mlflow.json()["predictions"] == labels, mlflow.text
    assert v2.as_numpy("predictions").tolist() == labels
    np.testing.assert_allclose(v2.as_numpy("probabilities"), probabilities, rtol=1e-12)
    assert unknown.status_code == 422
    assert "instances[0].plan" in unknown.text and "gold" in unknown.text
