"""Written boundaries, checked: the batcher and loaders import no web stack or metrics,
the data plane and the model cache it resolves from import no Flask, and every
prediction route goes through ``DataPlane.infer``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from serving.app import create_app
from serving.handle import ModelHandle
from serving.metrics import ServingMetrics
from serving.settings import DEMO_MODEL_PATH, ModelSpec, Settings

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = ("flask", "werkzeug", "pydantic", "prometheus_client", "gunicorn")


def fresh_python(code: str) -> str:
    """Run ``code`` in a new interpreter (nothing imported yet) and return what it printed."""
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
        check=True,
    )  # fmt: skip
    return result.stdout.strip()


@pytest.mark.parametrize(
    "module",
    [
        "serving.batching",
        "serving.handoff",
        "serving.pending",
        "serving.handle",
        "serving.loaders",
        "serving.onnx_loader",
        "serving.custom",
        "serving.providers",
        "serving.errors",
        "serving.instances",
        "serving.conform",
        "serving.values",
        "serving.schema",
        "serving.schema_sklearn",
        "serving.schema_onnx",
        "serving.artifacts",
    ],
)
def test_core_module_imports_no_web_stack(module: str) -> None:
    code = (
        f"import sys, {module}\n"
        f"print(','.join(sorted(m for m in {FORBIDDEN!r} if m in sys.modules)))"
    )
    assert fresh_python(code) == ""


@pytest.mark.parametrize("module", ["serving.dataplane", "serving.cache", "serving.runtime"])
def test_data_plane_imports_no_web_framework(module: str) -> None:
    """The data plane records metrics (prometheus) and reads ``Settings`` (pydantic), but
    knows nothing of HTTP: no Flask, no werkzeug, no Gunicorn."""
    web = ("flask", "werkzeug", "gunicorn")
    code = f"import sys, {module}\nprint(','.join(sorted(m for m in {web!r} if m in sys.modules)))"
    assert fresh_python(code) == ""


def infer_calls(plane: Any, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The positional arguments of every ``plane.infer`` call from now on (it still runs)."""
    calls: list[tuple[Any, ...]] = []
    infer = plane.infer

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return infer(*args, **kwargs)

    monkeypatch.setattr(plane, "infer", spy)
    return calls


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/predict", {"json": {"instances": [[1, 2, 3]]}}),
        ("post", "/predict/echo", {"json": {"instances": [[1, 2, 3]]}}),
        ("post", "/v2/models/echo/infer", {"json": {"inputs": [
            {"name": "input-0", "shape": [1, 3], "datatype": "FP64", "data": [1, 2, 3]}
        ]}}),
        ("post", "/v2/models/echo/versions/7/infer", {"json": {"inputs": [
            {"name": "input-0", "shape": [1, 3], "datatype": "FP64", "data": [1, 2, 3]}
        ]}}),
        ("post", "/v1/models/echo:predict", {"json": {"instances": [[1, 2, 3]]}}),
        ("post", "/v1/models/echo/versions/7:predict", {"json": {"inputs": [[1, 2, 3]]}}),
        ("post", "/invocations", {"json": {"dataframe_split": {"data": [[1, 2, 3]]}}}),
        ("post", "/invocations", {"data": "a,b,c\n1,2,3\n", "content_type": "text/csv"}),
    ],
)  # fmt: skip
def test_every_prediction_route_goes_through_the_data_plane_once(
    app: Flask, monkeypatch: pytest.MonkeyPatch, method: str, path: str, body: dict[str, Any]
) -> None:
    plane = app.extensions["serving"]
    calls = infer_calls(plane, monkeypatch)
    response = getattr(app.test_client(), method)(path, **body)

    assert response.status_code == 200, response.get_data(as_text=True)
    assert len(calls) == 1


def test_the_tf_label_route_goes_through_the_data_plane_once(
    settings: Settings,
    model_handle: ModelHandle,
    metrics: ServingMetrics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entry = {"name": "echo", "version": "7", "path": DEMO_MODEL_PATH, "labels": {"stable": "7"}}
    labelled = settings.model_copy(update={"models": [ModelSpec(**entry)]})
    app = create_app(labelled, models=[model_handle], metrics=metrics)
    plane = app.extensions["serving"]
    calls = infer_calls(plane, monkeypatch)
    try:
        response = app.test_client().post(
            "/v1/models/echo/labels/stable:predict", json={"inputs": [[1, 2, 3]]}
        )
    finally:
        plane.get_models().stop(timeout_s=10)

    assert response.status_code == 200, response.get_data(as_text=True)
    assert [call[:2] for call in calls] == [("echo", "7")]


def test_every_post_route_is_a_prediction_route_checked_above(app: Flask) -> None:
    """A new POST route must be added to the data-plane check above (V2's repository
    index is the one POST that predicts nothing)."""
    posts = {rule.rule for rule in app.url_map.iter_rules() if "POST" in (rule.methods or ())}
    posts.discard("/v2/repository/index")
    assert posts == {
        "/predict",
        "/predict/<model_name>",
        "/v2/models/<model_name>/infer",
        "/v2/models/<model_name>/versions/<model_version>/infer",
        "/v1/models/<tf_model:model_name>:predict",
        "/v1/models/<tf_model:model_name>/versions/<model_version>:predict",
        "/v1/models/<tf_model:model_name>/labels/<tf_model:label>:predict",
        "/invocations",
    }


def test_gunicorn_config_does_not_import_prometheus_in_the_master() -> None:
    code = (
        "import runpy, sys\n"
        "runpy.run_path('gunicorn.conf.py')\n"
        "print('prometheus_client' in sys.modules, 'flask' in sys.modules)"
    )
    assert fresh_python(code) == "False False"
