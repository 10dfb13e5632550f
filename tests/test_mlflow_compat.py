"""/invocations answers as a real MLflow 3.x scoring server does, for the same bodies, on
a DataFrame model with a signature. The answers were pinned from one run of
``mlflow models serve`` by tests/fixtures/mlflow/make_answers.py (see its docstring for
how to rerun it); the model is refitted here from the same seeded example, and served
from a folder holding MLflow's own ``MLmodel`` file beside it, as MLflow saves models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import joblib
import pytest
from prometheus_client import CollectorRegistry

from serving.app import create_app
from serving.model.loaders import load_model
from serving.observe.metrics import ServingMetrics
from serving.settings import Settings
from tests.tabular import churn_module

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "mlflow"
PINNED = json.loads((FIXTURES / "answers.json").read_text())


@pytest.fixture(scope="module")
def mlflow_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("mlflow-model")
    joblib.dump(churn_module().churn_pipeline(), folder / "model.pkl")
    (folder / "MLmodel").write_text((FIXTURES / "MLmodel").read_text())
    return folder


def test_mlflow_compat_the_signature_types_the_features_the_pipeline_takes_nulls(
    mlflow_folder: Path, tmp_path: Path
) -> None:
    """``region`` is ``required`` in the signature (no NaN in training), yet the pipeline
    takes a null there: the folder takes the nulls the same model's joblib file takes."""
    handle = load_model(mlflow_folder / "model.pkl", "joblib")
    (tmp_path / "model.pkl").write_bytes((mlflow_folder / "model.pkl").read_bytes())
    alone = load_model(tmp_path / "model.pkl", "joblib")
    kinds = {f.name: (f.kind, f.missing) for f in handle.features or ()}
    assert kinds == {
        "plan": ("string", False), "region": ("string", True),
        "seats": ("float", True), "usage_hours": ("float", True),
    }  # fmt: skip
    assert [f.missing for f in alone.features or ()] == [f.missing for f in handle.features or ()]


@pytest.mark.parametrize("case", PINNED["answers"], ids=lambda case: case["name"])
def test_mlflow_compat_same_answer_as_mlflow_for_the_same_body(
    settings: Settings, mlflow_folder: Path, case: dict[str, Any]
) -> None:
    handle = load_model(mlflow_folder / "model.pkl", "joblib")
    app = create_app(settings, models=[handle], metrics=ServingMetrics(CollectorRegistry()))
    try:
        response = app.test_client().post(
            "/invocations", data=case["body"], content_type=case["type"]
        )
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    if case["status"] == 200:
        assert response.status_code == 200, response.get_data(as_text=True)
        assert response.get_json() == case["answer"]
    else:  # MLflow says 400 for a body its schema refuses; we say 422, same error_code
        assert response.status_code == 422
        body = response.get_json()
        assert body["error_code"] == case["answer"]["error_code"]
        assert "plan" in body["message"] and "plan" in case["answer"]["message"]
