"""The dispatcher (``serving.protocols.dispatch``): the one answerer of every prediction
route, and the contract of every OpenAPI operation, the prediction routes and Flask's
cold routes alike, checked against what the app answers."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
from flask import Flask
from jsonschema import Draft202012Validator
from prometheus_client import CollectorRegistry

from serving.app import create_app
from serving.model.handle import ModelHandle
from serving.observe.metrics import ServingMetrics
from serving.settings import DEMO_MODEL_PATH, ModelSpec, Settings
from tests.conftest import unit_settings
from tests.models import RowEcho

ROW = [1.0, 2.0, 3.0]
V2_INPUT = {"name": "input-0", "shape": [1, 3], "datatype": "FP64", "data": ROW}
#: A valid body per prediction operation (the fixture model takes three numbers).
GOOD = {
    "/predict": {"instances": [ROW]},
    "/predict/{model_name}": {"instances": [ROW]},
    "/v2/models/{model_name}/infer": {"inputs": [V2_INPUT]},
    "/v2/models/{model_name}/versions/{model_version}/infer": {"inputs": [V2_INPUT]},
    "/v1/models/{model_name}:predict": {"instances": [ROW]},
    "/v1/models/{model_name}/versions/{model_version}:predict": {"inputs": [ROW]},
    "/v1/models/{model_name}/labels/{label}:predict": {"instances": [ROW]},
    **{
        path + method: {"examples": [{"input-0": ROW}]}
        for path in (
            "/v1/models/{model_name}",
            "/v1/models/{model_name}/versions/{model_version}",
            "/v1/models/{model_name}/labels/{label}",
        )
        for method in (":classify", ":regress")
    },
    "/invocations": {"dataframe_split": {"data": [ROW]}},
    "/v2/repository/index": {"ready": True},
}
ARGS = {"model_name": "echo", "model_version": "7", "label": "stable", "asset": "swagger-ui.css"}
#: ``:regress`` asks a regression model: ``number``, predicting the first feature.
REGRESS_ARGS = ARGS | {"model_name": "number"}


def _args(path: str) -> dict[str, str]:
    return REGRESS_ARGS if path.endswith(":regress") else ARGS


@pytest.fixture
def labelled(settings: Settings, model_handle: ModelHandle, metrics: ServingMetrics) -> Any:
    """An app serving the fixture model and a regression model ``number``, each with the
    version label ``stable``."""
    number = ModelHandle.from_callable(
        lambda rows: {"predictions": rows[:, 0]}, name="number", version="7", n_features=3
    )
    entries = [
        ModelSpec(name=name, version="7", path=DEMO_MODEL_PATH, labels={"stable": "7"})
        for name in ("echo", "number")
    ]
    app = create_app(
        settings.model_copy(update={"models": entries}),
        models=[model_handle, number],
        metrics=metrics,
    )
    yield app
    app.extensions["serving"].get_models().stop(timeout_s=10)


def _document(app: Flask) -> dict[str, Any]:
    spec: dict[str, Any] = app.test_client().get("/openapi.json").get_json()
    return spec


def _operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(p, m, op) for p, item in spec["paths"].items() for m, op in item.items()]


def _check_answer(spec: dict[str, Any], operation: dict[str, Any], response: Any) -> None:
    """``response`` has a status ``operation`` documents, its media type, and (JSON) a body
    its schema allows."""
    documented = operation["responses"]
    assert str(response.status_code) in documented, (response.status_code, response.data[:300])
    content = documented[str(response.status_code)].get("content")
    if content is None:
        return
    media = response.mimetype
    assert media in content, (media, list(content))
    schema = content[media].get("schema")
    if media == "application/json" and schema is not None:
        validator = Draft202012Validator({**schema, "components": spec["components"]})
        errors = [e.message for e in validator.iter_errors(response.get_json())]
        assert not errors, (response.get_json(), errors)


def test_every_operation_answers_a_good_request_as_it_documents(labelled: Flask) -> None:
    """Every operation of the OpenAPI document, sent a good request (a valid body where it
    takes one), answers 200 (the docs' slash a 308), documented in status, media type and
    body: the dispatcher's prediction routes and Flask's cold routes."""
    spec = _document(labelled)
    client = labelled.test_client()
    for path, method, operation in _operations(spec):
        url = path.format(**_args(path))
        body = GOOD.get(path) if method == "post" else None
        response = client.open(url, method=method.upper(), json=body)
        _check_answer(spec, operation, response)
        expected = 308 if path == "/docs/" else 200
        if path.startswith("/v2/repository/models/"):
            expected = 409  # no repository under explicit control here: tests/e2e load
        assert response.status_code == expected, (path, response.data[:300])
        assert response.headers["X-Request-ID"], path


def test_every_prediction_operation_refuses_a_bad_body_as_it_documents(labelled: Flask) -> None:
    """Every POST operation sent a body that is not its request answers a documented 4xx,
    in its protocol's documented error shape."""
    spec = _document(labelled)
    client = labelled.test_client()
    for path, method, operation in _operations(spec):
        if method != "post":
            continue
        response = client.post(path.format(**_args(path)), json={"instances": "nope", "inputs": 5})
        _check_answer(spec, operation, response)
        assert 400 <= response.status_code < 500, (path, response.status_code)


@pytest.mark.parametrize(
    ("path", "shape"),
    [
        ("/predict", "service"),
        ("/predict/echo", "service"),
        ("/v2/models/echo/infer", "v2"),
        ("/v1/models/echo:predict", "tf"),
        ("/invocations", "mlflow"),
    ],
)
def test_a_prediction_route_refuses_another_method_with_405_and_allow(
    client: Any, path: str, shape: str
) -> None:
    response = client.get(path)

    assert response.status_code == 405
    assert response.headers["Allow"] == "POST"
    assert response.headers["X-Request-ID"]
    body = response.get_json()
    code = body["error"]["code"] if shape == "service" else body["code"]
    assert code == "method_not_allowed"
    if shape == "mlflow":
        assert body["error_code"] == "BAD_REQUEST"


def test_a_refused_method_is_counted_and_needs_a_key_first(
    monkeypatch: pytest.MonkeyPatch, model_handle: ModelHandle
) -> None:
    """A 405 is a request like any other: counted under ``<unmatched>``, and with API keys
    on, a caller without a key learns nothing of the routes (401 first, as Flask does for
    its own unmatched paths)."""
    settings = unit_settings(monkeypatch, api_keys="k" * 20)
    registry = CollectorRegistry()
    app = create_app(settings, models=[model_handle], metrics=ServingMetrics(registry))
    try:
        client = app.test_client()
        assert client.get("/predict").status_code == 401
        keyed = client.get("/predict", headers={"X-API-Key": "k" * 20})
        assert keyed.status_code == 405
        assert client.post("/predict", json={"instances": [ROW]}).status_code == 401
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)
    counted = {
        (s.labels["route"], s.labels["status"]): s.value
        for metric in registry.collect()
        for s in metric.samples
        if s.name == "http_requests_total"
    }
    assert counted[("<unmatched>", "401")] == 1
    assert counted[("<unmatched>", "405")] == 1
    assert counted[("/predict", "401")] == 1


