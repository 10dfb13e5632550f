"""GET /docs: Swagger UI from the distribution flask-swagger-ui ships, open like
/openapi.json, and a /predict example the served model answers."""

from __future__ import annotations

import re
from importlib.resources import files
from urllib.parse import urljoin

import pytest
from flask.testing import FlaskClient
from prometheus_client import CollectorRegistry

from serving.app import create_app
from serving.model.loaders import load_model
from serving.observe.metrics import ServingMetrics
from serving.protocols.docs import ASSETS
from serving.settings import DEMO_MODEL_PATH, Settings

KEY = "k" * 20


def test_docs_page_loads_every_asset_it_names_from_the_shipped_distribution(
    client: FlaskClient,
) -> None:
    page = client.get("/docs")

    assert page.status_code == 200
    assert page.mimetype == "text/html"
    html = page.get_data(as_text=True)
    named = set(re.findall(r'(?:href|src)="docs/([^"]+)"', html))
    assert named and named <= set(ASSETS)
    assert 'url: "openapi.json"' in html  # relative: works under a path prefix too
    for name in named:
        asset = client.get(f"/docs/{name}")
        assert asset.status_code == 200, name
        assert asset.mimetype == ASSETS[name]
        shipped = (files("flask_swagger_ui") / "dist" / name).read_bytes()
        assert asset.get_data() == shipped, name


@pytest.mark.parametrize("name", ["LICENSE", "..%2F..%2Fsetup.cfg", "VERSION", "index.html"])
def test_docs_serves_no_other_file(client: FlaskClient, name: str) -> None:
    assert client.get(f"/docs/{name}").status_code == 404


def test_docs_is_open_with_api_keys_while_predictions_need_one(settings: Settings) -> None:
    keyed = Settings(**{**settings.model_dump(), "api_keys": KEY})
    handle = load_model(DEMO_MODEL_PATH)
    secured = create_app(keyed, models=[handle], metrics=ServingMetrics(CollectorRegistry()))
    client = secured.test_client()
    try:
        assert client.get("/docs").status_code == 200
        assert client.get("/docs/swagger-ui-bundle.js").status_code == 200
        assert client.get("/openapi.json").status_code == 200
        assert client.post("/predict", json={"instances": [[0.0] * 30]}).status_code == 401
        # The asset route is open, but it serves the page's files only.
        assert client.get("/docs/LICENSE").status_code == 404
        assert client.get("/v2/models/breast_cancer").status_code == 401  # metadata: keyed
    finally:
        secured.extensions["serving"].get_models().stop(timeout_s=10)


def test_docs_predict_example_is_a_body_the_served_model_answers(settings: Settings) -> None:
    handle = load_model(DEMO_MODEL_PATH)
    app = create_app(settings, models=[handle], metrics=ServingMetrics(CollectorRegistry()))
    client = app.test_client()
    try:
        spec = client.get("/openapi.json").get_json()
        example = spec["paths"]["/predict"]["post"]["requestBody"]["content"]["application/json"][
            "example"
        ]
        answer = client.post("/predict", json=example)
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    assert answer.status_code == 200, answer.get_data(as_text=True)
    expected = handle.predict_batch(handle.sample(1))["predictions"].tolist()
    assert answer.get_json()["predictions"] == expected


def test_docs_with_a_trailing_slash_redirects_to_the_page(client: FlaskClient) -> None:
    """Reported by the new-user trial: /docs/ was a 404."""
    response = client.get("/docs/")
    assert response.status_code == 308
    # Relative, as a browser resolves it: the page also behind a proxy's path prefix.
    location = response.headers["Location"]
    assert urljoin("http://host/docs/", location) == "http://host/docs"
    assert urljoin("http://host/prefix/docs/", location) == "http://host/prefix/docs"
