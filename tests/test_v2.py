"""KServe V2 REST in-process (Flask test client) around tiny real models: routes, tensors,
the binary extension, error shape, and merging with /predict in one batcher."""

from __future__ import annotations

import json
import re
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import joblib
import jsonschema
import numpy as np
import onnxruntime as ort
import pytest
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client import CollectorRegistry

from serving import __version__
from serving.app import create_app
from serving.cache import ModelCache
from serving.dataplane import DataPlane
from serving.inputs.conform import conform
from serving.inputs.instances import Frame, Tensors
from serving.model.handle import ModelHandle, TensorSpec
from serving.model.loaders import load_model
from serving.observe.metrics import ServingMetrics
from serving.protocols.schemas import parse_body
from serving.protocols.v2.codec import HEADER_LENGTH, decode, split_body
from serving.protocols.v2.schemas import (
    V2Error,
    V2InferRequest,
    V2InferResponse,
    V2ModelMetadata,
)
from serving.runtime import ModelRuntime
from serving.settings import DEMO_MODEL_PATH, Settings
from tests.conftest import serve_runtimes
from tests.waiting import until

ROOT = Path(__file__).resolve().parents[1]
INFER = "/v2/models/echo/infer"
KEY = "k" * 20


def tensor(data: Any, shape: list[int], name: str = "input-0", datatype: str = "FP64") -> Any:
    return {"name": name, "shape": shape, "datatype": datatype, "data": data}


def error_of(response: Any) -> V2Error:
    return V2Error.model_validate(response.get_json())


MakeClient = Callable[..., FlaskClient]


@pytest.fixture
def make_client(settings: Settings) -> Iterator[MakeClient]:
    """``make_client(handle, **settings)``: a test client of an app serving ``handle``."""
    apps: list[Flask] = []

    def make(handle: ModelHandle, **overrides: Any) -> FlaskClient:
        configured = Settings(**{**settings.model_dump(), **overrides})
        app = create_app(configured, models=[handle], metrics=ServingMetrics(CollectorRegistry()))
        apps.append(app)
        return app.test_client()

    yield make
    for app in apps:
        app.extensions["serving"].get_models().stop(timeout_s=10)


def test_v2_server_metadata_and_health_answer_200(client: FlaskClient) -> None:
    assert client.get("/v2").get_json() == {
        "name": "serving",
        "version": __version__,
        "extensions": [
            "binary_tensor_data",
            "statistics",
            "model_configuration",
            "model_repository",
        ],
    }
    live, ready_ = client.get("/v2/health/live"), client.get("/v2/health/ready")
    assert (live.status_code, live.get_json()) == (200, {"live": True})
    assert (ready_.status_code, ready_.get_json()) == (200, {"ready": True})
    ready = client.get("/v2/models/echo/versions/7/ready")
    assert (ready.status_code, ready.get_json()) == (200, {"name": "echo", "ready": True})


def test_v2_readiness_is_400_while_loading_and_infer_503(settings: Settings) -> None:
    metrics = ServingMetrics(CollectorRegistry())
    runtime = ModelRuntime(settings.model_settings()[0], metrics)
    client = serve_runtimes(settings, metrics, [runtime]).test_client()
    name = runtime.model_name

    assert client.get("/v2/health/ready").status_code == 400
    assert client.get(f"/v2/models/{name}/ready").get_json() == {"name": name, "ready": False}
    assert client.get("/v2/health/live").status_code == 200
    infer = client.post(f"/v2/models/{name}/infer", json={"inputs": [tensor([1, 2, 3], [1, 3])]})
    assert (infer.status_code, error_of(infer).code) == (503, "not_ready")
    assert infer.headers["Retry-After"] == "1"

    runtime.load(ModelHandle.from_callable(np.sum, name=name, version="1", n_features=3))
    assert client.get("/v2/health/ready").status_code == 200
    runtime.stop(timeout_s=10)
    assert client.get("/v2/health/ready").status_code == 400


