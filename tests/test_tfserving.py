"""TF Serving REST (``/v1/models/...``) in-process: row and columnar predict, model status,
metadata with feature names, TF Serving's error shape; around tiny real models."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from flask import Flask
from flask.testing import FlaskClient

from serving.app import create_app
from serving.model.loaders import ModelHandle
from serving.observe.metrics import ServingMetrics
from serving.protocols.schemas import parse_body
from serving.protocols.tfserving.schemas import (
    TFClassifyResponse,
    TFErrorResponse,
    TFExamplesRequest,
    TFMetadataResponse,
    TFPredictRequest,
    TFPredictResponse,
    TFRegressResponse,
    TFStatusResponse,
)
from serving.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
Frame = tuple[Any, pd.DataFrame]


def tf_error(response: Any, status: int, code: str) -> str:
    """The TF Serving error message, after checking the status and the exact shape."""
    assert response.status_code == status, response.get_data(as_text=True)
    body = response.get_json()
    assert set(body) == {"error", "code"}
    error = TFErrorResponse.model_validate(body)
    assert error.code == code
    return error.error


def ok(response: Any) -> dict[str, Any]:
    assert response.status_code == 200, response.get_data(as_text=True)
    body: dict[str, Any] = response.get_json()
    return body


def test_tfserving_row_format_answers_an_object_of_outputs_per_instance(
    client: FlaskClient,
) -> None:
    body = ok(client.post("/v1/models/echo:predict", json={"instances": [[1, 2, 3], [4, 5, 6]]}))

    TFPredictResponse.model_validate(body)
    assert body == {
        "predictions": [
            {"predictions": 1.0, "probabilities": [0.5, 0.5]},
            {"predictions": 4.0, "probabilities": [0.5, 0.5]},
        ]
    }


def test_tfserving_columnar_format_answers_an_object_of_lists(client: FlaskClient) -> None:
    body = ok(client.post("/v1/models/echo:predict", json={"inputs": [[1, 2, 3], [4, 5, 6]]}))

    assert body == {"outputs": {"predictions": [1.0, 4.0], "probabilities": [[0.5, 0.5]] * 2}}


def test_tfserving_single_output_model_answers_plain_values(
    settings: Settings, metrics: ServingMetrics
) -> None:
    # TF Serving's own example: half_plus_three, one input value per instance.
    handle = ModelHandle.from_callable(
        lambda X: X[:, 0] / 2 + 3, name="half_plus_three", version="123", n_features=1
    )
    app = create_app(settings, models=[handle], metrics=metrics)
    client = app.test_client()
    try:
        url = "/v1/models/half_plus_three:predict"
        rows = ok(client.post(url, json={"instances": [1.0, 2.0, 5.0]}))
        columns = ok(client.post(url, json={"inputs": [[1.0], [2.0], [5.0]]}))
        pinned = ok(client.post(url.replace(":", "/versions/123:"), json={"instances": [[1]]}))
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    assert rows == {"predictions": [3.5, 4.0, 5.5]}
    assert columns == {"outputs": [3.5, 4.0, 5.5]}
    assert pinned == {"predictions": [3.5]}


def test_tfserving_predict_unknown_model_is_404_and_unserved_version_409(
    client: FlaskClient,
) -> None:
    body = {"instances": [[1, 2, 3]]}

    assert "'nope' is not served" in tf_error(
        client.post("/v1/models/nope:predict", json=body), 404, "model_not_found"
    )
    assert "'8'" in tf_error(
        client.post("/v1/models/echo/versions/8:predict", json=body), 409, "version_conflict"
    )
    assert ok(client.post("/v1/models/echo/versions/7:predict", json=body))["predictions"]


@pytest.mark.parametrize(
    ("body", "status", "code", "words"),
    [
        ({"instances": [[1, 2, 3]], "inputs": [[1, 2, 3]]}, 422, "invalid_input", "exactly one"),
        ({}, 422, "invalid_input", "exactly one"),
        ({"instances": [[1, 2]]}, 422, "invalid_input", "instances[0] has 2 features"),
        ({"instances": [[1, 2, 3]], "signature_name": "x"}, 422, "invalid_input", "'x'"),
        pytest.param(
            {"inputs": {"input-0": [[1, 2, 3]], "b": [[1]]}},
            422,
            "invalid_input",
            "'b'",
        ),
        ({"inputs": {"input-0": [[1, 2, 3], [4, 5]], "b": [1]}}, 422, "invalid_input", "one per"),
        pytest.param(
            {"instances": [{"input-0": [1, 2]}]},
            422,
            "invalid_input",
            "takes 3 values",
        ),
        ({"instances": [[1, 2, "3"]]}, 422, "invalid_input", "instances[0][2]"),
        ({"instances": [[1, 2, 3]] * 17}, 413, "payload_too_large", "17 instances"),
        ({"inputs": [[1, 2, 3]] * 17}, 413, "payload_too_large", "17 instances"),
    ],
)
def test_tfserving_predict_refuses_bad_bodies_in_tf_servings_error_shape(
    client: FlaskClient, body: dict[str, Any], status: int, code: str, words: str
) -> None:
    message = tf_error(client.post("/v1/models/echo:predict", json=body), status, code)

    assert words in message


def test_tfserving_predict_refuses_non_json_bodies_in_tf_servings_error_shape(
    client: FlaskClient,
) -> None:
    url = "/v1/models/echo:predict"
    malformed = client.post(url, data="{", content_type="application/json")
    as_text = client.post(url, data="{}", content_type="text/plain")

    assert "not valid JSON" in tf_error(malformed, 400, "malformed_json")
    assert "application/json" in tf_error(as_text, 415, "unsupported_media_type")


def test_tfserving_routes_split_the_model_name_at_the_colon(
    settings: Settings, metrics: ServingMetrics, model_handle: ModelHandle
) -> None:
    handle = dataclasses.replace(model_handle, version="2024:06")
    app = create_app(settings, models=[handle], metrics=metrics)
    client = app.test_client()
    body = {"instances": [[1, 2, 3]]}
    try:
        pinned = client.post("/v1/models/echo/versions/2024:06:predict", json=body)
        status = client.get("/v1/models/echo/versions/2024:06")
        get_predict = client.get("/v1/models/echo:predict")
        two_colons = client.post("/v1/models/echo:x:predict", json=body)
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    assert ok(pinned)["predictions"][0]["predictions"] == 1.0
    assert ok(status)["model_version_status"][0]["version"] == "2024:06"
    assert get_predict.status_code == 405  # the status route's name cannot hold ':'
    assert get_predict.headers["Allow"] == "POST"
    assert two_colons.status_code == 404


def test_tfserving_status_reports_each_version_as_tf_serving_does(
    app: Flask, client: FlaskClient
) -> None:
    available = ok(client.get("/v1/models/echo"))
    pinned = ok(client.get("/v1/models/echo/versions/7"))
    unserved = client.get("/v1/models/echo/versions/8")
    unknown = client.get("/v1/models/nope")
    app.extensions["serving"].get_models().default.stop(timeout_s=10)
    stopping = ok(client.get("/v1/models/echo"))

    TFStatusResponse.model_validate(available)
    status = {"error_code": "OK", "error_message": ""}
    ready = {"version": "7", "state": "AVAILABLE", "status": status}
    assert available == pinned == {"model_version_status": [ready]}
    tf_error(unserved, 409, "version_conflict")
    tf_error(unknown, 404, "model_not_found")
    assert stopping["model_version_status"][0]["state"] == "UNLOADING"
    assert stopping["model_version_status"][0]["status"]["error_code"] == "UNAVAILABLE"


def test_tfserving_metadata_lists_inputs_outputs_and_the_feature_names_in_order(
    named_app: Flask, frame_classifier: Frame
) -> None:
    _, X = frame_classifier
    client = named_app.test_client()

    body = ok(client.get("/v1/models/cancer/metadata"))
    pinned = ok(client.get("/v1/models/cancer/versions/2/metadata"))

    TFMetadataResponse.model_validate(body)
    assert body == pinned
    assert body["model_spec"] == {"name": "cancer", "signature_name": "", "version": "2"}
    assert body["metadata"]["feature_names"] == list(X.columns)
    signature = body["metadata"]["signature_def"]["signature_def"]["serving_default"]
    (name, tensor), *more = signature["inputs"].items()
    assert (name, tensor["dtype"], more) == ("input-0", "DT_DOUBLE", [])
    assert [d["size"] for d in tensor["tensor_shape"]["dim"]] == ["-1", "4"]
    assert set(signature["outputs"]) == {"predictions", "probabilities"}
    assert signature["outputs"]["probabilities"]["tensor_shape"]["dim"][1]["size"] == "2"
    tf_error(client.get("/v1/models/cancer/versions/3/metadata"), 409, "version_conflict")


def test_tfserving_metadata_of_a_model_without_feature_names_says_null(
    client: FlaskClient,
) -> None:
    assert ok(client.get("/v1/models/echo/metadata"))["metadata"]["feature_names"] is None


def test_tfserving_named_instances_and_columns_are_reordered_to_the_models_features(
    named_app: Flask, frame_classifier: Frame
) -> None:
    model, X = frame_classifier
    rows = X.iloc[:5]
    expected = model.predict(rows).tolist()
    shuffled = list(reversed(X.columns))
    client = named_app.test_client()
    url = "/v1/models/cancer:predict"

    by_feature = ok(client.post(url, json={"instances": rows[shuffled].to_dict("records")}))
    by_input_name = [{"input-0": row} for row in rows.values.tolist()]
    by_input = ok(client.post(url, json={"instances": by_input_name}))
    columnar = ok(client.post(url, json={"inputs": rows[shuffled].to_dict("list")}))
    wrapped_columns = {name: [[v] for v in values] for name, values in rows.to_dict("list").items()}
    wrapped = ok(client.post(url, json={"inputs": wrapped_columns}))

    assert [p["predictions"] for p in by_feature["predictions"]] == expected
    assert [p["predictions"] for p in by_input["predictions"]] == expected
    assert columnar["outputs"]["predictions"] == expected
    assert wrapped["outputs"]["predictions"] == expected
    np.testing.assert_allclose(
        columnar["outputs"]["probabilities"], model.predict_proba(rows), rtol=1e-12
    )


def test_tfserving_classify_answers_each_class_label_with_its_probability(
    named_app: Flask, frame_classifier: Frame
) -> None:
    """TF Serving's ``:classify``: examples keyed by feature name (the context shared by
    all), ``[label, score]`` per class in the model's class order, labels as strings."""
    model, X = frame_classifier
    rows = X.iloc[:6]
    examples = rows.drop(columns=["mean area"]).to_dict("records")
    client = named_app.test_client()
    url = "/v1/models/cancer/versions/2:classify"

    answer = ok(client.post(url, json={"examples": rows.to_dict("records")}))
    with_context = ok(
        client.post(url, json={"context": {"mean area": 500.0}, "examples": examples})
    )

    result = TFClassifyResponse.model_validate(answer).result
    expected = model.predict_proba(rows)
    assert [[label for label, _ in example] for example in result] == [["0", "1"]] * 6
    np.testing.assert_allclose([[p for _, p in e] for e in result], expected, rtol=1e-12)
    in_context = model.predict_proba(rows.assign(**{"mean area": 500.0}))
    shared = [[p for _, p in e] for e in with_context["result"]]
    np.testing.assert_allclose(shared, in_context, rtol=1e-12)


