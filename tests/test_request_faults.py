"""Request-level faults a hostile trial found (issue 31), each answered as a client of an
HTTP service expects: a transfer coding the server does not implement is a 501 (RFC 9112,
6.1), a doubled slash is no redirect built from the client's Host header, and the docs
page may not be framed or sniffed."""

from __future__ import annotations

import json

import pytest
from flask.testing import FlaskClient

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