def test_a_model_name_is_matched_percent_decoded_as_flask_does(client: Any) -> None:
    """``/predict/%C3%A9`` names the model ``é`` (werkzeug's decoding of WSGI's latin-1
    path), a 404 that names it; ``/predict/a%2Fb`` is no route at all."""
    unknown = client.post("/predict/%C3%A9", json={"instances": [ROW]})
    assert unknown.status_code == 404
    assert unknown.get_json()["error"]["code"] == "model_not_found"
    assert "'é'" in unknown.get_json()["error"]["message"]
    assert client.post("/predict/echo", json={"instances": [ROW]}).status_code == 200


def test_a_host_werkzeug_cannot_bind_is_refused_by_flask_with_400(client: Any) -> None:
    response = client.post(
        "/predict", json={"instances": [ROW]}, headers={"Host": "a" * 64 + ".example"}
    )
    assert response.status_code == 400
    assert response.get_json()["error"]["code"] == "bad_request"
    assert response.headers["X-Request-ID"]


def test_a_prediction_answer_equals_the_model_in_process(client: Any) -> None:
    rows = np.arange(12, dtype=np.float64).reshape(4, 3)
    expected = RowEcho(n_features=3).predict(rows)
    for path, body in (
        ("/predict", {"instances": rows.tolist()}),
        ("/v1/models/echo:predict", {"instances": rows.tolist()}),
        ("/invocations", {"dataframe_split": {"data": rows.tolist()}}),
    ):
        response = client.post(path, json=body)
        assert response.status_code == 200, response.get_data(as_text=True)
        got = response.get_json()["predictions"]
        if path == "/v1/models/echo:predict":
            got = [row["predictions"] for row in got]
        np.testing.assert_array_equal(np.asarray(got), expected)


