"""An MLflow folder answers as ``mlflow.pyfunc.load_model(folder).predict`` does: its
``MLmodel``'s ``predict_fn`` (``predict_proba``) chooses what ``/invocations`` answers, and
the signature's ``required`` (a column without NaN in training) does not refuse a null the
pipeline takes: the folder takes the values its joblib file takes, on every route."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import pandas as pd
import pytest
import yaml
from flask.testing import FlaskClient
from prometheus_client import CollectorRegistry

from serving.app import create_app
from serving.errors import ModelLoadError
from serving.model.handle import ModelHandle
from serving.model.loaders import default_loaders, load_model
from serving.model.mlmodel import pyfunc_output
from serving.observe.metrics import ServingMetrics
from serving.settings import Settings
from tests.tabular import (
    CHURN_SKOPS_TYPES,
    churn_module,
    churn_rows,
    frame_of,
    pyfunc_predict,
    save_with_mlflow,
)

COLUMNS = ["plan", "region", "seats", "usage_hours"]
TRUSTED = list(CHURN_SKOPS_TYPES)


def some_rows() -> list[dict[str, Any]]:
    """The first 12 of ``churn_rows()`` (nulls, an unknown region), within the test
    settings' instances per request."""
    return churn_rows()[:12]


def rows_with_null_regions() -> list[dict[str, Any]]:
    """``churn_rows()`` with nulls in ``region``, a column the training data (and so the
    signature) has no NaN in, and its ``OneHotEncoder(handle_unknown="ignore")`` takes."""
    rows = some_rows()
    rows[0]["region"] = rows[5]["region"] = None
    return rows


def split(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "dataframe_split": {"columns": COLUMNS, "data": [[r[c] for c in COLUMNS] for r in rows]}
    }


@pytest.fixture(scope="module")
def churn() -> Any:
    return churn_module().churn_pipeline()


def save(folder: Path, model: Any, predict_fn: str) -> Path:
    """``model`` saved by MLflow, its signature inferred from the training data."""
    return save_with_mlflow(folder, model, TRUSTED, predict_fn, churn_module().churn_frame()[0])


@pytest.fixture(scope="module")
def proba_folder(tmp_path_factory: pytest.TempPathFactory, churn: Any) -> Path:
    return save(tmp_path_factory.mktemp("proba") / "churn", churn, "predict_proba")


@pytest.fixture(scope="module")
def label_folder(tmp_path_factory: pytest.TempPathFactory, churn: Any) -> Path:
    return save(tmp_path_factory.mktemp("labels") / "churn", churn, "predict")


def client_of(settings: Settings, handle: ModelHandle) -> Iterator[FlaskClient]:
    app = create_app(settings, models=[handle], metrics=ServingMetrics(CollectorRegistry()))
    try:
        yield app.test_client()
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)


def in_process(folder: Path, rows: list[dict[str, Any]]) -> Any:
    """``mlflow.pyfunc.load_model(folder).predict`` on ``rows``, as JSON would carry it."""
    return pyfunc_predict(folder, frame_of(rows))


def test_mlflow_pyfunc_predict_proba_folder_answers_probabilities_as_mlflow(
    settings: Settings, proba_folder: Path, churn: Any
) -> None:
    """``/invocations`` answers ``predict_proba`` as MLflow does; ``/predict`` its labels."""
    handle = load_model(proba_folder, loaders=default_loaders(skops_trusted_types=TRUSTED))
    rows = some_rows()
    for client in client_of(settings, handle):
        answered = client.post("/invocations", json=split(rows))
        predicted = client.post("/predict", json={"instances": rows})

    assert handle.pyfunc_output == "probabilities"
    assert answered.status_code == 200, answered.get_data(as_text=True)
    assert answered.get_json() == {"predictions": in_process(proba_folder.parent, rows)}
    assert np.shape(answered.get_json()["predictions"]) == (len(rows), 2)
    assert predicted.get_json()["predictions"] == churn.predict(frame_of(rows)).tolist()


def test_mlflow_pyfunc_folder_without_predict_fn_answers_labels(
    settings: Settings, label_folder: Path
) -> None:
    handle = load_model(label_folder, loaders=default_loaders(skops_trusted_types=TRUSTED))
    rows = some_rows()
    for client in client_of(settings, handle):
        answered = client.post("/invocations", json=split(rows))

    assert handle.pyfunc_output == "predictions"
    assert answered.get_json() == {"predictions": in_process(label_folder.parent, rows)}


@pytest.mark.parametrize("route", ["/invocations", "/predict"])
def test_mlflow_pyfunc_null_in_a_required_column_the_pipeline_takes_is_answered(
    settings: Settings, proba_folder: Path, churn: Any, tmp_path: Path, route: str
) -> None:
    """MLflow's ``required`` is about the column being sent: MLflow's own server answers
    a null in ``region``, and so does the joblib file of the same pipeline."""
    mlmodel = yaml.safe_load((proba_folder.parent / "MLmodel").read_text())
    signature = json.loads(mlmodel["signature"]["inputs"])
    assert {"type": "string", "name": "region", "required": True} in signature
    rows = rows_with_null_regions()
    body = split(rows) if route == "/invocations" else {"instances": rows}
    joblib.dump(churn, tmp_path / "churn.joblib")
    answers = []
    for handle in (
        load_model(proba_folder, loaders=default_loaders(skops_trusted_types=TRUSTED)),
        load_model(tmp_path / "churn.joblib"),
    ):
        for client in client_of(settings, handle):
            answers.append(client.post(route, json=body))

    folder, alone = answers
    assert folder.status_code == alone.status_code == 200, folder.get_data(as_text=True)
    assert folder.get_json()["predictions"] == (
        in_process(proba_folder.parent, rows)
        if route == "/invocations"
        else churn.predict(frame_of(rows)).tolist()
    )
    if route == "/predict":
        assert folder.get_json()["predictions"] == alone.get_json()["predictions"]