def test_v2_model_metadata_lists_tensors_and_feature_names(make_client: MakeClient) -> None:
    handle = ModelHandle.from_callable(
        lambda X: X.sum(axis=1), name="sum", version="3", feature_names=("a", "b", "c")
    )
    client = make_client(handle)

    response = client.get("/v2/models/sum")

    assert response.status_code == 200
    V2ModelMetadata.model_validate(response.get_json())
    assert response.get_json() == {
        "name": "sum",
        "versions": ["3"],
        "platform": "callable",
        "inputs": [
            {
                "name": "input-0",
                "datatype": "FP64",
                "shape": [-1, 3],
                "parameters": {"feature_names": ["a", "b", "c"]},
            },
        ],
        "outputs": [{"name": "predictions", "datatype": "FP64", "shape": [-1]}],
    }
    assert client.get("/v2/models/sum/versions/3").get_json() == response.get_json()


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/v2/models/nope", 404, "model_not_found"),
        ("/v2/models/echo/versions/8", 409, "version_conflict"),
        ("/v2/models/nope/ready", 404, "model_not_found"),
        ("/v2/models/echo/versions/8/ready", 409, "version_conflict"),
    ],
)
def test_v2_unknown_model_is_404_and_unserved_version_409_in_the_protocols_shape(
    client: FlaskClient, path: str, status: int, code: str
) -> None:
    response = client.get(path)
    assert (response.status_code, error_of(response).code) == (status, code)
    posted = client.post(
        path.removesuffix("/ready") + "/infer", json={"inputs": [tensor([1, 2, 3], [1, 3])]}
    )
    assert (posted.status_code, error_of(posted).code) == (status, code)


@pytest.mark.parametrize(
    "data", [[5, 0, 0, 6.5, 1, 2], [[5, 0, 0], [6.5, 1, 2]]], ids=["flat", "nested"]
)
def test_v2_infer_answers_every_output_per_instance_and_echoes_the_id(
    client: FlaskClient, data: list[Any]
) -> None:
    response = client.post(INFER, json={"id": "req-1", "inputs": [tensor(data, [2, 3])]})

    assert response.status_code == 200, response.get_json()
    body = V2InferResponse.model_validate(response.get_json())
    assert (body.model_name, body.model_version, body.id) == ("echo", "7", "req-1")
    assert [o.model_dump(exclude_none=True) for o in body.outputs] == [
        {"name": "predictions", "datatype": "FP64", "shape": [2], "data": [5.0, 6.5]},
        {"name": "probabilities", "datatype": "FP64", "shape": [2, 2], "data": [0.5] * 4},
    ]


def test_v2_infer_returns_only_requested_outputs_and_any_numeric_datatype(
    client: FlaskClient,
) -> None:
    body = {
        "inputs": [tensor([4, 1, 2], [1, 3], datatype="INT32")],
        "outputs": [{"name": "predictions"}],
    }
    response = client.post("/v2/models/echo/versions/7/infer", json=body)

    assert response.status_code == 200, response.get_json()
    assert "id" not in response.get_json()
    assert response.get_json()["outputs"] == [
        {"name": "predictions", "datatype": "FP64", "shape": [1], "data": [4.0]}
    ]


def test_v2_infer_takes_integral_float_shapes_as_json_schema_integers(client: FlaskClient) -> None:
    accepted = client.post(INFER, json={"inputs": [tensor([1, 2, 3], [1.0, 3.0])]})
    refused = client.post(INFER, json={"inputs": [tensor([1, 2, 3], [1.5, 2])]})

    assert accepted.status_code == 200, accepted.get_json()
    assert "inputs[0].shape[0]" in error_of(refused).error