def test_tfserving_regress_answers_a_regression_models_number_per_example(
    settings: Settings, metrics: ServingMetrics, frame_classifier: Frame
) -> None:
    from sklearn.linear_model import Ridge

    from serving.model.loaders import estimator_handle

    _, X = frame_classifier
    target = X["mean area"] * 0.01 + X["mean radius"]
    model = Ridge().fit(X, target)
    handle = estimator_handle(model, name="area", version="1", format="pickle")
    app = create_app(settings, models=[handle], metrics=metrics)
    client = app.test_client()
    try:
        answer = ok(
            client.post("/v1/models/area:regress", json={"examples": X.iloc[:5].to_dict("records")})
        )
        classify = client.post("/v1/models/area:classify", json={"examples": [X.iloc[0].to_dict()]})
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    result = TFRegressResponse.model_validate(answer).result
    np.testing.assert_allclose(result, model.predict(X.iloc[:5]), rtol=1e-12)
    assert "needs a classifier with predict_proba" in tf_error(classify, 422, "invalid_input")


def test_tfserving_examples_refuse_a_classifier_for_regress_and_a_feature_also_in_context(
    named_app: Flask, frame_classifier: Frame
) -> None:
    _, X = frame_classifier
    record = X.iloc[0].to_dict()
    client = named_app.test_client()

    regress = client.post("/v1/models/cancer:regress", json={"examples": [record]})
    twice = client.post(
        "/v1/models/cancer:classify", json={"context": {"mean area": 1.0}, "examples": [record]}
    )
    empty = client.post("/v1/models/cancer:classify", json={"examples": []})
    signature = client.post(
        "/v1/models/cancer:classify", json={"signature_name": "other", "examples": [record]}
    )
    unknown = client.post("/v1/models/nope:classify", json={"examples": [record]})

    assert "a classifier's labels: :regress needs a regression model" in tf_error(
        regress, 422, "invalid_input"
    )
    assert "examples[0].mean area: is also in context" in tf_error(twice, 422, "invalid_input")
    assert "examples" in tf_error(empty, 422, "invalid_input")
    assert "signature 'other' not found" in tf_error(signature, 422, "invalid_input")
    tf_error(unknown, 404, "model_not_found")


