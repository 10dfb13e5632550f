"""OnnxLoader on real graphs: providers, inputs (cast, fixed batch, several), outputs, cache."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from flask.testing import FlaskClient
from skl2onnx import to_onnx
from skl2onnx.common.data_types import FloatTensorType

from serving.errors import ModelLoadError
from serving.model.loaders import load_model
from serving.model.onnx_loader import OnnxLoader
from serving.model.providers import CUDA, cuda_device_count, provider_problem
from serving.settings import Settings
from tests.onnx_graphs import WEIGHTS, image_graph, multi_input_graph, scale_graph
from tests.test_loaders import DEMO_MODEL_PATH, DEMO_ONNX_PATH

ROOT = Path(__file__).resolve().parent.parent


def test_auto_runs_on_what_the_host_has_and_logs_no_error() -> None:
    code = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)\n"
        "from pathlib import Path\n"
        "from serving.model.onnx_loader import OnnxLoader\n"
        f"path = Path({str(DEMO_ONNX_PATH)!r})\n"
        "h = OnnxLoader('auto').load(path, path.read_bytes(), name='d', version='1')\n"
        "print(h.execution_provider)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
        check=True,
    )  # fmt: skip
    expected = "CPUExecutionProvider" if provider_problem(CUDA) else "CUDAExecutionProvider"
    assert result.stdout.strip() == expected
    # onnxruntime's own error lines look like "[E:onnxruntime:...]"; ours "ERROR:serving..."
    assert "[E:" not in result.stderr and "ERROR" not in result.stderr, result.stderr
    assert f"runs on {expected}" in result.stderr


@pytest.mark.skipif(provider_problem(CUDA) is None, reason="this host has a usable GPU")
def test_explicit_cuda_without_a_usable_gpu_fails_the_load_with_the_reason() -> None:
    with pytest.raises(ModelLoadError) as caught:
        load_model(DEMO_ONNX_PATH, loaders={"onnx": OnnxLoader("cuda,cpu")})
    message = str(caught.value)
    assert message.startswith(f"cannot load model {DEMO_ONNX_PATH}: SERVING_ONNX_PROVIDERS=cuda")
    reason = "no CUDA device is visible" if cuda_device_count() == 0 else "cannot be loaded"
    assert reason in message


def test_cpu_handle_reports_its_provider_and_no_device() -> None:
    handle = load_model(DEMO_ONNX_PATH, loaders={"onnx": OnnxLoader("cpu")})
    assert (handle.execution_provider, handle.device_id) == ("CPUExecutionProvider", None)
    assert handle.output_names == ("predictions", "probabilities")


def test_fixed_batch_graph_is_served_for_any_batch_size(tmp_path: Path) -> None:
    handle = load_model(scale_graph(tmp_path / "fixed.onnx", batch=4))
    rng = np.random.default_rng(1)
    for n in (1, 3, 4, 5, 9):
        rows = rng.normal(size=(n, 3))
        outputs = handle.predict_batch(rows)
        np.testing.assert_allclose(outputs["predictions"], 2 * rows, rtol=1e-6)
    assert handle.warmup(1, 32)


def test_fixed_batch_classifier_matches_the_joblib_pipeline_on_every_row(
    tmp_path: Path, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    import joblib

    X, _ = breast_cancer
    pipeline = joblib.load(DEMO_MODEL_PATH)
    graph = to_onnx(
        pipeline,
        initial_types=[("X", FloatTensorType([8, 30]))],
        options={id(pipeline): {"zipmap": False}},
        target_opset=17,
    )
    path = tmp_path / "fixed8.onnx"
    path.write_bytes(graph.SerializeToString())

    outputs = load_model(path).predict_batch(X)  # 569 rows: 71 chunks of 8 and a padded one

    np.testing.assert_array_equal(outputs["predictions"], pipeline.predict(X))
    np.testing.assert_allclose(outputs["probabilities"], pipeline.predict_proba(X), atol=1e-5)


def test_multi_input_graph_takes_its_inputs_as_named_feature_columns(tmp_path: Path) -> None:
    handle = load_model(multi_input_graph(tmp_path / "multi.onnx"))
    rows = np.array([[1.5, 2.0, 3.0, 4.0], [-1.0, 0.5, 0.25, 7.0]])

    outputs = handle.predict_batch(rows)

    assert handle.n_features == 4
    assert handle.feature_names == ("a", "b[0]", "b[1]", "n")
    assert tuple(f.dtype for f in handle.features or ()) == tuple(
        np.dtype(t) for t in ("f4", "f8", "f8", "i8")
    )
    assert np.dtype(handle.input_dtype) == np.float32
    assert handle.output_names == ("predictions", "features")
    np.testing.assert_allclose(outputs["predictions"], (rows @ WEIGHTS).ravel(), rtol=1e-6)
    np.testing.assert_allclose(outputs["features"], rows, rtol=1e-6)


def test_an_input_that_is_not_a_matrix_is_refused_at_load(tmp_path: Path) -> None:
    path = image_graph(tmp_path / "image.onnx")
    with pytest.raises(ModelLoadError, match=r"shape \['batch', 3, 8, 8\]; inputs must be"):
        load_model(path)


def test_dynamic_feature_axis_leaves_n_features_unknown(tmp_path: Path) -> None:
    handle = load_model(scale_graph(tmp_path / "any.onnx", batch="N", n_features="F"))
    assert handle.n_features is None and handle.warmup(1) is False
    np.testing.assert_allclose(handle.predict_batch(np.ones((2, 5)))["predictions"], 2.0)


def test_optimized_graph_is_saved_then_reused_until_the_source_changes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = tmp_path / "demo.onnx"
    source.write_bytes(DEMO_ONNX_PATH.read_bytes())
    cached = tmp_path / "cache" / "demo.optimized.onnx"
    cached.parent.mkdir()
    loader = OnnxLoader("cpu", optimized_model_path=cached)
    rows = np.random.default_rng(2).normal(size=(5, 30)) * 10
    caplog.set_level(logging.INFO, logger="serving.model")

    first = load_model(source, loaders={"onnx": loader}).predict_batch(rows)
    assert cached.is_file() and cached.with_name(cached.name + ".json").is_file()
    assert "saved the optimized graph" in caplog.text
    caplog.clear()
    second = load_model(source, loaders={"onnx": loader}).predict_batch(rows)
    assert "reusing the optimized graph" in caplog.text
    np.testing.assert_array_equal(first["predictions"], second["predictions"])
    np.testing.assert_allclose(first["probabilities"], second["probabilities"], rtol=1e-6)

    caplog.clear()
    os.utime(source, ns=(1, 1))  # a new artifact under the same name
    load_model(source, loaders={"onnx": loader})
    assert "saved the optimized graph" in caplog.text
    assert not list(cached.parent.glob(".*.tmp"))


@pytest.fixture
def multi_input_client(settings: Settings, tmp_path: Path) -> Iterator[FlaskClient]:
    from prometheus_client import CollectorRegistry

    from serving.app import create_app
    from serving.observe.metrics import ServingMetrics

    handle = load_model(multi_input_graph(tmp_path / "multi.onnx"), name="multi")
    app = create_app(settings, models=[handle], metrics=ServingMetrics(CollectorRegistry()))
    yield app.test_client()
    app.extensions["serving"].get_models().stop(timeout_s=10)


def test_predict_returns_named_outputs_when_asked(multi_input_client: FlaskClient) -> None:
    rows = [[1.0, 2.0, 3.0, 4.0], [0.5, 0.0, 0.0, -2.0]]
    response = multi_input_client.post(
        "/predict", json={"instances": rows, "outputs": ["features"]}
    )
    assert response.status_code == 200, response.get_json()
    body = response.get_json()
    assert body["predictions"] == pytest.approx((np.array(rows) @ WEIGHTS).ravel().tolist())
    assert body["outputs"] == {"features": rows}
    plain = multi_input_client.post("/predict", json={"instances": rows}).get_json()
    assert "outputs" not in plain


def test_predict_refuses_an_output_the_model_does_not_have(multi_input_client: FlaskClient) -> None:
    response = multi_input_client.post(
        "/predict", json={"instances": [[1, 2, 3, 4]], "outputs": ["features", "logits"]}
    )
    assert response.status_code == 422
    error = response.get_json()["error"]
    assert error["details"][0]["loc"] == "outputs[1]"
    assert "no output 'logits' (it has predictions, features)" in error["message"]


@pytest.mark.parametrize(
    ("row", "loc", "why"),
    [
        (
            [1.0, 2.0, 3.0, 2.5],
            "instances[0][3] (feature 'n')",
            "not an integer the model's int64 input",
        ),
        (
            [1e39, 2.0, 3.0, 4.0],
            "instances[0][0] (feature 'a')",
            "outside the model's float32 range",
        ),
        (
            [1.0, 1e300, 3.0, 1e19],
            "instances[0][3] (feature 'n')",
            "not an integer the model's int64 input",
        ),
    ],
)
def test_each_input_column_is_checked_against_its_own_type(
    multi_input_client: FlaskClient, row: list[float], loc: str, why: str
) -> None:
    response = multi_input_client.post("/predict", json={"instances": [[1, 2, 3, 4], row]})
    assert response.status_code == 422
    error = response.get_json()["error"]
    assert error["details"][0]["loc"] == loc.replace("[0]", "[1]", 1)
    assert why in error["message"]
