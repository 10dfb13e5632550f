"""The HTTP API in-process (Flask test client) around a tiny real model: contract and errors."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
from flask.testing import FlaskClient
from prometheus_client import CollectorRegistry

from serving.app import create_app
from serving.model.loaders import ModelHandle
from serving.observe.metrics import ServingMetrics
from serving.protocols.predict.schemas import PredictResponse
from serving.protocols.schemas import ErrorResponse, HealthResponse
from serving.runtime import ModelRuntime
from serving.settings import Settings
from tests.conftest import serve_runtimes
from tests.models import FailsOnNegative


def error_of(response: Any) -> dict[str, Any]:
    body = ErrorResponse.model_validate(response.get_json()).error
    assert "Traceback" not in body.message
    return body.model_dump()


def test_predict_returns_one_prediction_per_instance_in_order(client: FlaskClient) -> None:
    response = client.post("/predict", json={"instances": [[5, 0, 0], [6.5, 1, 2]]})

    assert response.status_code == 200
    body = PredictResponse.model_validate(response.get_json())
    assert body.predictions == [5.0, 6.5]
    assert body.probabilities == [[0.5, 0.5], [0.5, 0.5]]
    assert body.classes == ["a", "b"]
    assert (body.model_name, body.model_version) == ("echo", "7")
    assert body.latency_ms > 0


def test_predict_accepts_a_matching_model_version(client: FlaskClient) -> None:
    response = client.post("/predict", json={"instances": [[1, 2, 3]], "model_version": "7"})
    assert response.status_code == 200


@pytest.mark.parametrize(
    ("body", "status", "code", "where"),
    [
        (b'{"instances": [[1, 2, 3]', 400, "malformed_json", "not valid JSON"),
        (b'{"instances": []}', 422, "invalid_input", "instances"),
        (
            b'{"instances": [[1, 2, 3], [1, 2]]}',
            422,
            "invalid_input",
            "instances[1] has 2 features",
        ),
        (b'{"instances": [[1, 2]]}', 422, "invalid_input", "the model expects 3"),
        (b'{"instances": [[1, "1.5", 3]]}', 422, "invalid_input", "instances[0][1]"),
        (b'{"instances": [[1, true, 3]]}', 422, "invalid_input", "instances[0][1]"),
        (b'{"instances": [[1, 2, NaN]]}', 422, "invalid_input", "instances[0][2]"),
        (b'{"instances": [[Infinity, 2, 3]]}', 422, "invalid_input", "instances[0][0]"),
        (b'{"instances": [[1e999, 2, 3]]}', 422, "invalid_input", "instances[0][0]"),
        (b'{"instances": [[[1], 2, 3]]}', 422, "invalid_input", "instances[0][0]"),
        (b'{"instance": [[1, 2, 3]]}', 422, "invalid_input", "instance"),
        (  # a list after an object (the new-user trial read "Input should be an object")
            b'{"instances": [{"a": 1}, [1, 2, 3]]}',
            422,
            "invalid_input",
            "instances[1]: not an object, as instances[0] is: every instance of one request",
        ),
        (
            b'{"instances": [[1, 2, 3], {"a": 1}]}',
            422,
            "invalid_input",
            "instances[1]: not a list, as instances[0] is",
        ),
        (b"[[1, 2, 3]]", 422, "invalid_input", "body"),
        (b'{"instances": [[1, 2, 3]], "model_version": "8"}', 409, "version_conflict", "'8'"),
    ],
)
def test_predict_rejects_bad_input_with_status_code_and_location(
    client: FlaskClient, body: bytes, status: int, code: str, where: str
) -> None:
    response = client.post("/predict", data=body, content_type="application/json")

    assert response.status_code == status
    error = error_of(response)
    assert error["code"] == code
    assert where in error["message"]


def test_predict_names_the_first_bad_value_and_stops_there(client: FlaskClient) -> None:
    """One detail, whatever the number of bad values: refusing costs one pass at most."""
    response = client.post("/predict", json={"instances": [[1, "x", 3], [True, 2, 3]]})
    details = error_of(response)["details"]
    assert [(d["loc"], d["type"]) for d in details] == [("instances[0][1]", "float_type")]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"dataframe_split": {"columns": ["a"], "data": [[1]]}},
            "instances: Field required; given but unknown: 'dataframe_split' "
            "(MLflow's body: POST it to /invocations)",
        ),
        (
            {"inputs": [{"name": "input-0"}], "id": "1"},
            "instances: Field required; given but unknown: 'id', 'inputs' (KServe V2's or "
            "TF Serving's body: POST it to /v2/models/{name}/infer or "
            "/v1/models/{name}:predict)",
        ),
        ({"instance": [[1, 2, 3]]}, "instances: Field required; given but unknown: 'instance'"),
        ({"instances": []}, "instances: needs at least 1 item, got 0"),
    ],
)
def test_predict_a_body_of_another_shape_names_what_it_holds(
    client: FlaskClient, body: dict[str, Any], message: str
) -> None:
    """Found by the new-user trial: an MLflow or V2 body, or a misspelt 'instance', got
    only 'instances: Field required' (the unknown field was never named, nor where such
    a body goes), and an empty list pydantic's 'List should have at least 1 item after
    validation, not 0'."""
    response = client.post("/predict", json=body)

    assert response.status_code == 422
    assert error_of(response)["message"] == message


