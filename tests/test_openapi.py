"""GET /openapi.json: generated from the blueprints' models, valid, and covering every route."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flask import Flask
from flask.testing import FlaskClient
from openapi_spec_validator import validate

from serving.app import PROTOCOLS
from serving.protocols.base import template as _template
from serving.protocols.dispatch import prediction_map


def document(client: FlaskClient) -> dict[str, Any]:
    response = client.get("/openapi.json")
    assert response.status_code == 200
    body: dict[str, Any] = response.get_json()
    return body


def test_openapi_document_is_valid_openapi_3_1(client: FlaskClient) -> None:
    spec = document(client)
    validate(spec)  # raises OpenAPIValidationError naming the first problem
    assert spec["openapi"] == "3.1.0"


def test_every_route_is_documented_and_every_operation_is_a_route(
    app: Flask, client: FlaskClient
) -> None:
    spec = document(client)
    documented = {(path, method) for path, item in spec["paths"].items() for method in item}
    flask, dispatched = set(), set()
    for routed, url_map in ((flask, app.url_map), (dispatched, prediction_map(PROTOCOLS))):
        for rule in url_map.iter_rules():
            if rule.endpoint == "static":
                continue
            path = _template(rule.rule)
            for method in rule.methods or ():
                if method not in ("HEAD", "OPTIONS"):
                    routed.add((path, method.lower()))
    assert documented == flask | dispatched
    assert not flask & dispatched  # one answerer per route
    assert {method for _, method in dispatched} == {"post"}
    assert ("/invocations", "post") in dispatched


def test_predict_operation_uses_the_models_the_blueprint_validates_with(
    client: FlaskClient,
) -> None:
    spec = document(client)
    operation = spec["paths"]["/predict"]["post"]
    request = operation["requestBody"]["content"]["application/json"]["schema"]
    assert request == {"$ref": "#/components/schemas/PredictRequest"}
    schema = spec["components"]["schemas"]["PredictRequest"]
    assert schema["additionalProperties"] is False  # extra="forbid"
    assert set(schema["properties"]) == {"instances", "model", "model_version", "outputs"}
    assert {"200", "409", "422", "503"} <= set(operation["responses"])
    error = operation["responses"]["422"]["content"]["application/json"]["schema"]
    assert error == {"$ref": "#/components/schemas/ErrorResponse"}


def test_metric_route_labels_are_the_documented_path_templates() -> None:
    assert (
        _template("/v1/models/<tf_model:model_name>:predict") == "/v1/models/{model_name}:predict"
    )
    assert _template("/v2/models/<model_name>/versions/<model_version>/infer") == (
        "/v2/models/{model_name}/versions/{model_version}/infer"
    )
    assert _template("/predict") == "/predict"


def test_openapi_describes_each_served_models_instances_once_ready(
    settings: Any, tmp_path: Any
) -> None:
    """The churn pipeline's instance schema: strings with their categories, nullable
    numbers; real rows validate against it, an unknown category does not."""
    from jsonschema import Draft202012Validator
    from prometheus_client import CollectorRegistry

    from serving.app import create_app
    from serving.model.loaders import load_model
    from serving.observe.metrics import ServingMetrics
    from tests.tabular import churn_rows, write_churn

    _, path, _ = write_churn(tmp_path)
    app = create_app(
        settings, models=[load_model(path)], metrics=ServingMetrics(CollectorRegistry())
    )
    try:
        document = app.test_client().get("/openapi.json").get_json()
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    schema = document["components"]["schemas"]["Instance.churn.1"]
    assert schema["properties"]["plan"] == {"type": "string", "enum": ["basic", "pro", "team"]}
    assert schema["properties"]["seats"] == {"type": ["number", "null"]}
    validator = Draft202012Validator(schema)
    assert all(validator.is_valid(row) for row in churn_rows())
    assert not validator.is_valid(churn_rows()[0] | {"plan": "gold"})


@pytest.mark.parametrize("model", ["demo", "churn"])
def test_openapi_every_prediction_operation_has_an_example_the_model_answers(
    settings: Any, tmp_path: Any, model: str
) -> None:
    """What "Try it out" in /docs sends: each POST operation that predicts (/predict,
    /predict/{model_name}, V2 infer, TF Serving predict, /invocations) has a request body
    and path parameters prefilled from the default model, and the answer is the model's
    own on that instance."""
    import joblib
    import pandas as pd
    from prometheus_client import CollectorRegistry

    from serving.app import create_app
    from serving.model.loaders import load_model
    from serving.observe.metrics import ServingMetrics
    from serving.settings import DEMO_MODEL_PATH
    from tests.tabular import write_churn

    path = DEMO_MODEL_PATH if model == "demo" else write_churn(tmp_path)[1]
    app = create_app(
        settings, models=[load_model(path)], metrics=ServingMetrics(CollectorRegistry())
    )
    estimator = joblib.load(path)
    try:
        client = app.test_client()
        spec = client.get("/openapi.json").get_json()
        wanted = [
            p for p in spec["paths"]
            if (p.startswith(("/predict", "/invocations")) or p.endswith((":predict", "/infer")))
            and "{label}" not in p  # these models have no labels
        ]  # fmt: skip
        answered = {}
        for route in wanted:
            operation = spec["paths"][route]["post"]
            example = operation["requestBody"]["content"]["application/json"].get("example")
            assert example is not None, route
            url = route
            for parameter in operation.get("parameters", []):
                assert "example" in parameter, (route, parameter["name"])
                url = url.replace("{" + parameter["name"] + "}", parameter["example"])
            response = client.post(url, json=example)
            assert response.status_code == 200, (route, response.get_json())
            answered[route] = (example, response.get_json())
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    # /predict twice, V2 and TF Serving with and without a version, /invocations
    assert len(answered) == 7, sorted(answered)
    example, _ = answered["/predict"]
    instance = example["instances"][0]
    if isinstance(instance, dict):
        rows: Any = pd.DataFrame([instance], columns=list(estimator.feature_names_in_))
    else:
        rows = np.asarray([instance], dtype=float)
    label = estimator.predict(rows).tolist()[0]
    for route, (_, body) in answered.items():
        if route.endswith("/infer"):
            outputs = {o["name"]: o["data"] for o in body["outputs"]}
            got = outputs["predictions"][0]
        elif route.endswith(":predict"):
            first = body["predictions"][0]
            got = first["predictions"] if isinstance(first, dict) else first
        else:
            got = body["predictions"][0]
        assert got == label, (route, body)