def test_tfserving_missing_or_unknown_feature_is_422_naming_it(
    named_app: Flask, frame_classifier: Frame
) -> None:
    _, X = frame_classifier
    record = X.iloc[0].to_dict()
    missing = {k: v for k, v in record.items() if k != "mean area"}
    unknown = {**record, "mean colour": 1.0}
    client = named_app.test_client()
    url = "/v1/models/cancer:predict"

    row_missing = client.post(url, json={"instances": [record, missing]})
    row_unknown = client.post(url, json={"instances": [unknown]})
    col_missing = client.post(url, json={"inputs": {k: [v] for k, v in missing.items()}})

    def message(response: Any) -> str:
        return tf_error(response, 422, "invalid_input")

    assert "instances[1]: missing feature 'mean area'" in message(row_missing)
    assert "unknown feature 'mean colour'" in message(row_unknown)
    assert "inputs: missing feature 'mean area'" in message(col_missing)


def test_tfserving_operations_are_documented_with_tf_servings_error_shape(
    client: FlaskClient,
) -> None:
    spec = client.get("/openapi.json").get_json()

    operation = spec["paths"]["/v1/models/{model_name}/versions/{model_version}:predict"]["post"]
    assert {p["name"] for p in operation["parameters"]} == {"model_name", "model_version"}
    error = operation["responses"]["422"]["content"]["application/json"]["schema"]
    assert error == {"$ref": "#/components/schemas/TFErrorResponse"}
    assert "get" in spec["paths"]["/v1/models/{model_name}/metadata"]