def test_predict_refuses_a_body_that_is_not_json(client: FlaskClient) -> None:
    response = client.post("/predict", data="instances=1", content_type="text/plain")
    assert response.status_code == 415
    assert error_of(response)["code"] == "unsupported_media_type"


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("Application/JSON ; charset=utf-8", 200),
        ("application/vnd.api+json", 200),
        ("text/plain+json", 415),  # found by the attack: any +json was taken as JSON
        ("application/json-patch", 415),
        ("", 415),
    ],
)
def test_predict_takes_json_media_types_as_werkzeug_does(
    client: FlaskClient, content_type: str, status: int
) -> None:
    body = b'{"instances": [[1, 2, 3]]}'
    response = client.post("/predict", data=body, headers={"Content-Type": content_type})
    assert response.status_code == status, response.get_data(as_text=True)


def test_predict_refuses_too_many_instances_and_too_large_bodies(client: FlaskClient) -> None:
    too_many = client.post("/predict", json={"instances": [[1, 2, 3]] * 17})
    assert too_many.status_code == 413
    assert "SERVING_MAX_INSTANCES_PER_REQUEST" in error_of(too_many)["message"]

    too_large = client.post("/predict", json={"instances": [[1.0, 2.0, 3.0]] * 400})
    assert too_large.status_code == 413
    assert "SERVING_MAX_BODY_BYTES" in error_of(too_large)["message"]


def test_unknown_route_and_wrong_method_answer_json(client: FlaskClient) -> None:
    missing = client.get("/nope")
    assert missing.status_code == 404 and error_of(missing)["code"] == "not_found"
    assert error_of(missing)["message"] == "no route for GET /nope"
    wrong = client.get("/predict")
    assert wrong.status_code == 405 and error_of(wrong)["code"] == "method_not_allowed"
    assert error_of(wrong)["message"] == "GET /predict: method not allowed; allowed: POST"
    assert wrong.headers["Allow"] == "POST"
    options = client.options("/predict")
    assert options.status_code == 405 and options.is_json


def test_every_response_carries_a_request_id_and_echoes_the_callers(client: FlaskClient) -> None:
    generated = client.get("/livez").headers["X-Request-ID"]
    assert len(generated) == 32
    echoed = client.get("/livez", headers={"X-Request-ID": "abc-123"})
    assert echoed.headers["X-Request-ID"] == "abc-123"
    hostile = client.get("/livez", headers={"X-Request-ID": "a\tb" + "x" * 300})
    assert hostile.headers["X-Request-ID"] != "a\tb" + "x" * 300


def test_model_failure_is_500_inference_error_and_counted(settings: Settings) -> None:
    metrics = ServingMetrics(CollectorRegistry())
    model = FailsOnNegative(n_features=3)
    handle = ModelHandle.from_callable(model.predict, name="f", version="1", n_features=3)
    app = create_app(settings, models=[handle], metrics=metrics)
    try:
        response = app.test_client().post("/predict", json={"instances": [[-1, 0, 0]]})
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    assert response.status_code == 500
    error = error_of(response)
    assert error["code"] == "inference_error"
    assert "negative first feature" in error["message"]
    labels = {"model": "f", "version": "1"}
    assert metrics.registry.get_sample_value("inference_errors_total", labels) == 1.0


