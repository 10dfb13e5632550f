"""An MLflow 3 model folder as MLflow saves it by default (``model.skops``), served by a
real Gunicorn from ``SERVING_MODEL_DIR``: answers equal the pipeline in-process, the model
is named after the folder, and types the operator did not trust stop the start naming
them and the setting."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import requests

from tests.e2e.server import GunicornServer
from tests.tabular import CHURN_SKOPS_TYPES, churn_module, churn_rows, frame_of, save_with_mlflow

COLUMNS = ["plan", "region", "seats", "usage_hours"]


def test_skops_mlflow_folder_serves_as_the_pipeline_answers(
    tmp_path: Path, gunicorn: Callable[..., GunicornServer]
) -> None:
    model = churn_module().churn_pipeline()
    folder = save_with_mlflow(tmp_path / "churn_classifier", model, list(CHURN_SKOPS_TYPES)).parent
    rows = churn_rows()
    frame = frame_of(rows)

    refused = gunicorn(model_dir=folder, workers=1)
    assert refused.wait_exit() != 0
    assert "numpy.dtype" in refused.output()
    assert "SERVING_SKOPS_TRUSTED_TYPES" in refused.output()

    server = gunicorn(model_dir=folder, workers=1, skops_trusted_types="numpy.dtype")
    server.wait_ready(workers=1)
    predicted = requests.post(f"{server.url}/predict", json={"instances": rows}, timeout=30)
    split = requests.post(
        f"{server.url}/invocations",
        json={
            "dataframe_split": {"columns": COLUMNS, "data": [[r[c] for c in COLUMNS] for r in rows]}
        },
        timeout=30,
    )

    assert predicted.status_code == 200, predicted.text
    body = predicted.json()
    assert body["model_name"] == "churn_classifier"
    assert body["predictions"] == model.predict(frame).tolist()
    np.testing.assert_allclose(body["probabilities"], model.predict_proba(frame), rtol=1e-12)
    assert split.status_code == 200, split.text
    assert split.json()["predictions"] == model.predict(frame).tolist()