@pytest.mark.parametrize(
    ("inputs", "where"),
    [
        ([tensor([1, 2, 3], [1, 3], name="x")], "no input 'x'"),
        ([tensor([1, 2, 3], [1, 3]), tensor([1, 2, 3], [1, 3])], "'input-0' is given twice"),
        ([tensor([1, 2, 3], [1, 3]), tensor([1], [1], name="extra")], "no input 'extra'"),
        ([tensor(["a", "b", "c"], [1, 3], datatype="BYTES")], "data[0][0]: 'a' is not a number"),
        (
            [tensor([1, 2.5, 3], [1, 3], datatype="INT64")],
            "data[1] (instance 0, column 1) = 2.5 is not an integer",
        ),
        (
            [tensor([1, True, 3], [1, 3])],
            "data[1] (instance 0, column 1) = true is not a finite number",
        ),
        (
            [tensor([1, 300, 3], [1, 3], datatype="INT8")],
            "data[1] (instance 0, column 1) = 300 is not an integer",
        ),
        (
            [tensor([1, 1e39, 3], [1, 3], datatype="FP32")],
            "data[1] (instance 0, column 1) = 1e+39 is not a finite",
        ),
        ([tensor([1, 2, 3, 4], [1, 3])], "has 4 values; shape [1, 3] needs 3"),
        ([tensor([1, 2, 3, 4], [2, 2])], "has shape [2, 2]; the model takes [-1, 3]"),
        ([tensor([1, 2, 3], [3])], "has shape [3]; the model takes [-1, 3]"),
        ([tensor([], [0, 3])], "has shape [0, 3]"),
        ([{"name": "input-0", "shape": [1, 3], "datatype": "FP64"}], "'input-0' has no data"),
    ],
)
def test_v2_infer_refuses_bad_inputs_with_400_naming_the_input(
    client: FlaskClient, inputs: list[Any], where: str
) -> None:
    response = client.post(INFER, json={"inputs": inputs})

    assert response.status_code == 400
    error = error_of(response)
    assert error.code == "invalid_input"
    assert where in error.error
    assert re.match(r"inputs(\[\d\])?(\.data(\[\d+\])+)?: ", error.error)


ONE = b'{"name": "input-0", "shape": [1, 3], "datatype": "FP64", "data": '


@pytest.mark.parametrize(
    ("body", "where"),
    [
        (b'{"inputs": [', "not valid JSON"),
        (b'{"inputs": []}', "inputs"),
        (b'{"input": []}', "input"),
        (b'{"inputs": [' + ONE + b"[1, 2, NaN]}]}", "inputs[0].data[0][2]: missing value"),
        (
            b'{"inputs": [' + ONE + b"[1, 2, 1e999]}]}",
            "data[2] (instance 0, column 2) = Infinity is not a finite number",
        ),
        (b'{"inputs": [' + ONE.replace(b"FP64", b"FP99") + b"[1]}]}", "inputs[0].datatype"),
        (
            b'{"inputs": [' + ONE + b'[1, 2, 3]}], "outputs": [{"name": "nope"}]}',
            "outputs[0]: the model has no output",
        ),
        (
            b'{"inputs": [' + ONE + b'[1, 2, 3]}], "outputs": [{"name": "predictions", '
            b'"parameters": {"classification": 2}}]}',
            "classification extension is not supported",
        ),
    ],
)
def test_v2_infer_refuses_malformed_bodies_with_400(
    client: FlaskClient, body: bytes, where: str
) -> None:
    response = client.post(INFER, data=body, content_type="application/json")

    assert response.status_code == 400
    assert where in error_of(response).error


def test_v2_infer_refuses_values_the_models_input_type_cannot_hold(
    make_client: MakeClient,
) -> None:
    handle = ModelHandle(
        "f32",
        "1",
        "callable",
        lambda X: {"predictions": X[:, 0]},
        n_features=2,
        input_dtype=np.float32,
    )
    response = make_client(handle).post(
        "/v2/models/f32/infer", json={"inputs": [tensor([1, 1e39], [1, 2])]}
    )
    assert response.status_code == 400
    assert "outside the model's float32 range" in error_of(response).error


def test_v2_infer_takes_each_input_by_name_in_the_models_column_order(
    make_client: MakeClient,
) -> None:
    specs = (
        TensorSpec("a", np.dtype(np.float64), (-1,)),
        TensorSpec("b", np.dtype(np.float32), (-1, 2)),
    )
    handle = ModelHandle(
        "multi",
        "1",
        "onnx",
        lambda X: {"predictions": X @ np.array([1.0, 10.0, 100.0])},
        n_features=3,
        feature_names=("a", "b0", "b1"),
        inputs=specs,
    )
    client = make_client(handle)

    b, a = tensor([2, 3, 5, 6], [2, 2], "b", "FP32"), tensor([1, 4], [2, 1], "a", "INT64")
    response = client.post("/v2/models/multi/infer", json={"inputs": [b, a]})
    metadata = client.get("/v2/models/multi").get_json()

    assert response.status_code == 200, response.get_json()
    assert response.get_json()["outputs"][0]["data"] == [321.0, 654.0]
    assert metadata["platform"] == "onnxruntime_onnx"
    assert metadata["inputs"] == [
        {"name": "a", "datatype": "FP64", "shape": [-1], "parameters": {"feature_names": ["a"]}},
        {
            "name": "b",
            "datatype": "FP32",
            "shape": [-1, 2],
            "parameters": {"feature_names": ["b0", "b1"]},
        },
    ]
    missing = client.post("/v2/models/multi/infer", json={"inputs": [b]})
    assert "inputs: missing input 'a'" in error_of(missing).error
    uneven = client.post("/v2/models/multi/infer", json={"inputs": [b, tensor([1], [1], "a")]})
    assert "inputs[0]: input 'b' has 2 instances; input 'a' has 1" in error_of(uneven).error


