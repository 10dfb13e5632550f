"""Request-level faults a hostile trial found (issue 31), each answered as a client of an
HTTP service expects: a transfer coding the server does not implement is a 501 (RFC 9112,
6.1), a doubled slash is no redirect built from the client's Host header, and the docs
page may not be framed or sniffed."""

from __future__ import annotations

import json

import pytest
from flask.testing import FlaskClient

from serving.app import create_app
from serving.model.handle import ModelHandle
from serving.observe.metrics import ServingMetrics
from serving.settings import Settings

ROW = {"instances": [[1.0, 2.0, 3.0]]}
V2 = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP64", "data": [1.0, 2.0, 3.0]}]}
CODED = {"Transfer-Encoding": "gzip, chunked", "Content-Type": "application/json"}


@pytest.mark.parametrize(
    ("path", "body"),
    [("/predict", ROW), ("/v2/models/echo/infer", V2), ("/invocations", ROW)],
)
def test_body_with_a_transfer_coding_besides_chunked_is_501(
    client: FlaskClient, path: str, body: object
) -> None:
    """Found by the attack: ``Transfer-Encoding: gzip, chunked`` was read as if the body
    were plain (a real gzip body got a misleading 400 ``malformed_json``)."""
    response = client.post(path, data=json.dumps(body), headers=CODED)

    assert response.status_code == 501
    error = response.get_json()
    code = error["error"]["code"] if isinstance(error.get("error"), dict) else error["code"]
    assert code == "unsupported_transfer_coding"
    assert "gzip" in response.get_data(as_text=True)


def test_body_sent_chunked_alone_is_answered(client: FlaskClient) -> None:
    headers = {"Transfer-Encoding": "chunked", "Content-Type": "application/json"}
    response = client.post("/predict", data=json.dumps(ROW), headers=headers)

    assert response.status_code == 200
    assert response.get_json()["predictions"] == [1.0]


@pytest.mark.parametrize("path", ["/predict//x", "//predict", "/v2//models/echo/infer"])
def test_doubled_slash_is_a_404_not_a_redirect(client: FlaskClient, path: str) -> None:
    """Found by the attack: ``/predict//x`` answered a 308 HTML redirect whose Location
    was built from the client's Host header."""
    response = client.post(path, json=ROW, headers={"Host": "evil.example"})

    assert response.status_code == 404
    assert "Location" not in response.headers
    assert response.mimetype == "application/json"


def test_docs_page_may_not_be_framed_or_sniffed(client: FlaskClient) -> None:
    response = client.get("/docs")

    assert response.status_code == 200
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    policy = response.headers["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in policy
    assert "script-src 'self' 'sha256-" in policy  # the inline script by its hash only


BIG = "9" * 4301  # one digit past Python's limit on int(str) (sys.get_int_max_str_digits)


@pytest.mark.parametrize(
    ("path", "body", "status", "loc"),
    [
        ("/predict", '{"instances": [[1, %s, 3]]}', 422, "instances[0][1]"),
        ("/predict", '{"instances": [{"a": 1, "b": -%s}]}', 422, "instances[0].b"),
        ("/v1/models/echo:predict", '{"instances": [[1, 2, %s]]}', 422, "instances[0][2]"),
        ("/invocations", '{"dataframe_split": {"data": [[%s, 2, 3]]}}', 422, None),
        (
            "/v2/models/echo/infer",
            '{"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP64", "data": [1, 2, %s]}]}',
            400,
            "inputs[0].data[2]",
        ),
    ],
)
def test_an_integer_too_long_to_parse_is_invalid_input_as_1e309_is(  # noqa: PLR0917
    settings: Settings,
    model_handle: ModelHandle,
    metrics: ServingMetrics,
    path: str,
    body: str,
    status: int,
    loc: str | None,
) -> None:
    """Found by the hostile trial: a 4,301-digit integer got 400 ``malformed_json``
    ("number out of range"), where ``1e309`` gets 422 ``invalid_input``: valid JSON
    (RFC 8259 sets no limit), a value that does not fit, answered as one, at its place."""
    roomy = settings.model_copy(update={"max_body_bytes": 100_000})
    app = create_app(roomy, models=[model_handle], metrics=metrics)
    client = app.test_client()
    too_long = client.post(path, data=body % BIG, content_type="application/json")
    infinite = client.post(path, data=body % "1e309", content_type="application/json")

    for response in (too_long, infinite):
        assert response.status_code == status, response.get_data(as_text=True)
        error = response.get_json()
        code = error["error"]["code"] if isinstance(error.get("error"), dict) else error["code"]
        assert code == "invalid_input"
    text = too_long.get_data(as_text=True)
    app.extensions["serving"].get_models().stop(timeout_s=10)
    assert len(text) < 1000  # the digits are not quoted back
    if loc is not None:
        assert loc in text
