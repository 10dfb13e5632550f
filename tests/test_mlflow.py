"""MLflow / SageMaker scoring in-process: ``/ping``, ``/invocations`` with every MLflow
JSON format and CSV, column names reordered, MLflow's error shape; tiny real models."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from flask import Flask
from flask.testing import FlaskClient

from serving.app import create_app
from serving.model.loaders import ModelHandle
from serving.observe.metrics import ServingMetrics
from serving.protocols.mlflow.schemas import MlflowErrorResponse, MlflowRequest, MlflowResponse
from serving.protocols.schemas import parse_body
from serving.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
Frame = tuple[Any, pd.DataFrame]


def mlflow_error(response: Any, status: int, error_code: str, code: str) -> str:
    """MLflow's error message, after checking the status and the exact shape."""
    assert response.status_code == status, response.get_data(as_text=True)
    body = response.get_json()
    assert set(body) == {"error_code", "message", "code"}
    error = MlflowErrorResponse.model_validate(body)
    assert (error.error_code, error.code) == (error_code, code)
    return error.message


def predictions(response: Any) -> list[Any]:
    assert response.status_code == 200, response.get_data(as_text=True)
    return MlflowResponse.model_validate(response.get_json()).predictions


def csv(frame: pd.DataFrame) -> dict[str, Any]:
    """``frame`` as a ``text/csv`` request, written the way pandas clients write it."""
    return {"data": frame.to_csv(index=False), "content_type": "text/csv"}


def test_mlflow_ping_is_200_when_ready_and_503_otherwise(app: Flask, client: FlaskClient) -> None:
    ready = client.get("/ping")
    app.extensions["serving"].get_models().default.stop(timeout_s=10)
    stopping = client.get("/ping")

    assert (ready.status_code, ready.get_json()) == (200, {"status": "ready"})
    assert (stopping.status_code, stopping.get_json()) == (503, {"status": "stopping"})
    assert stopping.headers["Retry-After"] == "1"


def test_mlflow_ping_is_open_and_invocations_need_the_api_key(
    settings: Settings, metrics: ServingMetrics, model_handle: ModelHandle
) -> None:
    key = "k" * 20
    keyed = Settings(**{**settings.model_dump(), "api_keys": key})
    app = create_app(keyed, models=[model_handle], metrics=metrics)
    client = app.test_client()
    body = {"instances": [[1, 2, 3]]}
    try:
        ping = client.get("/ping")
        refused = client.post("/invocations", json=body)
        allowed = client.post("/invocations", json=body, headers={"X-API-Key": key})
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    assert ping.status_code == 200
    mlflow_error(refused, 401, "UNAUTHENTICATED", "unauthorized")
    assert predictions(allowed) == [1.0]


@pytest.mark.parametrize(
    "body",
    [
        {"dataframe_split": {"columns": ["a", "b", "c"], "data": [[1, 2, 3], [4, 5, 6]]}},
        {"dataframe_split": {"data": [[1, 2, 3], [4, 5, 6]], "index": [10, 11]}},
        {"dataframe_records": [{"a": 1, "b": 2, "c": 3}, {"a": 4, "b": 5, "c": 6}]},
        {"instances": [[1, 2, 3], [4, 5, 6]]},
        {"instances": [{"a": 1, "b": 2, "c": 3}, {"c": 6, "b": 5, "a": 4}]},
        {"inputs": [[1, 2, 3], [4, 5, 6]]},
        {"inputs": {"a": [1, 4], "b": [2, 5], "c": [3, 6]}},
        {"inputs": [[1, 2, 3], [4, 5, 6]], "params": {"threshold": 0.3}},
    ],
)
def test_mlflow_invocations_accept_every_mlflow_json_format(
    client: FlaskClient, body: dict[str, Any]
) -> None:
    # A model without feature names takes the columns positionally (the first record's
    # key order for records).
    assert predictions(client.post("/invocations", json=body)) == [1.0, 4.0]