def binary_request(
    tensors: list[tuple[str, str, np.ndarray]], **extra: Any
) -> tuple[bytes, dict[str, str]]:
    """A binary tensor data extension body, as tritonclient builds it."""
    inputs = [
        {
            "name": name,
            "shape": list(array.shape),
            "datatype": datatype,
            "parameters": {"binary_data_size": array.nbytes},
        }
        for name, datatype, array in tensors
    ]
    header = json.dumps({"inputs": inputs, **extra}).encode()
    raw = b"".join(array.astype(array.dtype.newbyteorder("<")).tobytes() for *_, array in tensors)
    return header + raw, {"Inference-Header-Content-Length": str(len(header))}


def split_response(response: Any) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The JSON header and each binary output's bytes of a binary response."""
    data = response.get_data()
    length = int(response.headers["Inference-Header-Content-Length"])
    header = json.loads(data[:length])
    offset, raw = length, {}
    for out in header["outputs"]:
        if "parameters" not in out:
            continue
        size = out["parameters"]["binary_data_size"]
        raw[out["name"]], offset = data[offset : offset + size], offset + size
    assert offset == len(data)
    return header, raw


@pytest.mark.parametrize("content_type", [None, "application/octet-stream"])
def test_v2_infer_binary_tensors_both_ways_with_any_content_type(
    client: FlaskClient, content_type: str | None
) -> None:
    rows = np.array([[5, 0, 0], [6.5, 1, 2]], dtype=np.float32)
    outputs = [
        {"name": "probabilities"},
        {"name": "predictions", "parameters": {"binary_data": False}},
    ]
    body, headers = binary_request(
        [("input-0", "FP32", rows)], outputs=outputs, parameters={"binary_data_output": True}
    )
    response = client.post(INFER, data=body, headers=headers, content_type=content_type)

    assert response.status_code == 200, response.get_data()
    assert response.mimetype == "application/octet-stream"
    header, raw = split_response(response)
    assert header["outputs"][0] == {
        "name": "probabilities",
        "datatype": "FP64",
        "shape": [2, 2],
        "parameters": {"binary_data_size": 32},
    }
    assert header["outputs"][1]["data"] == [5.0, 6.5]
    np.testing.assert_array_equal(np.frombuffer(raw["probabilities"], "<f8"), [0.5] * 4)


@pytest.mark.parametrize(
    ("size", "sent", "header_length", "where"),
    [
        (24, 16, None, "binary_data_size 24 runs past the body's end"),
        (8, 8, None, "binary_data_size 8; shape [1, 3] of FP64 needs 24 bytes"),
        (24, 32, None, "8 bytes after the inputs' binary data"),
        (24, 24, "x", "'x' is not a byte count"),
        (24, 24, "100000", "is more than the body's"),
        (24, 24, "\u00b2", "is not a byte count"),  # a digit to str.isdigit(), not to int()
        (24, 24, "1" * 4300, "(4300 digits) is more than the body's"),  # past int()'s limit
    ],
)
def test_v2_infer_binary_sizes_that_do_not_add_up_are_400(
    client: FlaskClient, size: int, sent: int, header_length: str | None, where: str
) -> None:
    parameters = {"binary_data_size": size}
    inputs = [{"name": "input-0", "shape": [1, 3], "datatype": "FP64", "parameters": parameters}]
    header = json.dumps({"inputs": inputs}).encode()
    headers = {"Inference-Header-Content-Length": header_length or str(len(header))}
    response = client.post(INFER, data=header + bytes(sent), headers=headers)

    assert response.status_code == 400
    assert where in error_of(response).error