def test_model_failure_is_logged_with_its_request_id_and_the_models_traceback(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by the new-user trial: a 500 was logged as 'request None failed', without
    the X-Request-ID the client sent, and without the model's traceback (a custom class
    could not be debugged from the log)."""
    model = FailsOnNegative(n_features=3)
    handle = ModelHandle.from_callable(model.predict, name="f", version="1", n_features=3)
    app = create_app(settings, models=[handle], metrics=ServingMetrics(CollectorRegistry()))
    try:
        with caplog.at_level(logging.ERROR, logger="serving"):
            response = app.test_client().post(
                "/predict", json={"instances": [[-1, 0, 0]]},
                headers={"X-Request-ID": "trial-abc-123"},
            )  # fmt: skip
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    assert response.status_code == 500
    assert "model failed on 1 instance: " in error_of(response)["message"]
    (record,) = [r for r in caplog.records if "trial-abc-123" in r.getMessage()]
    assert record.getMessage().startswith("request trial-abc-123 failed: inference_error")
    assert record.exc_info is not None
    assert "negative first feature" in str(record.exc_info[1])


def test_healthz_is_503_until_the_model_is_ready_then_200(settings: Settings) -> None:
    metrics = ServingMetrics(CollectorRegistry())
    runtime = ModelRuntime(settings.model_settings()[0], metrics)
    client = serve_runtimes(settings, metrics, [runtime]).test_client()

    loading = client.get("/healthz")
    assert loading.status_code == 503
    assert HealthResponse.model_validate(loading.get_json()).status == "loading"
    predict = client.post("/predict", json={"instances": [[1, 2, 3]]})
    assert predict.status_code == 503 and error_of(predict)["code"] == "not_ready"
    assert predict.headers["Retry-After"] == "1"
    assert client.get("/livez").status_code == 200

    runtime.load(ModelHandle.from_callable(np.sum, name="s", version="1", n_features=3))
    ready = client.get("/healthz")
    assert ready.status_code == 200
    assert ready.get_json() == {
        "status": "ready",
        "model_name": "s",
        "model_version": "1",
        "queue_depth": 0,
        "max_queue_depth": 2048,
        "execution_provider": "cpu",
        "models": [
            {
                "name": "s",
                "version": "1",
                "status": "ready",
                "queue_depth": 0,
                "max_queue_depth": 2048,
                "execution_provider": "cpu",
                "engine": "python",
            }
        ],
    }
    info = {"model": "s", "version": "1", "format": "callable", "execution_provider": "cpu",
            "engine": "python"}  # fmt: skip
    assert metrics.registry.get_sample_value("serving_model_info", {**info, "device": "cpu"}) == 1
    loads = {"model": "s", "version": "1"}
    assert metrics.registry.get_sample_value("serving_model_load_seconds_count", loads) == 1

    runtime.stop(timeout_s=10)
    assert client.get("/healthz").get_json()["status"] == "stopping"


def test_metrics_count_requests_by_route_template(
    client: FlaskClient, metrics: ServingMetrics
) -> None:
    client.post("/predict", json={"instances": [[1, 2, 3]]})
    client.post("/predict", json={"instances": []})
    client.get("/nope/42")

    def count(route: str, status: str) -> float | None:
        labels = {
            "method": "POST" if route == "/predict" else "GET",
            "route": route,
            "status": status,
        }
        return metrics.registry.get_sample_value("http_requests_total", labels)

    assert count("/predict", "200") == 1.0
    assert count("/predict", "422") == 1.0
    assert count("<unmatched>", "404") == 1.0
    client.open("/predict", method="BREW")
    brew = {"method": "other", "route": "<unmatched>", "status": "405"}
    assert metrics.registry.get_sample_value("http_requests_total", brew) == 1.0
    text = client.get("/metrics").get_data(as_text=True)
    assert 'http_requests_total{method="POST",route="/predict",status="200"} 1.0' in text
    assert 'inference_batch_size_count{engine="python",model="echo",version="7"} 1.0' in text


@pytest.mark.parametrize("estimator", ["GaussianNB", "OneVsRestClassifier"])
def test_predict_serializes_non_contiguous_model_outputs(
    settings: Settings, estimator: str
) -> None:
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.multiclass import OneVsRestClassifier
    from sklearn.naive_bayes import GaussianNB

    from serving.model.loaders import estimator_handle

    X, y = load_iris(return_X_y=True)
    model = GaussianNB() if estimator == "GaussianNB" else OneVsRestClassifier(LogisticRegression())
    model.fit(X, y)
    handle = estimator_handle(model, name="iris", version="1", format="joblib")
    app = create_app(settings, models=[handle], metrics=ServingMetrics(CollectorRegistry()))
    try:
        response = app.test_client().post("/predict", json={"instances": X[:3].tolist()})
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    assert response.status_code == 200, response.get_json()
    body = response.get_json()
    assert body["predictions"] == model.predict(X[:3]).tolist()
    np.testing.assert_allclose(body["probabilities"], model.predict_proba(X[:3]))


def test_an_overflowing_request_fails_alone_and_co_batched_requests_succeed(
    settings: Settings, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    import threading
    from concurrent.futures import ThreadPoolExecutor

    import joblib

    from serving.model.loaders import load_model
    from serving.settings import DEMO_MODEL_PATH

    X, _ = breast_cancer
    expected = joblib.load(DEMO_MODEL_PATH).predict(X[:16])
    slow = Settings(
        **{
            **settings.model_dump(),
            "batch_policy": "window",
            "max_batch_latency_ms": 200,
            "max_batch_size": 17,
        }
    )
    app = create_app(
        slow, models=[load_model(DEMO_MODEL_PATH)], metrics=ServingMetrics(CollectorRegistry())
    )
    client_lock = threading.Lock()
    barrier = threading.Barrier(17)

    def call(caller: int) -> Any:
        row = [1e308] * 30 if caller == 16 else X[caller].tolist()
        with client_lock:
            client = app.test_client()
        barrier.wait(10)
        return client.post("/predict", json={"instances": [row]})

    try:
        with ThreadPoolExecutor(17) as pool:
            responses = list(pool.map(call, range(17)))
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    # finite, valid JSON, but it overflows in the scaler: the caller's values, so a 4xx that
    # does not page anyone (an alert fires on 5xx), naming the reason
    assert responses[16].status_code == 422
    error = error_of(responses[16])
    assert error["code"] == "invalid_input" and "too large for the model" in error["message"]
    for caller in range(16):
        assert responses[caller].status_code == 200, responses[caller].get_json()
        assert responses[caller].get_json()["predictions"] == [expected[caller]]


def test_an_overflowing_instance_is_named_on_every_protocol(
    settings: Settings, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    """1.7e308 is finite JSON but overflows in the demo's scaler: the refusal names the
    instance among the request's three (the model is bisected by row on this error path)."""
    from serving.model.loaders import load_model
    from serving.settings import DEMO_MODEL_PATH

    X, _ = breast_cancer
    rows = X[:3].copy()
    rows[1, 4] = 1.7e308
    app = create_app(
        settings, models=[load_model(DEMO_MODEL_PATH)], metrics=ServingMetrics(CollectorRegistry())
    )
    client = app.test_client()
    tensor = {
        "name": "input-0",
        "shape": [3, 30],
        "datatype": "FP64",
        "data": rows.ravel().tolist(),
    }
    try:
        predict = client.post("/predict", json={"instances": rows.tolist()})
        v2 = client.post("/v2/models/breast_cancer/infer", json={"inputs": [tensor]})
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    assert predict.status_code == 422
    assert error_of(predict)["message"].startswith("instances[1]: the model cannot compute")
    assert error_of(predict)["details"][0]["loc"] == "instances[1]"
    assert v2.status_code == 400
    assert v2.get_json()["error"].startswith("instances[1]: the model cannot compute"), (
        v2.get_json()
    )