def test_mlflow_invocations_read_csv_with_a_header_row(client: FlaskClient) -> None:
    frame = pd.DataFrame({"a": [1.5, 4.0], "b": [2, 5], "c": [3e-3, -6]})
    with_blank_line = "a,b,c\r\n1.5,2,3\r\n\r\n4,5,6\r\n"

    assert predictions(client.post("/invocations", **csv(frame))) == [1.5, 4.0]
    assert predictions(
        client.post("/invocations", data=with_blank_line, content_type="text/csv; charset=utf-8")
    ) == [1.5, 4.0]


def test_mlflow_named_columns_are_reordered_to_the_models_features(
    named_app: Flask, frame_classifier: Frame
) -> None:
    model, X = frame_classifier
    rows = X.iloc[:6]
    shuffled = rows[list(reversed(X.columns))]
    expected = model.predict(rows).tolist()
    client = named_app.test_client()
    split = shuffled.to_dict("split")
    del split["index"]

    answers = [
        client.post("/invocations", json={"dataframe_split": split}),
        client.post("/invocations", json={"dataframe_records": shuffled.to_dict("records")}),
        client.post("/invocations", json={"instances": shuffled.to_dict("records")}),
        client.post("/invocations", json={"inputs": shuffled.to_dict("list")}),
        client.post("/invocations", json={"instances": rows.values.tolist()}),  # training order
        client.post("/invocations", **csv(shuffled)),
    ]

    for answer in answers:
        assert predictions(answer) == expected


def test_mlflow_missing_or_unknown_column_is_422_naming_it(
    named_app: Flask, frame_classifier: Frame
) -> None:
    _, X = frame_classifier
    rows = X.iloc[:2]
    client = named_app.test_client()
    missing = rows.drop(columns=["mean texture"]).to_dict("split")
    renamed = rows.rename(columns={"mean area": "area"})

    split = client.post("/invocations", json={"dataframe_split": missing})
    records = client.post("/invocations", json={"dataframe_records": renamed.to_dict("records")})
    from_csv = client.post("/invocations", **csv(renamed))

    def message(response: Any) -> str:
        return mlflow_error(response, 422, "INVALID_PARAMETER_VALUE", "invalid_input")

    assert "dataframe_split.columns: missing feature 'mean texture'" in message(split)
    assert "dataframe_records[0]: missing feature 'mean area'" in message(records)
    assert "csv.header: missing feature 'mean area'" in message(from_csv)


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"instances": [[1, 2, 3]], "inputs": [[1, 2, 3]]}, "got instances, inputs"),
        ({"params": {}}, "got none"),
        ({"dataframe_split": {"columns": ["a", "b"], "data": [[1, 2, 3]]}}, "3 values for 2"),
        ({"dataframe_split": {"data": [[1, 2, 3]], "index": [0, 1]}}, "2 labels for 1 rows"),
        ({"dataframe_records": [{"a": 1, "b": 2, "c": 3}, {"a": 1, "b": 2, "d": 3}]}, "'c'"),
        ({"inputs": {"a": [1, 2], "b": [1]}}, "inputs.b"),
        ({"dataframe_split": {"data": [[1, 2, "x"]]}}, "dataframe_split.data[0][2]"),
        ({"instances": [[1, 2]]}, "instances[0] has 2 features"),
        ({"dataframe_records": [{"a": 1, "b": 2, "c": 3}], "extra": 1}, "extra"),
        (  # a DataFrame's to_json(orient="split"), unwrapped (trial)
            {"columns": ["a", "b", "c"], "index": [0], "data": [[1, 2, 3]]},
            "columns: Extra inputs are not permitted (the body's fields: 'dataframe_split', "
            "'dataframe_records', 'instances', 'inputs', 'params'; a DataFrame's "
            "to_json(orient='split') goes under 'dataframe_split')",
        ),
    ],
)
def test_mlflow_invocations_refuse_bad_json_in_mlflows_error_shape(
    client: FlaskClient, body: dict[str, Any], words: str
) -> None:
    response = client.post("/invocations", json=body)

    assert words in mlflow_error(response, 422, "INVALID_PARAMETER_VALUE", "invalid_input")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("a,b,c\n1,2,x\n", "csv[0].c: 'x' is not a number"),
        ("a,b,c\n1,2,nan\n", "csv[0].c: missing value: this feature may not be missing"),
        ("a,b,c\n1,2,1e999\n", "csv[0].c: '1e999' is outside the float64 range"),
        ("a,b,c\n1,2,1_0\n", "csv[0].c: '1_0' is not a number"),
        ("a,b,c\n1,2\n", "line 2 has 2 values for 3 columns"),
        ("a,b,c\n", "no data rows"),
        ("", "empty"),
    ],
)
def test_mlflow_invocations_refuse_bad_csv_naming_the_line(
    client: FlaskClient, text: str, words: str
) -> None:
    response = client.post("/invocations", data=text, content_type="text/csv")

    assert words in mlflow_error(response, 422, "INVALID_PARAMETER_VALUE", "invalid_input")