def test_v2_infer_string_labels_are_bytes_in_json_and_binary(make_client: MakeClient) -> None:
    handle = ModelHandle.from_callable(
        lambda X: np.where(X[:, 0] > 0, "benign", "malignant").astype(object),
        name="labels",
        version="1",
        n_features=1,
    )
    client = make_client(handle)
    rows = [tensor([1, -1], [2, 1])]

    as_json = client.post("/v2/models/labels/infer", json={"inputs": rows})
    as_binary = client.post(
        "/v2/models/labels/infer", json={"inputs": rows, "parameters": {"binary_data_output": True}}
    )

    assert as_json.get_json()["outputs"] == [
        {"name": "predictions", "datatype": "BYTES", "shape": [2], "data": ["benign", "malignant"]}
    ]
    header, raw = split_response(as_binary)
    assert header["outputs"][0]["datatype"] == "BYTES"
    assert raw["predictions"] == struct.pack("<I", 6) + b"benign" + struct.pack("<I", 9) + (
        b"malignant"
    )
    assert client.get("/v2/models/labels").get_json()["outputs"][0]["datatype"] == "BYTES"


def test_v2_infer_limits_are_413_and_compressed_bodies_415(client: FlaskClient) -> None:
    many = client.post(INFER, json={"inputs": [tensor([0.0] * 51, [17, 3])]})
    big = client.post(INFER, json={"inputs": [tensor([0.123456789] * 600, [200, 3])]})
    gzip = client.post(INFER, data=b"x", headers={"Content-Encoding": "gzip"})

    assert (many.status_code, error_of(many).code) == (413, "payload_too_large")
    assert (big.status_code, error_of(big).code) == (413, "payload_too_large")
    assert (gzip.status_code, error_of(gzip).code) == (415, "unsupported_content_encoding")
    assert "Content-Encoding 'gzip' is not supported" in error_of(gzip).error


def test_v2_health_routes_are_open_and_the_others_need_a_key(
    make_client: MakeClient, model_handle: ModelHandle
) -> None:
    client = make_client(model_handle, api_keys=KEY)

    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/v2/health/ready").status_code == 200
    refused = client.get("/v2/models/echo")
    assert (refused.status_code, error_of(refused).code) == (401, "unauthorized")
    body = {"inputs": [tensor([1, 2, 3], [1, 3])]}
    assert client.post(INFER, json=body, headers={"X-API-Key": KEY}).status_code == 200


def test_v2_and_predict_requests_are_merged_into_the_same_predict_calls(
    make_client: MakeClient,
) -> None:
    entered, release = threading.Event(), threading.Event()
    batches: list[list[float]] = []

    def predict(rows: np.ndarray) -> np.ndarray:
        if rows[0, 0] == -1:  # the blocker: holds the model while the others queue up
            entered.set()
            assert release.wait(10)
        batches.append(rows[:, 0].tolist())
        return rows[:, 0] * 2

    handle = ModelHandle.from_callable(predict, name="echo", version="7", n_features=3)
    client = make_client(handle, max_batch_size=16)
    runtime = client.application.extensions["serving"].get_models().default
    results: dict[float, Any] = {}

    def v2(first: float) -> None:
        body = {"inputs": [tensor([first, 0, 0, first + 0.5, 0, 0], [2, 3])]}
        response = client.application.test_client().post(INFER, json=body)
        results[first] = response.get_json()["outputs"][0]["data"]

    def rest(first: float) -> None:
        body = {"instances": [[first, 0, 0], [first + 0.5, 0, 0]]}
        response = client.application.test_client().post("/predict", json=body)
        results[first] = response.get_json()["predictions"]

    blocker = threading.Thread(target=rest, args=(-1.0,))
    blocker.start()
    assert entered.wait(10)
    callers = [threading.Thread(target=v2 if k % 2 else rest, args=(k,)) for k in range(1, 7)]
    for caller in callers:
        caller.start()
    until(lambda: runtime.queue_depth >= 12, 10, interval_s=0.005,
          what=lambda: f"12 queued (queued: {runtime.queue_depth})")  # fmt: skip
    release.set()
    for thread in [blocker, *callers]:
        thread.join(10)
        assert not thread.is_alive()

    merged = [batch for batch in batches if len(batch) > 2 and any(batch)]  # not warmup
    assert len(merged) == 1 and sorted(merged[0]) == sorted(
        [k + d for k in range(1, 7) for d in (0.0, 0.5)]
    )
    assert results == {k: [2 * k, 2 * k + 1] for k in [-1.0, *range(1, 7)]}