@pytest.mark.parametrize("route", ["/invocations", "/predict"])
def test_mlflow_pyfunc_null_the_pipeline_refuses_is_422_naming_the_column(
    settings: Settings, proba_folder: Path, route: str
) -> None:
    """``plan``'s encoder refuses what it did not see (``handle_unknown="error"``): a null
    there is a 422 naming it, from the folder as from the joblib file."""
    rows = some_rows()
    rows[1]["plan"] = None
    body = split(rows) if route == "/invocations" else {"instances": rows}
    handle = load_model(proba_folder, loaders=default_loaders(skops_trusted_types=TRUSTED))
    for client in client_of(settings, handle):
        response = client.post(route, json=body)

    assert response.status_code == 422, response.get_data(as_text=True)
    assert "plan" in json.dumps(response.get_json())


def test_mlflow_pyfunc_missing_column_is_422_even_when_optional(
    settings: Settings, proba_folder: Path
) -> None:
    """A column must be sent, ``required`` or not (null where the pipeline takes it)."""
    rows = [{k: v for k, v in row.items() if k != "seats"} for row in some_rows()]
    handle = load_model(proba_folder, loaders=default_loaders(skops_trusted_types=TRUSTED))
    for client in client_of(settings, handle):
        response = client.post("/invocations", json={"dataframe_records": rows})

    assert response.status_code == 422
    assert "seats" in response.get_json()["message"]


@pytest.mark.parametrize(
    ("predict_fn", "expected"),
    [
        ("predict_log_proba", "'predict_log_proba' is not served"),
        ("predict_proba", "no probabilities"),
    ],
)
def test_mlflow_pyfunc_predict_fn_not_served_is_refused_at_load_naming_it(
    tmp_path: Path, predict_fn: str, expected: str
) -> None:
    from sklearn.linear_model import LinearRegression

    model: Any = LinearRegression()
    if predict_fn == "predict_log_proba":
        model = churn_module().churn_pipeline()
    else:
        model.fit(pd.DataFrame({"x": [0.0, 1.0, 2.0]}), [0.0, 1.0, 2.0])
    joblib.dump(model, tmp_path / "model.pkl")
    (tmp_path / "MLmodel").write_text(
        "flavors:\n  python_function:\n    loader_module: mlflow.sklearn\n"
        f"    model_path: model.pkl\n    predict_fn: {predict_fn}\n"
    )
    with pytest.raises(ModelLoadError, match=expected):
        load_model(tmp_path / "model.pkl", "joblib")


def mlflow_scores(folder: Path) -> Any:
    """MLflow's own scoring server's ``/invocations`` (``mlflow models serve``) for
    ``folder``, in-process: ``(body, content_type) -> (status, JSON answer)``. Its
    ``invocations`` function is the route's body, without the HTTP server around it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*Any type hint is inferred", UserWarning)
        import mlflow.pyfunc
        from mlflow.pyfunc import scoring_server

    model = mlflow.pyfunc.load_model(str(folder))
    schema = model.metadata.get_input_schema()

    def score(body: str, content_type: str) -> tuple[int, Any]:
        answer = scoring_server.invocations(body, content_type, model, schema)
        return answer.status, json.loads(answer.response)

    return score


def test_mlflow_pyfunc_invocations_equal_mlflows_own_scoring_server(
    settings: Settings, proba_folder: Path
) -> None:
    """The same bodies to MLflow's scoring server and to ours: the same JSON once parsed
    (the same numbers and shape; a null in the ``required`` region included)."""
    rows = rows_with_null_regions()
    bodies = [
        (json.dumps(split(rows)), "application/json"),
        (json.dumps({"dataframe_records": rows}), "application/json"),
        (frame_of(rows).to_csv(index=False), "text/csv"),
    ]
    theirs = mlflow_scores(proba_folder.parent)
    handle = load_model(proba_folder, loaders=default_loaders(skops_trusted_types=TRUSTED))
    for client in client_of(settings, handle):
        for body, content_type in bodies:
            ours = client.post("/invocations", data=body, content_type=content_type)
            status, expected = theirs(body, content_type)
            assert status == ours.status_code == 200, ours.get_data(as_text=True)
            assert ours.get_json() == expected


def test_mlflow_pyfunc_mlmodel_linked_out_of_the_folder_is_refused(tmp_path: Path) -> None:
    """As a schema file linked out of the folder is: whoever writes there picks the answer."""
    outside = tmp_path / "elsewhere"
    outside.write_text("flavors:\n  python_function:\n    predict_fn: predict_proba\n")
    folder = tmp_path / "churn"
    folder.mkdir()
    (folder / "MLmodel").symlink_to(outside)
    with pytest.raises(ValueError, match="link out of the model's folder"):
        pyfunc_output(folder / "model.pkl")
    outside.rename(folder / "MLmodel.yaml")
    (folder / "MLmodel").unlink()
    (folder / "MLmodel").symlink_to("MLmodel.yaml")  # within the folder: read
    assert pyfunc_output(folder / "model.pkl") == "probabilities"
