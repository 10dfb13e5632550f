"""The ``/predict`` fast path (``serving.protocols.predict.fast``) answers as the Flask
route does: the same status line, headers and body bytes, the same request metrics, access
log line and error log, over a corpus of good and bad requests to every kind of model
served here (a DataFrame pipeline, one with categories, a positional model that fails on
some rows, one that is not ready), with and without API keys.

Each request is sent twice, as two fresh WSGI environs: once to the app's WSGI callable,
once to the Flask app behind it. Only ``latency_ms`` (a clock) and a request id the server
made up differ, and are masked."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pytest
from flask import Flask, request_started
from prometheus_client import CollectorRegistry
from werkzeug.test import EnvironBuilder

from serving.app import create_app
from serving.cache import ModelCache
from serving.model.loaders import estimator_handle
from serving.observe import access_log
from serving.observe.metrics import ServingMetrics
from serving.protocols.predict.fast import FastPredict
from serving.runtime import ModelRuntime
from serving.settings import Settings
from tests.conftest import unit_settings
from tests.models import FailsOnNegative
from tests.tabular import tier_pipeline

KEY = "k" * 20
LATENCY = re.compile(rb'"latency_ms":[-+0-9.e]+')
N = 100_000
NUMBERS = ",".join(["1"] * N)
KEYS = ", ".join(f'"k{i}": 0' for i in range(N))

CANCER = {"mean radius": 17.99, "mean texture": 10.38, "mean perimeter": 122.8, "mean area": 1001}
ROW = list(CANCER.values())
TIER = {"tier": 2, "plan": "basic", "usage": 30}
UNKNOWN_TIER = {"tier": 0, "plan": "gold", "usage": 3}
JSON = "application/json"


@dataclass(frozen=True)
class Sent:
    """One request as a server hands it to the app."""

    path: str = "/predict"
    body: bytes | str | None = None
    json: Any = None
    content_type: str | None = "application/json"
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)
    chunked: bool = False

    def environ(self) -> dict[str, Any]:
        data = self.body if self.json is None else __import__("json").dumps(self.json)
        builder = EnvironBuilder(
            path="/", method=self.method, data=data, headers=self.headers,
            content_type=self.content_type,
        )  # fmt: skip
        environ = builder.get_environ()
        environ["PATH_INFO"] = self.path  # as the server decoded it, unquoted
        if self.content_type is None:
            environ.pop("CONTENT_TYPE", None)
        if self.chunked:
            del environ["CONTENT_LENGTH"]
            environ["wsgi.input_terminated"] = True
        return environ


#: (id, request, whether the fast path answers it rather than handing it to Flask)
CORPUS: list[tuple[str, Sent, bool]] = [
    ("list", Sent(json={"instances": [ROW]}), True),
    ("records", Sent(json={"instances": [CANCER, CANCER]}), True),
    ("with-id", Sent(json={"instances": [ROW]}, headers={"X-Request-ID": "abc-123"}), True),
    ("bad-id", Sent(json={"instances": [ROW]}, headers={"X-Request-ID": "a b"}), True),
    ("null", Sent(json={"instances": [[None, 1, 2, 3]]}), True),
    ("nan", Sent(body='{"instances": [[NaN, 1, 2, 3]]}'), True),
    ("1e400", Sent(body='{"instances": [[1e400, 1, 2, 3]]}'), True),
    ("string-number", Sent(json={"instances": [["1", 1, 2, 3]]}), True),
    ("bool", Sent(json={"instances": [[True, 1, 2, 3]]}), True),
    ("short-row", Sent(json={"instances": [[1, 2]]}), True),
    ("long-row", Sent(json={"instances": [[1, 2, 3, 4, 5]]}), True),
    ("missing-name", Sent(json={"instances": [{"mean radius": 1}]}), True),
    ("unknown-name", Sent(json={"instances": [{**CANCER, "colour": 1}]}), True),
    ("mixed", Sent(json={"instances": [ROW, CANCER]}), True),
    ("outputs", Sent(json={"instances": [ROW], "outputs": ["predictions"]}), True),
    ("unknown-output", Sent(json={"instances": [ROW], "outputs": ["nope"]}), True),
    ("version", Sent(json={"instances": [ROW], "model_version": "2"}), True),
    ("other-version", Sent(json={"instances": [ROW], "model_version": "3"}), True),
    ("body-model", Sent(json={"instances": [TIER], "model": "tier"}), True),
    ("unknown-category", Sent(json={"instances": [UNKNOWN_TIER], "model": "tier"}), True),
    ("unknown-model", Sent(json={"instances": [ROW], "model": "nope"}), True),
    ("too-many", Sent(json={"instances": [ROW] * 17}), True),
    ("empty-list", Sent(json={"instances": []}), True),
    ("no-instances", Sent(json={"instance": [ROW]}), True),
    ("v2-body", Sent(json={"inputs": [{"name": "a", "shape": [1], "data": [1]}]}), True),
    ("not-a-list", Sent(json={"instances": 5}), True),
    ("not-json", Sent(body="{"), True),
    ("empty", Sent(body=""), True),
    ("bom", Sent(body=b'\xef\xbb\xbf{"instances": [[1, 2, 3, 4]]}'), True),
    ("latin-1", Sent(body=b'{"instances": [["\xe9", 1, 2, 3]]}'), True),
    ("surrogate", Sent(body='{"instances": [["\\ud800", 1, 2, 3]]}'), True),
    ("nul-key", Sent(body='{"instances": [{"\\u0000": 1}]}'), True),
    ("duplicate-key", Sent(body='{"instances": [[1, 2, 3, 4]], "instances": [[5]]}'), True),
    ("deep", Sent(body='{"instances": ' + "[" * 5000 + "]" * 5000 + "}"), True),
    ("numbers", Sent(body=f'{{"instances": [{NUMBERS}]}}'), True),
    ("keys", Sent(body=f'{{"instances": [[1, 2, 3, 4]], {KEYS}}}'), True),
    ("too-large", Sent(body=b" " * 2_000_001), True),
    ("chunked", Sent(json={"instances": [ROW]}, chunked=True), True),
    ("chunked-too-large", Sent(body=b" " * 2_000_001, chunked=True), True),
    ("no-content-type", Sent(json={"instances": [ROW]}, content_type=None), True),
    ("text-plain", Sent(json={"instances": [ROW]}, content_type="text/plain"), True),
    ("charset", Sent(json={"instances": [ROW]}, content_type=f"{JSON}; charset=utf-8"), True),
    ("plus-json", Sent(json={"instances": [ROW]}, content_type="application/vnd.x+json"), True),
    ("gzip", Sent(json={"instances": [ROW]}, headers={"Content-Encoding": "gzip"}), True),
    (
        "utf-16",
        Sent(body='{"instances": [[1]]}'.encode("utf-16"), content_type=f"{JSON}; charset=utf-16"),
        True,
    ),
    ("upper-case", Sent(json={"instances": [ROW]}, content_type="APPLICATION/JSON"), True),
    ("named", Sent("/predict/tier", json={"instances": [TIER]}), True),
    (
        "named-body-names-other",
        Sent("/predict/tier", json={"instances": [ROW], "model": "x"}),
        True,
    ),
    ("named-unknown", Sent("/predict/nope", json={"instances": [ROW]}), True),
    ("named-unknown-bad-body", Sent("/predict/nope", body="{"), True),
    (
        "named-bad-version",
        Sent("/predict/cancer", json={"instances": [ROW], "model_version": "9"}),
        True,
    ),
    ("named-dots", Sent("/predict/..", json={"instances": [ROW]}), True),
    ("named-space", Sent("/predict/a b", json={"instances": [ROW]}), True),
    ("model-fails", Sent("/predict/fails", json={"instances": [[-1, 2, 3]]}), True),
    ("model-answers", Sent("/predict/fails", json={"instances": [[1, 2, 3], [4, 5, 6]]}), True),
    ("not-ready", Sent("/predict/loading", json={"instances": [[1, 2, 3]]}), True),
    ("named-percent", Sent("/predict/a%41", json={"instances": [ROW]}), False),
    ("named-unicode", Sent("/predict/\xc3\xa9", json={"instances": [ROW]}), False),
    ("named-slash", Sent("/predict/tier/x", json={"instances": [ROW]}), False),
    ("named-empty", Sent("/predict/", json={"instances": [ROW]}), False),
    ("double-slash", Sent("/predict//tier", json={"instances": [ROW]}), False),
    ("get", Sent(method="GET", content_type=None), False),
    ("head", Sent(method="HEAD", content_type=None), False),
    ("put", Sent(method="PUT", json={"instances": [ROW]}), False),
    ("other-route", Sent("/predictions", json={"instances": [ROW]}), False),
    # A Host werkzeug's URL map will not bind to (a label empty or over 63 characters):
    # Flask answers 400 before routing.
    ("host-long-label", Sent(json={"instances": [ROW]}, headers={"Host": "a" * 64}), False),
    ("host-empty-label", Sent(json={"instances": [ROW]}, headers={"Host": "a..b"}), False),
    ("host-dot", Sent("/predict/tier", json={"instances": [TIER]}, headers={"Host": "."}), False),
]


def served(frame_classifier: tuple[Any, pd.DataFrame], **overrides: Any) -> Flask:
    """The app under test: ``cancer`` (the default: a DataFrame pipeline, named features),
    ``tier`` (categories), ``fails`` (positional, fails on a negative first feature) and
    ``loading`` (never ready)."""
    settings = unit_settings(
        pytest.MonkeyPatch(), max_body_bytes=2_000_000, max_batch_latency_ms=1, **overrides
    )
    metrics = ServingMetrics(CollectorRegistry())
    handles = [
        estimator_handle(frame_classifier[0], name="cancer", version="2", format="pickle"),
        estimator_handle(tier_pipeline()[0], name="tier", version="1", format="pickle"),
        estimator_handle(FailsOnNegative(3), name="fails", version="1", format="pickle"),
    ]
    runtimes = []
    for handle in handles:
        runtime = ModelRuntime(settings, metrics)
        runtime.load(handle)
        runtimes.append(runtime)
    runtimes.append(ModelRuntime(Settings(**{**settings.model_dump(), "model_name": "loading"}),
                                 metrics))  # fmt: skip
    app = create_app(settings, models=ModelCache(settings, metrics, runtimes=runtimes),
                     metrics=metrics)  # fmt: skip
    app.config["metrics"] = metrics
    return app


@pytest.fixture(scope="module")
def app(frame_classifier: tuple[Any, pd.DataFrame]) -> Iterator[Flask]:
    app = served(frame_classifier)
    yield app
    app.extensions["serving"].get_models().stop(timeout_s=10)


@pytest.fixture(scope="module")
def keyed_app(frame_classifier: tuple[Any, pd.DataFrame]) -> Iterator[Flask]:
    app = served(frame_classifier, api_keys=KEY)
    yield app
    app.extensions["serving"].get_models().stop(timeout_s=10)


@dataclass
class Exchange:
    """What one request did: its answer, and what the server counted and logged."""

    status: str
    headers: list[tuple[str, str]]
    body: bytes
    flask_ran: bool
    counted: dict[tuple[str, tuple[tuple[str, str], ...]], float]
    access: list[dict[str, Any]]
    logged: list[tuple[str, str, bool]]


def exchange(
    app: Flask,
    wsgi: Callable[..., Any],
    sent: Sent,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> Exchange:
    """Send ``sent`` to ``wsgi`` (the app's WSGI callable, or the Flask app behind it)."""
    answered: list[Any] = []
    flask_ran: list[object] = []
    access: list[dict[str, Any]] = []
    monkeypatch.setattr(access_log, "record", lambda fields: access.append(dict(fields)))
    before = _request_counts(app)
    caplog.clear()
    with (
        caplog.at_level(logging.INFO, logger="serving"),
        request_started.connected_to(lambda sender, **extra: flask_ran.append(sender), app),
    ):
        chunks = wsgi(sent.environ(), lambda status, headers, exc_info=None: answered.append(
            (status, list(headers))
        ))  # fmt: skip
        body = b"".join(chunks)
        getattr(chunks, "close", lambda: None)()
    after = _request_counts(app)
    counted = {key: value - before.get(key, 0.0) for key, value in after.items()}
    logged = [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records]
    ((status, headers),) = answered
    return Exchange(
        status, headers, body, bool(flask_ran), {k: v for k, v in counted.items() if v}, access,
        logged,
    )  # fmt: skip


def both(
    app: Flask, sent: Sent, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> tuple[Exchange, Exchange]:
    """``sent`` to the app's WSGI callable (the fast path), then to the Flask app behind it."""
    wsgi = app.wsgi_app
    assert isinstance(wsgi, FastPredict)
    ours = exchange(app, wsgi, sent, monkeypatch, caplog)
    return ours, exchange(app, wsgi.flask_app, sent, monkeypatch, caplog)


def _request_counts(app: Flask) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The request metrics' counts: requests by method, route and status, durations by
    method and route."""
    counts = {}
    for family in app.config["metrics"].registry.collect():
        for sample in family.samples:
            if sample.name in ("http_requests_total", "http_request_duration_seconds_count"):
                counts[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return counts


def masked(answer: Exchange, sent: Sent) -> Exchange:
    """``answer`` without what differs between two answers to the same request: the
    latency in the body (so its length) and the access log, a request id the server made
    up. A Content-Length that is the body's is kept as ``"="``."""
    given = sent.headers.get("X-Request-ID") == "abc-123"
    ids = {v for k, v in answer.headers if k == "X-Request-ID"}
    headers = [(k, "*" if k == "X-Request-ID" and not given else v) for k, v in answer.headers]
    headers = [
        (k, "=" if k == "Content-Length" and v == str(len(answer.body)) else v) for k, v in headers
    ]
    access = [{**f, "latency_ms": 0, **({} if given else {"request_id": "*"})}
              for f in answer.access]  # fmt: skip
    logged = [(level, message if given else _without(message, ids), info)
              for level, message, info in answer.logged]  # fmt: skip
    body = LATENCY.sub(b'"latency_ms":0', answer.body)
    return Exchange(answer.status, headers, body, False, answer.counted, access, logged)


def _without(message: str, ids: set[str]) -> str:
    for request_id in ids:
        message = message.replace(request_id, "*")
    return message


@pytest.mark.parametrize(("sent", "fast"), [pytest.param(s, f, id=i) for i, s, f in CORPUS])
def test_fast_path_answers_as_flask_does(
    app: Flask,
    sent: Sent,
    fast: bool,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ours, flasks = both(app, sent, monkeypatch, caplog)

    assert ours.flask_ran is not fast and flasks.flask_ran
    assert masked(ours, sent) == masked(flasks, sent)
    assert ours.counted and ours.access, "the request was not counted or logged"


KEYED = [
    ("no-key", {}),
    ("wrong-key", {"X-API-Key": "w" * 20}),
    ("x-api-key", {"X-API-Key": KEY}),
    ("bearer", {"Authorization": f"Bearer {KEY}"}),
    ("bearer-case", {"Authorization": f"bearer  {KEY} "}),
]


@pytest.mark.parametrize("headers", [pytest.param(h, id=i) for i, h in KEYED])
@pytest.mark.parametrize("path", ["/predict", "/predict/tier"])
def test_fast_path_checks_api_keys_as_flask_does(
    keyed_app: Flask,
    headers: dict[str, str],
    path: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    row = TIER if path.endswith("tier") else CANCER
    sent = Sent(path, json={"instances": [row]}, headers=headers)

    ours, flasks = both(keyed_app, sent, monkeypatch, caplog)

    assert not ours.flask_ran
    assert masked(ours, sent) == masked(flasks, sent)
    assert ours.status.startswith("200" if KEY in str(headers) else "401")


def test_fast_path_answers_equal_the_model_in_process(
    app: Flask, frame_classifier: tuple[Any, pd.DataFrame]
) -> None:
    """The fast path's answers are the model's: 16 rows of the training frame."""
    model, frame = frame_classifier
    rows = frame.iloc[:16]
    response = app.test_client().post(
        "/predict", json={"instances": rows.to_dict(orient="records")}
    )

    assert response.status_code == 200, response.get_data()
    answer = response.get_json()
    assert answer["predictions"] == model.predict(rows).tolist()
    assert np.array_equal(answer["probabilities"], model.predict_proba(rows))