def test_v2_readme_example_validates_against_the_openapi_document(client: FlaskClient) -> None:
    readme = (ROOT / "docs" / "api.md").read_text()
    match = re.search(r"curl -s [^\n]*/v2/models/[^\n]*/infer [^\n]*-d '([^']*)'", readme)
    assert match, "docs/api.md has no curl example for /v2/models/.../infer"
    document = client.get("/openapi.json").get_json()
    schema = {"$ref": "#/components/schemas/V2InferRequest", **document}
    jsonschema.validate(json.loads(match.group(1)), schema)
    body = json.loads(match.group(1))
    assert body["inputs"][0]["shape"][1] == 30  # the demo model's features


def test_v2_int64_json_null_is_a_missing_value_where_the_feature_may_be_missing(
    settings: Settings,
) -> None:
    """Reported by the new-user trial: a nullable integer column advertised as INT64
    refused null ("is not an integer within INT64's range"), on /predict it was NaN."""
    from dataclasses import replace

    from serving.model.schema import feature
    from tests.models import credit_handle

    seen: list[Any] = []
    handle = credit_handle(seen)
    app = create_app(settings, models=[handle], metrics=ServingMetrics(CollectorRegistry()))
    client = app.test_client()
    body = {"inputs": [
        {"name": "dependents", "shape": [3], "datatype": "INT64", "data": [2, None, 0]},
        {"name": "income", "shape": [3], "datatype": "FP64", "data": [10.0, 20.0, 30.0]},
    ]}  # fmt: skip
    try:
        metadata = client.get("/v2/models/credit").get_json()
        answer = client.post("/v2/models/credit/infer", json=body)
        batch = seen[-1]
        assert handle.features is not None
        strict = replace(  # the same model, its integer column not nullable
            handle, name="strict",
            features=(feature("dependents", "integer", np.int64), handle.features[1]),
        )  # fmt: skip
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)
    strict_app = create_app(settings, models=[strict], metrics=ServingMetrics(CollectorRegistry()))
    try:
        refused = strict_app.test_client().post(
            "/v2/models/strict/infer", json=json.loads(json.dumps(body).replace("credit", "strict"))
        )
    finally:
        strict_app.extensions["serving"].get_models().stop(timeout_s=10)

    assert [i["datatype"] for i in metadata["inputs"]] == ["INT64", "FP64"]
    assert answer.status_code == 200, answer.get_data(as_text=True)
    assert answer.get_json()["outputs"][0]["data"] == [12.0, 19.0, 30.0]
    np.testing.assert_array_equal(batch["dependents"], [2.0, np.nan, 0.0])
    assert refused.status_code == 400
    assert "may not be missing" in refused.get_json()["error"]


def decoded(body: bytes, headers: dict[str, str]) -> tuple[Tensors, bytes | bytearray]:
    """The tensors the codec decodes from a request, and the binary tail they came from."""
    header, binary = split_body(body, headers.get(HEADER_LENGTH))
    return decode(parse_body(V2InferRequest, header), binary, 1000), binary


def test_v2_binary_fp32_tensor_is_a_float32_graphs_batch_without_a_copy(
    breast_cancer: tuple[np.ndarray, np.ndarray],
) -> None:
    handle = load_model(DEMO_MODEL_PATH.with_suffix(".onnx"))
    rows = breast_cancer[0][:5].astype(np.float32)
    tensors, binary = decoded(*binary_request([("X", "FP32", rows)]))

    batch = conform(tensors, handle)

    assert batch.dtype == np.float32
    assert np.shares_memory(batch, np.frombuffer(binary, np.uint8))  # a view of the body
    session = ort.InferenceSession(
        str(DEMO_MODEL_PATH.with_suffix(".onnx")), providers=["CPUExecutionProvider"]
    )
    labels, probabilities = session.run(["label", "probabilities"], {"X": rows})
    outputs = handle.predict_batch(batch)
    np.testing.assert_array_equal(outputs["predictions"], labels)
    np.testing.assert_array_equal(outputs["probabilities"], probabilities)