def test_values_outside_a_float32_models_range_are_422(settings: Settings) -> None:
    handle = ModelHandle.from_callable(lambda X: X[:, 0], name="f32", version="1", n_features=2)
    handle = ModelHandle(**{**handle.__dict__, "input_dtype": np.float32, "features": None})
    app = create_app(settings, models=[handle], metrics=ServingMetrics(CollectorRegistry()))
    client = app.test_client()
    try:
        bad = client.post("/predict", json={"instances": [[1.0, 2.0], [3.0, -1e39]]})
        fine = client.post("/predict", json={"instances": [[3.0e38, 1.0]]})
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    assert bad.status_code == 422
    assert error_of(bad)["message"].startswith(
        "instances[1][1]: -1e+39 is outside the model's float32"
    )
    assert fine.status_code == 200


def test_non_finite_model_outputs_become_null_in_valid_json(settings: Settings) -> None:
    import json

    def model(X: np.ndarray) -> dict[str, np.ndarray]:
        out = X[:, 0].copy()
        out[0] = np.nan
        return {"predictions": out, "probabilities": np.array([[np.inf, -np.inf]] * len(X))}

    handle = ModelHandle.from_callable(model, name="nan", version="1", n_features=1)
    app = create_app(settings, models=[handle], metrics=ServingMetrics(CollectorRegistry()))
    try:
        response = app.test_client().post("/predict", json={"instances": [[1.0], [2.0]]})
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    body = json.loads(response.get_data(as_text=True))  # strict: NaN would not parse as JSON
    assert response.status_code == 200
    assert body["predictions"] == [None, 2.0]
    assert body["probabilities"] == [[None, None], [None, None]]
    assert "NaN" not in response.get_data(as_text=True)


