"""An MLflow folder saved with ``pyfunc_predict_fn="predict_proba"``, served by a real
Gunicorn from ``SERVING_MODEL_DIR``: ``/invocations`` answers exactly what
``mlflow.pyfunc.load_model(folder).predict`` answers in-process (the same numbers, in
``{"predictions": ...}``), a null in a column the signature marks ``required`` included;
``/predict`` keeps answering labels."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import requests

from tests.e2e.server import GunicornServer
from tests.tabular import (
    CHURN_SKOPS_TYPES,
    churn_module,
    churn_rows,
    frame_of,
    pyfunc_predict,
    save_with_mlflow,
)

COLUMNS = ["plan", "region", "seats", "usage_hours"]


def test_mlflow_pyfunc_invocations_answer_as_mlflow_pyfunc_in_process(
    tmp_path: Path, gunicorn: Callable[..., GunicornServer]
) -> None:
    churn = churn_module()
    model = churn.churn_pipeline()
    training = churn.churn_frame()[0]
    folder = save_with_mlflow(
        tmp_path / "churn", model, list(CHURN_SKOPS_TYPES), "predict_proba", training
    ).parent
    rows = churn_rows()[:12]
    rows[0]["region"] = None  # `required` in the signature: no NaN in training
    server = gunicorn(model_dir=folder, workers=1, skops_trusted_types=",".join(CHURN_SKOPS_TYPES))
    server.wait_ready(workers=1)

    split = {"columns": COLUMNS, "data": [[row[c] for c in COLUMNS] for row in rows]}
    answered = requests.post(
        f"{server.url}/invocations", json={"dataframe_split": split}, timeout=30
    )
    predicted = requests.post(f"{server.url}/predict", json={"instances": rows}, timeout=30)

    expected = pyfunc_predict(folder, frame_of(rows))
    assert answered.status_code == 200, answered.text
    assert answered.json() == {"predictions": expected}
    assert predicted.status_code == 200, predicted.text
    assert predicted.json()["predictions"] == model.predict(frame_of(rows)).tolist()