def test_a_transfer_coding_the_caller_chose_is_not_logged_as_a_server_error(
    client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A 501 for ``Transfer-Encoding: gzip, chunked`` is the caller's doing: answered, and
    no ERROR line (it is not the server's or the model's fault)."""
    with caplog.at_level(logging.INFO, logger="serving"):
        response = client.post(
            "/predict",
            data=b'{"instances": [[1, 2, 3]]}',
            content_type="application/json",
            headers={"Transfer-Encoding": "gzip, chunked"},
        )
    assert response.status_code == 501
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_mlflow_names_a_501_not_implemented(client: Any) -> None:
    response = client.post(
        "/invocations",
        data=b'{"dataframe_split": {"data": [[1, 2, 3]]}}',
        content_type="application/json",
        headers={"Transfer-Encoding": "gzip, chunked"},
    )
    assert response.status_code == 501
    assert response.get_json()["error_code"] == "NOT_IMPLEMENTED"


@pytest.mark.parametrize("path", ["/healthz/", "/pingx", "/ping/x", "/versions", "/invocations/x"])
def test_a_404_beside_an_mlflow_route_is_the_services_own(client: Any, path: str) -> None:
    """MLflow's error shape covers its own paths (``/ping``), not every path that starts
    with one (``/healthz/`` starts with ``/health``)."""
    response = client.get(path)
    assert response.status_code == 404
    assert response.get_json()["error"]["code"] == "not_found"


def test_the_access_log_names_the_model_asked_for_not_the_default_on_a_404(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the hostile trial: ``/predict/nope`` was logged as the default model."""
    lines: list[dict[str, Any]] = []
    monkeypatch.setattr("serving.protocols.hooks.access_log.record", lines.append)

    assert client.post("/predict/nope", json={"instances": [ROW]}).status_code == 404
    assert client.post("/predict", json={"instances": [ROW], "model": "gone"}).status_code == 404
    assert client.post("/predict", json={"instances": [ROW]}).status_code == 200

    assert [(line["model"], line["model_version"]) for line in lines] == [
        ("nope", None),
        ("gone", None),
        ("echo", "7"),
    ]


def test_the_access_log_names_a_cold_routes_model_from_its_url_and_none_for_the_rest(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the attack: a load, an unload, the index and a model's metadata were
    logged as the default model's requests."""
    lines: list[dict[str, Any]] = []
    monkeypatch.setattr("serving.protocols.hooks.access_log.record", lines.append)

    assert client.post("/v2/repository/models/churn/unload").status_code == 409
    assert client.get("/v2/models/echo/versions/7").status_code == 200
    assert client.post("/v2/repository/index").status_code == 200
    assert client.get("/healthz").status_code == 200

    assert [(line["model"], line["model_version"]) for line in lines] == [
        ("churn", None),
        ("echo", "7"),
        (None, None),
        (None, None),
    ]


def test_a_path_outside_wsgis_latin_1_is_answered_not_raised(app: Flask) -> None:
    """A WSGI server puts latin-1 in PATH_INFO; another caller's wider characters are
    replaced, as in werkzeug's decoding, and answered (a 404 here), not raised."""
    from werkzeug.test import EnvironBuilder

    environ = EnvironBuilder(path="/predict/x", method="POST", json={"instances": [ROW]})
    wsgi = environ.get_environ()
    wsgi["PATH_INFO"] = "/predict/\u4e2d"
    statuses: list[str] = []

    body = b"".join(app.wsgi_app(wsgi, lambda status, headers: statuses.append(status)))

    assert statuses == ["404 NOT FOUND"]
    assert b"model_not_found" in body


@pytest.mark.parametrize(
    "path",
    ["//predict", "///predict/echo", "//v2/models/echo/infer", "//v1/models/echo:predict",
     "//invocations"],
)  # fmt: skip
def test_a_path_with_leading_slashes_is_the_route_as_flask_reads_it(app: Flask, path: str) -> None:
    """Found by the attack: werkzeug reads ``//predict`` as ``/predict`` (its
    ``Request.path``); the dispatcher answered it 404 "no route for POST /predict"."""
    from werkzeug.test import EnvironBuilder

    body = GOOD["/v2/models/{model_name}/infer" if "v2" in path else "/predict"]
    if "invocations" in path:
        body = GOOD["/invocations"]
    wsgi = EnvironBuilder(path="/x", method="POST", json=body).get_environ()
    wsgi["PATH_INFO"] = path
    statuses: list[str] = []

    answer = b"".join(app.wsgi_app(wsgi, lambda status, headers: statuses.append(status)))

    assert statuses == ["200 OK"], answer[:300]