def test_overloaded_is_503_with_retry_after_and_counted(settings: Settings) -> None:
    import threading

    release = threading.Event()

    def slow(X: np.ndarray) -> np.ndarray:
        if X.any():  # not the warmup's zero rows
            release.wait(10)
        return X[:, 0]

    small = Settings(**{**settings.model_dump(), "max_queue_depth": 1, "max_batch_size": 1})
    metrics = ServingMetrics(CollectorRegistry())
    handle = ModelHandle.from_callable(slow, name="slow", version="1", n_features=1)
    app = create_app(small, models=[handle], metrics=metrics)
    runtime = app.extensions["serving"].get_models().default
    from concurrent.futures import ThreadPoolExecutor

    try:
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(app.test_client().post, "/predict", json={"instances": [[1.0]]})
            while not runtime.batcher.busy_for_s:
                pass
            second = pool.submit(app.test_client().post, "/predict", json={"instances": [[2.0]]})
            while runtime.queue_depth < 1:
                pass
            third = app.test_client().post("/predict", json={"instances": [[3.0]]})
            health = app.test_client().get("/healthz").get_json()
            labels = {"model": "slow", "version": "1"}
            # set when the second request queued, not only after the next predict call
            depth = metrics.registry.get_sample_value("inference_queue_depth", labels)
            release.set()
            assert first.result(10).status_code == 200 and second.result(10).status_code == 200
    finally:
        release.set()
        runtime.stop(timeout_s=10)

    assert third.status_code == 503 and depth == 1
    assert error_of(third)["code"] == "overloaded"
    assert third.headers["Retry-After"] == "1"
    labels = {"model": "slow", "version": "1"}
    assert metrics.registry.get_sample_value("inference_rejected_total", labels) == 1.0
    assert health["queue_depth"] == 1 and health["max_queue_depth"] == 1


def test_string_labels_and_numpy_outputs_serialize_as_json(settings: Settings) -> None:
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression

    from serving.model.loaders import estimator_handle

    X, y = load_iris(return_X_y=True)
    names = np.array(["setosa", "versicolor", "virginica"])[y]
    model = LogisticRegression(max_iter=1000).fit(X, names)
    handle = estimator_handle(model, name="iris", version="1", format="joblib")
    app = create_app(settings, models=[handle], metrics=ServingMetrics(CollectorRegistry()))
    try:
        response = app.test_client().post("/predict", json={"instances": X[[0, 60, 120]].tolist()})
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    body = response.get_json()
    assert response.status_code == 200
    assert body["predictions"] == model.predict(X[[0, 60, 120]]).tolist()
    assert all(isinstance(p, str) for p in body["predictions"])
    assert body["classes"] == ["setosa", "versicolor", "virginica"]