def test_mlflow_invocations_map_statuses_to_mlflow_error_codes(client: FlaskClient) -> None:
    malformed = client.post("/invocations", data="{", content_type="application/json")
    as_text = client.post("/invocations", data="a", content_type="text/plain")
    too_many = client.post("/invocations", json={"instances": [[1, 2, 3]] * 17})
    latin1 = client.post("/invocations", data=b"a\n\xe9\n", content_type="text/csv")

    assert "not valid JSON" in mlflow_error(malformed, 400, "MALFORMED_REQUEST", "malformed_json")
    assert "application/json or text/csv, got text/plain" in mlflow_error(
        as_text, 415, "BAD_REQUEST", "unsupported_media_type"
    )
    mlflow_error(too_many, 413, "BAD_REQUEST", "payload_too_large")
    assert "not UTF-8" in mlflow_error(latin1, 422, "INVALID_PARAMETER_VALUE", "invalid_input")


def test_mlflow_operations_are_documented_with_json_and_csv_bodies(client: FlaskClient) -> None:
    spec = client.get("/openapi.json").get_json()

    operation = spec["paths"]["/invocations"]["post"]
    content = operation["requestBody"]["content"]
    assert content["application/json"]["schema"] == {"$ref": "#/components/schemas/MlflowRequest"}
    assert content["text/csv"]["schema"] == {"type": "string"}
    error = operation["responses"]["422"]["content"]["application/json"]["schema"]
    assert error == {"$ref": "#/components/schemas/MlflowErrorResponse"}
    assert "security" not in spec["paths"]["/ping"]["get"]


def test_mlflow_readme_examples_are_valid_requests() -> None:
    readme = (ROOT / "docs" / "api.md").read_text()
    curl = r"curl -s \S+/invocations -H 'Content-Type: application/json' -d '(.+?)'"
    bodies = re.findall(curl, readme)

    assert bodies
    for body in bodies:
        parse_body(MlflowRequest, body.encode())


def test_mlflow_dataframe_split_with_pandas_integer_columns_is_positional(
    named_app: Flask, frame_classifier: Frame
) -> None:
    model, X = frame_classifier
    rows = X.iloc[:6]
    unnamed = pd.DataFrame(rows.values)  # columns 0..3, as pandas labels a plain frame
    body = {"dataframe_split": json.loads(unnamed.to_json(orient="split"))}
    client = named_app.test_client()

    assert predictions(client.post("/invocations", json=body)) == model.predict(rows).tolist()

    swapped = unnamed[[1, 0, 2, 3]]  # labels say where each column belongs
    body = {"dataframe_split": json.loads(swapped.to_json(orient="split"))}
    assert predictions(client.post("/invocations", json=body)) == model.predict(rows).tolist()

    body["dataframe_split"]["columns"] = [0, 1, 2, 7]
    refused = client.post("/invocations", json=body)
    assert refused.status_code == 422
    assert "positions 0..3" in refused.get_json()["message"]
