"""KServe V2 under the real Gunicorn, spoken by the real ``tritonclient[http]`` from PyPI:
the bundled demo pipeline (FP64 input) and its ONNX graph (FP32 input) side by side."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import joblib
import numpy as np
import pytest
import requests
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from serving.settings import DEMO_MODEL_PATH
from tests.e2e.server import GunicornServer

DEMO_ONNX_PATH = DEMO_MODEL_PATH.with_suffix(".onnx")
MODELS = [
    {"name": "breast_cancer", "version": "1", "path": str(DEMO_MODEL_PATH)},
    {"name": "breast_cancer_onnx", "version": "1", "path": str(DEMO_ONNX_PATH)},
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GunicornServer]:
    """One worker serving both models (2 "ready to serve" lines); bodies up to 64 KiB."""
    tmp_path = tmp_path_factory.mktemp("v2")
    settings = {"workers": 1, "models": json.dumps(MODELS), "max_body_bytes": 65536}
    server = GunicornServer(tmp_path, **settings).start()
    try:
        server.wait_ready(workers=2)
        yield server
    finally:
        server.kill()


@pytest.fixture
def client(server: GunicornServer) -> Iterator[Any]:
    client = triton.InferenceServerClient(url=f"127.0.0.1:{server.port}", network_timeout=30)
    yield client
    client.close()


def test_tritonclient_sees_the_server_and_each_models_metadata(client: Any) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    assert client.is_model_ready("breast_cancer")
    assert client.is_model_ready("breast_cancer_onnx", model_version="1")

    onnx = client.get_model_metadata("breast_cancer_onnx")
    joblib_model = client.get_model_metadata("breast_cancer", model_version="1")

    assert onnx["platform"] == "onnxruntime_onnx" and onnx["versions"] == ["1"]
    assert onnx["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, 30]}]
    assert [(o["name"], o["datatype"], o["shape"]) for o in onnx["outputs"]] == [
        ("predictions", "INT64", [-1]),
        ("probabilities", "FP32", [-1, 2]),
    ]
    assert joblib_model["inputs"] == [{"name": "input-0", "datatype": "FP64", "shape": [-1, 30]}]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize(
    "case",
    [
        ("breast_cancer_onnx", "X", "FP32"),
        ("breast_cancer_onnx", "X", "FP64"),
        ("breast_cancer", "input-0", "FP64"),
        ("breast_cancer", "input-0", "FP32"),
    ],
    ids=lambda case: f"{case[0]}-{case[2]}",
)
def test_tritonclient_infer_matches_the_model_in_process(
    client: Any,
    breast_cancer: tuple[np.ndarray, np.ndarray],
    case: tuple[str, str, str],
    binary: bool,
) -> None:
    model, input_name, datatype = case
    X, _ = breast_cancer
    rows = X[:64].astype(np.float32 if datatype == "FP32" else np.float64)
    tensor = triton.InferInput(input_name, list(rows.shape), datatype)
    tensor.set_data_from_numpy(rows, binary_data=binary)
    outputs = [
        triton.InferRequestedOutput(name, binary_data=binary)
        for name in ("predictions", "probabilities")
    ]

    result = client.infer(model, [tensor], outputs=outputs)

    pipeline = joblib.load(DEMO_MODEL_PATH)
    np.testing.assert_array_equal(result.as_numpy("predictions"), pipeline.predict(rows))
    probabilities = result.as_numpy("probabilities")
    assert probabilities.shape == (64, 2)
    np.testing.assert_allclose(probabilities, pipeline.predict_proba(rows), atol=1e-4)
    assert result.get_response()["model_name"] == model


def test_tritonclient_default_request_echoes_the_id_and_takes_requested_outputs(
    client: Any, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    X, _ = breast_cancer
    tensor = triton.InferInput("X", [3, 30], "FP32")
    tensor.set_data_from_numpy(X[:3].astype(np.float32))  # binary_data=True by default

    every = client.infer("breast_cancer_onnx", [tensor], request_id="req-42")
    some = client.infer(
        "breast_cancer_onnx",
        [tensor],
        model_version="1",
        outputs=[triton.InferRequestedOutput("probabilities")],
    )

    assert every.get_response()["id"] == "req-42"
    assert every.as_numpy("predictions").tolist() == [0, 0, 0]
    assert every.as_numpy("probabilities").dtype == np.float32
    assert some.as_numpy("predictions") is None
    assert some.as_numpy("probabilities").shape == (3, 2)


def test_tritonclient_gets_the_errors_the_protocol_defines(
    client: Any, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    X, _ = breast_cancer
    good = triton.InferInput("X", [2, 30], "FP32")
    good.set_data_from_numpy(X[:2].astype(np.float32))
    narrow = triton.InferInput("X", [2, 29], "FP32")
    narrow.set_data_from_numpy(X[:2, :29].astype(np.float32))

    with pytest.raises(InferenceServerException) as unknown:
        client.infer("nope", [good])
    with pytest.raises(InferenceServerException) as version:
        client.infer("breast_cancer_onnx", [good], model_version="2")
    with pytest.raises(InferenceServerException) as shape:
        client.infer("breast_cancer_onnx", [narrow])
    with pytest.raises(InferenceServerException) as metadata:
        client.get_model_metadata("nope")

    assert unknown.value.status() == "404"
    assert "model 'nope' is not served here" in unknown.value.message()
    assert version.value.status() == "409"
    assert shape.value.status() == "400"
    assert "input 'X' has shape [2, 29]; the model takes [-1, 30]" in shape.value.message()
    assert metadata.value.status() == "404"
    assert not client.is_model_ready("nope")


def test_v2_chunked_bodies_without_content_type_are_read_up_to_the_limit(
    server: GunicornServer, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    X, _ = breast_cancer
    row = X[0].tolist()
    body = json.dumps(
        {"inputs": [{"name": "X", "shape": [1, 30], "datatype": "FP64", "data": row}]}
    )
    url = f"{server.url}/v2/models/breast_cancer_onnx/infer"

    def chunks(data: bytes, repeat: int = 1) -> Iterator[bytes]:
        for _ in range(repeat):
            yield data

    small = requests.post(url, data=chunks(body.encode()), timeout=30)
    huge = requests.post(url, data=chunks(b" " * 32768, repeat=3), timeout=30)

    assert "Content-Length" not in small.request.headers
    assert small.status_code == 200, small.text
    assert small.json()["outputs"][0]["data"] == [0]
    assert (huge.status_code, huge.json()["code"]) == (413, "payload_too_large")
    assert "chunked request body" in huge.json()["error"]