@pytest.mark.parametrize(
    ("method", "path", "body", "expected"),
    [
        ("post", "/predict", {"instances": [[1, 2, 3]]}, (200, [1])),
        ("post", "/predict", {"instances": [[1, "x", 3]]}, (422, [1])),  # fails in conform
        ("post", "/predict", {"instances": [[1, 2, 3]], "model_version": "8"}, (409, [1])),
        ("post", "/v2/models/echo/infer", {"inputs": []}, (400, [])),  # fails in the codec
        ("post", "/v1/models/echo:predict", {"instances": [[1, 2, 3]]}, (200, [1])),
        ("post", "/invocations", {"instances": [[1, 2, 3]]}, (200, [1])),
        ("get", "/healthz", None, (200, [])),
    ],
)
def test_every_request_leaves_the_count_of_requests_on_their_way_to_a_batcher(
    client: FlaskClient, method: str, path: str, body: Any, expected: tuple[int, list[int]]
) -> None:
    """The batcher's gate runs a request on its own thread only when no other is on its
    way (serving.batching.arrivals): a request that left no trace in the count, answered
    or failed, would keep every later one off that path."""
    arrivals = client.application.extensions["serving"].arrivals
    seen: list[int] = []
    plane = client.application.extensions["serving"]
    infer = plane.infer

    def spy(call: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(arrivals.count)  # counted while decoded, before the batcher
        return infer(call, *args, **kwargs)

    plane.infer = spy
    response = getattr(client, method)(path, json=body)
    status, counted = expected

    assert response.status_code == status, response.get_json()
    assert arrivals.count == 0
    assert seen == counted


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/metrics"),
        ("get", "/livez"),
        ("get", "/healthz"),
        ("get", "/openapi.json"),
        ("get", "/docs"),
        ("get", "/v2/models/echo"),
    ],
)
def test_a_request_routed_to_a_view_that_does_not_predict_leaves_the_count(
    client: FlaskClient, method: str, path: str
) -> None:
    """Found by the attack: under Gunicorn every request is counted on its way to a
    batcher from its thread taking it up, and one routed to a probe, /metrics or the docs
    stayed counted until its answer: while one ran, a batch waited for it (up to
    SERVING_MAX_BATCH_LATENCY_MS), and two clients polling /metrics raised the mean
    latency of lone requests of a 20 ms model by a quarter. Once routed elsewhere, a
    request is on its way to no batcher."""
    app = client.application
    arrivals = app.extensions["serving"].arrivals
    endpoint, _ = app.url_map.bind("localhost").match(path, method=method.upper())
    seen: list[int] = []
    view = app.view_functions[endpoint]

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(arrivals.count)
        return view(*args, **kwargs)

    app.view_functions[endpoint] = spy
    arrivals.enter()  # as Gunicorn's thread taking it up does (serving.server.hooks)
    try:
        response = getattr(client, method)(path)
    finally:
        arrivals.leave()
        app.view_functions[endpoint] = view
    assert response.status_code < 400, response.get_data()
    assert seen == [0]
    assert arrivals.count == 0


def test_a_metric_write_that_fails_fails_no_request(
    settings: Settings, model_handle: ModelHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the attack: with PROMETHEUS_MULTIPROC_DIR full, a metric write that needs
    a new key raises OSError (the file cannot grow), and the app's after-request hook let
    it through: the caller got a 500 for a side channel."""
    metrics = ServingMetrics(CollectorRegistry())

    def full(*args: Any, **kwargs: Any) -> Any:
        raise OSError(28, "No space left on device")

    app = create_app(settings, models=[model_handle], metrics=metrics)
    for metric in (
        metrics.requests,
        metrics.request_duration,
        metrics.request_outcomes,
        metrics.request_stage,
        metrics.batch_size,
        metrics.batch_compute,
    ):
        monkeypatch.setattr(metric, "labels", full)  # fmt: skip
    metrics._children.clear()
    metrics._stages.clear()
    try:
        client = app.test_client()
        answered = client.post("/predict", json={"instances": [[1.0, 2.0, 3.0]]})
        refused = client.post("/predict", json={"instances": [[1.0]]})
        probe = client.get("/livez")
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    assert answered.status_code == 200, answered.get_data(as_text=True)
    assert refused.status_code == 422
    assert probe.status_code == 200


def test_the_app_asks_once_per_function_whether_it_is_a_coroutine(
    app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """create_app's Flask caches ensure_sync (Flask's asks inspect on every request, for
    every hook and the view): a plain function is itself, asked about once; an async one
    is still handed to Flask's async_to_sync."""
    import flask.app

    asked: list[Any] = []
    real = flask.app.iscoroutinefunction
    monkeypatch.setattr(flask.app, "iscoroutinefunction", lambda f: asked.append(f) or real(f))

    def view() -> str:
        return "ok"

    async def coroutine() -> str:
        return "ok"

    assert app.ensure_sync(view) is view and app.ensure_sync(view) is view
    assert asked == [view]
    handed: list[Any] = []
    monkeypatch.setattr(app, "async_to_sync", lambda f: handed.append(f) or f)
    app.ensure_sync(coroutine)
    assert handed == [coroutine]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/predict/claim", {"instances": []}),
        ("/v2/models/claim/infer", {"inputs": []}),
        ("/v2/models/claim/versions/7/infer", {"inputs": "x"}),
        ("/v1/models/claim:predict", {"instance": [[1, 2, 3]]}),
    ],
)
def test_an_unknown_model_is_404_whatever_the_body(
    client: FlaskClient, path: str, body: dict[str, Any]
) -> None:
    """Found by the new-user trial: a misspelt model name with a bad body got the body's
    422/400, so the client fixed the body first and only then learnt of the name. The
    name is checked only once the body is refused: a good request looks its model up
    once, in the data plane."""
    response = client.post(path, json=body)

    assert response.status_code == 404, response.get_data(as_text=True)
    assert "claim" in response.get_data(as_text=True)