def test_tfserving_readme_examples_are_valid_requests() -> None:
    readme = (ROOT / "docs" / "api.md").read_text()
    bodies = re.findall(r"curl -s \S+/v1/models/\S+:predict .*?-d '(.+?)'", readme)

    examples = re.findall(r"curl -s \S+/v1/models/\S+:classify .*?-d '(.+?)'", readme)

    assert bodies and examples
    for body in bodies:
        request = parse_body(TFPredictRequest, body.encode())
        assert request.instances is not None or json.loads(body)["inputs"]
    for body in examples:
        assert parse_body(TFExamplesRequest, body.encode()).examples


def test_tfserving_float32_outputs_print_as_on_predict(
    settings: Any, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    """A float32 probability reads the same on both routes (its shortest float32 form)."""
    from prometheus_client import CollectorRegistry

    from serving.app import create_app
    from serving.model.loaders import load_model
    from serving.observe.metrics import ServingMetrics
    from serving.settings import DEMO_MODEL_PATH

    graph = load_model(DEMO_MODEL_PATH.with_suffix(".onnx"), name="bc")
    app = create_app(settings, models=[graph], metrics=ServingMetrics(CollectorRegistry()))
    client = app.test_client()
    rows = breast_cancer[0][1:2].tolist()  # probabilities 0.9999643..., not 0 or 1
    try:
        predict = client.post("/predict", json={"instances": rows}).get_json()
        tf = client.post("/v1/models/bc:predict", json={"inputs": rows}).get_json()
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    assert tf["outputs"]["probabilities"] == predict["probabilities"]
    assert predict["probabilities"][0][0] == 0.9999644  # float32's digits, not float64's
