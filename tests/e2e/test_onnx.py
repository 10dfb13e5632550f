"""The ONNX path under the real Gunicorn: providers chosen per worker, reported, and refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import joblib
import numpy as np
import pytest
import requests

from serving.model.providers import CUDA, provider_problem
from serving.settings import DEMO_MODEL_PATH
from tests.e2e.server import GunicornServer

Start = Callable[..., GunicornServer]
DEMO_ONNX_PATH = DEMO_MODEL_PATH.with_suffix(".onnx")


def test_onnx_demo_serves_real_rows_and_reports_its_execution_provider(
    gunicorn: Start, breast_cancer: tuple[np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    X, _ = breast_cancer
    cached = tmp_path / "demo.optimized.onnx"
    server = gunicorn(model_path=DEMO_ONNX_PATH, onnx_optimized_model_path=cached)
    server.wait_ready()
    provider = "CPUExecutionProvider" if provider_problem(CUDA) else "CUDAExecutionProvider"

    response = server.predict(X.tolist()[:400])
    health = requests.get(f"{server.url}/healthz", timeout=5).json()
    scrape = requests.get(f"{server.url}/metrics", timeout=10).text

    assert response.status_code == 200, response.text
    expected = joblib.load(DEMO_MODEL_PATH).predict(X[:400])  # the float64 pipeline
    np.testing.assert_array_equal(response.json()["predictions"], expected)
    assert health["execution_provider"] == provider
    device = "cpu" if provider.startswith("CPU") else "cuda:0"
    info = (
        f'serving_model_info{{device="{device}",engine="onnxruntime",execution_provider="{provider}",'
        'format="onnx",model="breast_cancer",version="1"} 1.0'
    )
    assert info in scrape
    output = server.output()
    assert output.count(f"runs on {provider}") == 2  # logged once per worker
    assert "[E:" not in output and "[ERROR]" not in output
    assert cached.is_file()


@pytest.mark.skipif(provider_problem(CUDA) is None, reason="a usable GPU: gpu_check.sh covers it")
def test_explicit_cuda_on_a_host_without_a_usable_gpu_stops_the_server(gunicorn: Start) -> None:
    server = gunicorn(model_path=DEMO_ONNX_PATH, onnx_providers="cuda,cpu")

    status = server.wait_exit(timeout_s=60)
    output = server.output()
    assert status == 3, output  # once exit 1 under CI beside an attack's servers
    assert "SERVING_ONNX_PROVIDERS=cuda,cpu asks for CUDAExecutionProvider, but" in output
    assert "stopping the server" in output and "Traceback" not in output