def test_v2_binary_fp64_tensor_is_a_float64_models_batch_without_a_copy(
    breast_cancer: tuple[np.ndarray, np.ndarray],
) -> None:
    handle = load_model(DEMO_MODEL_PATH)
    rows = breast_cancer[0][:5]
    tensors, binary = decoded(*binary_request([("input-0", "FP64", rows)]))

    batch = conform(tensors, handle)

    assert batch.dtype == np.float64
    assert np.shares_memory(batch, np.frombuffer(binary, np.uint8))
    pipeline = joblib.load(DEMO_MODEL_PATH)
    outputs = handle.predict_batch(batch)
    np.testing.assert_array_equal(outputs["predictions"], pipeline.predict(rows))
    np.testing.assert_array_equal(outputs["probabilities"], pipeline.predict_proba(rows))


def test_v2_a_lone_binary_request_reaches_the_model_as_its_own_writable_view(
    settings: Settings, metrics: ServingMetrics
) -> None:
    seen: list[np.ndarray] = []

    def model(X: np.ndarray) -> dict[str, np.ndarray]:
        seen.append(X)
        X[:, 0] += 1  # a model may write into its input
        return {"predictions": X.sum(axis=1)}

    handle = ModelHandle("f32", "1", "callable", model, n_features=3, input_dtype=np.float32)
    runtime = ModelRuntime(settings.model_settings()[0], metrics)
    runtime.load(handle)
    cache = ModelCache([runtime])
    plane = DataPlane(settings, metrics, lambda: cache)
    rows = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)
    tensors, binary = decoded(*binary_request([("input-0", "FP32", rows)]))
    try:
        answer = plane.infer(plane.call("one"), None, None, tensors)
    finally:
        cache.stop(timeout_s=10)

    assert answer.outputs["predictions"].tolist() == [7.0, 16.0]
    assert seen[-1].dtype == np.float32 and seen[-1].flags.writeable  # seen[0]: the warm-up
    assert np.shares_memory(seen[-1], np.frombuffer(binary, np.uint8))


@pytest.mark.parametrize("datatype", ["FP32", "FP64"])
def test_v2_json_floats_are_decoded_once_to_their_datatype(
    breast_cancer: tuple[np.ndarray, np.ndarray], datatype: str
) -> None:
    dtype = np.float32 if datatype == "FP32" else np.float64
    rows = breast_cancer[0][:3].astype(dtype)
    body = {"inputs": [tensor(rows.tolist(), [3, 30], "X", datatype)]}
    tensors, _ = decoded(json.dumps(body).encode(), {})
    handle = load_model(DEMO_MODEL_PATH.with_suffix(".onnx"))

    (_, values), batch = tensors.inputs[0], conform(tensors, handle)

    assert values.dtype == dtype
    np.testing.assert_array_equal(values, rows)
    assert batch.dtype == np.float32
    assert np.shares_memory(batch, values) == (datatype == "FP32")  # FP64: cast once, here
    np.testing.assert_array_equal(batch, rows.astype(np.float32))


@pytest.mark.parametrize(
    ("datatype", "rows", "where"),
    [
        ("FP32", [[1, 2, np.nan]], "inputs[0].data[0][2]: missing value"),
        ("FP32", [[1, 2, np.inf]], "inputs[0].data[0][2]: Infinity is not a finite number"),
        ("FP64", [[1, -1e39, 2]], "inputs[0].data[0][1]: -1e+39 is outside the model's float32"),
        ("FP16", [[1, 2, np.nan]], "inputs[0].data[0][2]: missing value"),
    ],
)
def test_v2_binary_values_a_float32_model_cannot_take_are_400_naming_the_value(
    make_client: MakeClient, datatype: str, rows: list[list[float]], where: str
) -> None:
    handle = ModelHandle(
        "f32", "1", "callable", lambda X: {"predictions": X[:, 0]}, n_features=3,
        input_dtype=np.float32,
    )  # fmt: skip
    dtype = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}[datatype]
    body, headers = binary_request([("input-0", datatype, np.array(rows, dtype=dtype))])

    response = make_client(handle).post("/v2/models/f32/infer", data=body, headers=headers)

    assert response.status_code == 400
    assert error_of(response).error.startswith(where)


def test_v2_binary_tensors_of_a_float32_model_merge_with_predict_requests(
    breast_cancer: tuple[np.ndarray, np.ndarray],
) -> None:
    handle = load_model(DEMO_MODEL_PATH.with_suffix(".onnx"))
    rows = breast_cancer[0][:2]
    tensors, _ = decoded(*binary_request([("X", "FP32", rows.astype(np.float32))]))

    batches = [conform(tensors, handle), conform(Frame(rows.tolist()), handle)]

    assert [batch.dtype for batch in batches] == [np.float32, np.float32]  # one batcher key
    assert handle.matrix_dtype == np.float32


