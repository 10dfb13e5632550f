"""The README's request examples are valid against the OpenAPI document, and really work."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from flask.testing import FlaskClient
from jsonschema import Draft202012Validator
from prometheus_client import CollectorRegistry
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from serving.app import create_app
from serving.model.loaders import load_model
from serving.observe.metrics import ServingMetrics
from serving.settings import DEMO_MODEL_PATH, Settings

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
#: The README and every guide under docs/ (the dated measurement log aside).
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
#: ``curl ... http://host:port/PATH ... -d 'BODY'`` in the docs, one command per match.
CURL = re.compile(r"curl [^\n]*?https?://[^/\s]+(/[^\s'\"]*)[^\n]*?-d '([^']*)'")


def readme_requests() -> list[tuple[str, Any]]:
    return [
        (path, json.loads(body)) for doc in DOCS for path, body in CURL.findall(doc.read_text())
    ]


def operation_for(spec: dict[str, Any], path: str) -> dict[str, Any]:
    for template, item in spec["paths"].items():
        pattern = re.sub(r"\\{\w+\\}", r"[^/]+", re.escape(template))
        if re.fullmatch(pattern, path) and "post" in item:
            operation: dict[str, Any] = item["post"]
            return operation
    raise AssertionError(f"README posts to {path}, which /openapi.json does not document")


def test_every_readme_request_body_matches_the_openapi_schema(client: FlaskClient) -> None:
    spec = client.get("/openapi.json").get_json()
    registry: Registry = Registry().with_resource(
        "urn:serving", Resource.from_contents(spec, default_specification=DRAFT202012)
    )
    examples = readme_requests()
    assert examples, "no curl -d examples found in README.md"
    for path, body in examples:
        content = operation_for(spec, path)["requestBody"]["content"]
        schema = next(iter(content.values()))["schema"]
        ref = {"$ref": "urn:serving" + schema["$ref"]} if "$ref" in schema else schema
        errors = list(Draft202012Validator(ref, registry=registry).iter_errors(body))
        assert not errors, f"README example for {path}: {errors[0].message}"


def test_the_readme_predict_example_is_answered_by_the_demo_model(settings: Settings) -> None:
    demo = load_model(DEMO_MODEL_PATH, version="1")  # what the README's command serves
    app = create_app(settings, models=[demo], metrics=ServingMetrics(CollectorRegistry()))
    try:
        path, body = next((p, b) for p, b in readme_requests() if p == "/predict")
        response = app.test_client().post(path, json=body)
        assert response.status_code == 200, response.get_json()
        assert response.get_json()["predictions"] == [0]  # the README shows class 0
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)


def test_the_readme_own_model_example_is_answered_as_the_churn_pipeline_in_process(
    settings: Settings, tmp_path: Path
) -> None:
    """The README's "Serve your own model" curl and docs/api.md's V2 one, sent to
    ``examples/churn.py``'s model served as its file names it (``churn``), answer as the
    pipeline does on a DataFrame of the same rows."""
    import pandas as pd

    from tests.tabular import write_churn

    model, joblib_path, _ = write_churn(tmp_path)
    served = load_model(joblib_path, version="1")
    app = create_app(settings, models=[served], metrics=ServingMetrics(CollectorRegistry()))
    try:
        path, body = next((p, b) for p, b in readme_requests() if p == "/predict/churn")
        response = app.test_client().post(path, json=body)
        v2_path, v2_body = next((p, b) for p, b in readme_requests() if "churn/infer" in p)
        v2 = app.test_client().post(v2_path, json=v2_body)
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    assert served.name == "churn"
    assert response.status_code == v2.status_code == 200, (response.get_json(), v2.get_json())
    rows = pd.DataFrame(body["instances"]).astype({"seats": float, "usage_hours": float})
    assert response.get_json()["predictions"] == model.predict(rows).tolist()
    assert response.get_json()["probabilities"] == model.predict_proba(rows).tolist()
    columns = {t["name"]: t["data"] for t in v2_body["inputs"]}
    v2_rows = pd.DataFrame(columns).astype({"seats": float, "usage_hours": float})
    labels, probabilities = (output["data"] for output in v2.get_json()["outputs"])
    assert labels == model.predict(v2_rows).tolist()
    assert probabilities == model.predict_proba(v2_rows).ravel().tolist()


def test_readme_layout_names_every_module_and_folder_and_only_those() -> None:
    """The Layout drawing (docs/architecture.md) is the map of ``serving/``: a module
    added, moved or removed shows there, as the folders' import rules do in
    tests/test_boundaries.py."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    drawing = text[text.index("```\nserving/\n") : text.index("`deploy/` holds nginx")]
    package = ROOT / "serving"
    modules = {p.name for p in package.rglob("*.py") if p.name != "__init__.py"}
    named = set(re.findall(r"(?<![\w.])([a-z_]+\.py)\b", drawing))
    assert modules - named == set(), "modules missing from the README's Layout"
    assert named - modules == set(), "the README's Layout names modules that do not exist"
    folders = {p.name for p in package.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert {f for f in folders if f"  {f}/" not in drawing} == set()


def test_readme_is_a_front_door_and_links_only_to_what_exists() -> None:
    """The README is read in ten minutes (issue 31: at most ~250 lines); the details live
    in docs/, and every relative link of the README and the guides resolves."""
    assert len(README.read_text().splitlines()) <= 250
    for doc in [*DOCS, ROOT / "CONTRIBUTING.md"]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", doc.read_text()):
            assert (doc.parent / target).exists(), f"{doc.name} links to {target}, missing"