def test_v2_binary_bool_bytes_other_than_0_and_1_are_400_naming_the_value(
    client: FlaskClient,
) -> None:
    # Found by the attack: a BOOL byte of 2 or 255 reached the model as a numpy bool
    # holding 2 (numpy treats it as True, a model reading the bytes sees 2).
    header = json.dumps({"inputs": [
        {"name": "input-0", "shape": [1, 3], "datatype": "BOOL",
         "parameters": {"binary_data_size": 3}},
    ]}).encode()  # fmt: skip
    headers = {"Inference-Header-Content-Length": str(len(header))}

    response = client.post(INFER, data=header + bytes([1, 0, 2]), headers=headers)

    assert response.status_code == 400
    assert error_of(response).error.startswith("inputs[0].data[2]")
    assert "2 is not a BOOL" in error_of(response).error


class ReportRisk:
    """A class taking a DataFrame with a boolean column that may be missing."""

    input_format = "dataframe"
    input_schema = [  # noqa: RUF012
        {"name": "amount", "type": "double"},
        {"name": "police_report", "type": "boolean", "required": False},
    ]

    def predict(self, frame: Any) -> Any:
        report = frame["police_report"]
        return np.where(report.isna(), -1.0, np.where(report == True, 1.0, 0.0)) * frame["amount"]  # noqa: E712


def test_v2_bool_null_is_a_missing_value_as_on_predict(settings: Any) -> None:
    """Found by the new-user trial: V2 refused null in a BOOL input that may be missing
    (400 'data[0] = null is not true or false') while /predict and MLflow answered the
    same row. null is a missing value in every JSON tensor; conform refuses it where the
    feature may not be missing."""
    import pandas as pd

    from serving.model.custom import python_handle

    model = ReportRisk()
    handle = python_handle(model, name="risk", version="1")
    app = create_app(settings, models=[handle], metrics=ServingMetrics(CollectorRegistry()))
    bools = {"name": "police_report", "shape": [3], "datatype": "BOOL", "data": [True, None, False]}
    amounts = {"name": "amount", "shape": [3], "datatype": "FP64", "data": [2.0, 3.0, 4.0]}
    try:
        client = app.test_client()
        v2 = client.post("/v2/models/risk/infer", json={"inputs": [amounts, bools]})
        pairs = zip(amounts["data"], bools["data"], strict=True)
        rows = [{"amount": a, "police_report": p} for a, p in pairs]
        predict = client.post("/predict", json={"instances": rows})
        required = {**bools, "name": "amount", "datatype": "BOOL"}
        refused = client.post("/v2/models/risk/infer", json={"inputs": [required, bools]})
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    frame = pd.DataFrame({"amount": [2.0, 3.0, 4.0], "police_report": [True, None, False]})
    expected = model.predict(frame).tolist()
    assert v2.status_code == 200, v2.get_data(as_text=True)
    assert v2.get_json()["outputs"][0]["data"] == predict.get_json()["predictions"] == expected
    assert expected == [2.0, -3.0, 0.0]
    assert refused.status_code == 400


def test_v2_infer_an_input_the_model_lacks_is_named_before_its_values_are_checked(
    settings: Settings, metrics: ServingMetrics
) -> None:
    """Found by the new-user trial: a tensor named ``input-0`` of mixed values, sent to a
    model whose inputs are its columns, was refused for its third value not being a
    string; the same call with strings was told the model has no such input."""
    from tests.tabular import tier_pipeline

    model, _ = tier_pipeline()
    from serving.model.loaders import estimator_handle

    handle = estimator_handle(model, name="tiers", version="1", format="joblib")
    app = create_app(settings, models=[handle], metrics=metrics)
    body = {"inputs": [
        {"name": "input-0", "shape": [1, 3], "datatype": "BYTES", "data": ["pro", 2, 3.5]},
    ]}  # fmt: skip
    try:
        answer = app.test_client().post("/v2/models/tiers/infer", json=body)
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    assert answer.status_code == 400
    error = answer.get_json()
    assert error["code"] == "invalid_input", error
    assert "the model has no input 'input-0' (its inputs: tier, plan, usage)" in error["error"]
