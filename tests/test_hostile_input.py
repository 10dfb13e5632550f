"""Hostile input in-process: a small request costs little, whatever it declares.

Each case asserts bounded work, never a time: a declared shape refused before anything of
its size is allocated (tracemalloc's peak, or the allocating function never called), one
validation error however many bad values (pydantic's own error count), the first bad
instance named. End-to-end cases against a real Gunicorn are in ``tests/e2e/test_hostile.py``.
"""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ValidationError

from serving.app import create_app
from serving.errors import InvalidInput
from serving.inputs.conform import conform
from serving.inputs.instances import Columns, Frame, Records, Tensors
from serving.model.handle import ModelHandle
from serving.model.loaders import estimator_handle
from serving.model.schema import Feature, feature, sample_batch
from serving.observe.metrics import ServingMetrics
from serving.protocols.mlflow.schemas import MlflowRequest
from serving.protocols.predict.schemas import PredictRequest
from serving.protocols.tfserving.schemas import TFPredictRequest
from serving.protocols.v2 import codec as v2_codec
from serving.protocols.v2.schemas import V2InferRequest
from tests.conftest import unit_settings
from tests.tabular import tier_pipeline

#: Bad elements in each large hostile body: before the fix each became one pydantic error
#: per union branch (about 1 KB each), after it the first one ends validation.
N = 100_000
#: Peak Python allocation allowed while refusing a body that declares a huge tensor.
SMALL_BYTES = 2 * 1024 * 1024

FEATURES = (
    feature("plan", "string", object),
    feature("n", "integer", np.int64),
    feature("x", "float", np.float64),
)


def _zeros(rows: Any) -> dict[str, Any]:
    return {"predictions": np.zeros(len(rows))}


@pytest.fixture(scope="module")
def hostile_app() -> Iterator[Flask]:
    """Model ``m``: a string ``plan``, an int64 ``n``, a float ``x``; bodies up to 8 MB, 16
    instances a request (the unit settings' limit). One app for the module: its tests only
    send refused bodies and read their answers (building an app costs ~25 ms, most of it
    werkzeug compiling the routes' URL builders)."""
    with pytest.MonkeyPatch.context() as env:
        configured = unit_settings(env, max_body_bytes=8 * 1024 * 1024)
        handle = ModelHandle("m", "1", "callable", _zeros, features=FEATURES)
        app = create_app(configured, models=[handle], metrics=ServingMetrics(CollectorRegistry()))
        yield app
        app.extensions["serving"].get_models().stop(timeout_s=10)


@pytest.fixture
def hostile(hostile_app: Flask) -> FlaskClient:
    return hostile_app.test_client()


def peak_of(call: Callable[[], Any]) -> tuple[Any, int]:
    """``call()``'s result and the peak of Python allocations (bytes) while it ran."""
    tracemalloc.start()
    try:
        result = call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


def v2_binary(inputs: list[dict[str, Any]], tail: bytes) -> tuple[bytes, dict[str, str]]:
    """A V2 request of the binary extension: the JSON header, then ``tail``."""
    header = json.dumps({"inputs": inputs}).encode()
    return header + tail, {"Inference-Header-Content-Length": str(len(header))}


# -- 1. a declared shape is checked before anything of its size is allocated ------------


@pytest.mark.parametrize("shape", [[2**22], [2**28], [2**40], [2**63], [1, 2**22], [4, 2**61]])
def test_v2_bytes_binary_shape_is_checked_before_allocating(
    hostile: FlaskClient, shape: list[int]
) -> None:
    """The issue's 121-byte request: BYTES of a huge declared shape and one 5-byte element.
    Before, ``np.empty(prod(shape), object)`` ran first (2.6 GB for 2**28; 500 from 2**40)."""
    inputs = [{"name": "plan", "shape": shape, "datatype": "BYTES",
               "parameters": {"binary_data_size": 9}}]  # fmt: skip
    body, headers = v2_binary(inputs, b"\x05\0\0\0basic")

    response, peak = peak_of(lambda: hostile.post("/v2/models/m/infer", data=body, headers=headers))

    assert response.status_code in (400, 413), response.get_data()[:300]
    assert peak < SMALL_BYTES, f"{peak / 1e6:.1f} MB allocated for a {len(body)}-byte request"
    assert "inputs[0]" in response.get_json()["error"] or response.status_code == 413


@pytest.mark.parametrize(
    "datatype",
    ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
     "FP16", "FP32", "FP64", "BYTES"],
)  # fmt: skip
@pytest.mark.parametrize("shape", [[2**22], [2**40], [2**63], [3, 2**62]])
@pytest.mark.parametrize("binary", [False, True])
def test_v2_every_datatype_shape_is_checked_before_allocating(
    hostile: FlaskClient, datatype: str, shape: list[int], binary: bool
) -> None:
    value = {"BOOL": True, "BYTES": "a"}.get(datatype, 1)
    tensor: dict[str, Any] = {"name": "n", "shape": shape, "datatype": datatype}
    if binary:
        tensor["parameters"] = {"binary_data_size": 9}
        body, headers = v2_binary([tensor], bytes(9))
    else:
        tensor["data"] = [value]
        body, headers = json.dumps({"inputs": [tensor]}).encode(), {}

    response, peak = peak_of(lambda: hostile.post("/v2/models/m/infer", data=body, headers=headers))

    assert response.status_code in (400, 413), response.get_data()[:300]
    assert peak < SMALL_BYTES, f"{peak / 1e6:.1f} MB allocated for a {len(body)}-byte request"


@pytest.mark.parametrize("shape", [[0, 2**63], [0, 2**62, 4], [1, 0, 2**63]])
@pytest.mark.parametrize("datatype", ["FP64", "BYTES"])
@pytest.mark.parametrize("binary", [False, True])
def test_v2_a_tensor_of_no_elements_is_400_whatever_its_other_dimensions(
    hostile: FlaskClient, shape: list[int], datatype: str, binary: bool
) -> None:
    """Numpy cannot shape even an empty array ``[0, 2**63]``: that was a 500."""
    tensor: dict[str, Any] = {"name": "x", "shape": shape, "datatype": datatype}
    if binary:
        tensor["parameters"] = {"binary_data_size": 0}
        body, headers = v2_binary([tensor], b"")
    else:
        tensor["data"] = []
        body, headers = json.dumps({"inputs": [tensor]}).encode(), {}

    response = hostile.post("/v2/models/m/infer", data=body, headers=headers)

    assert response.status_code == 400, response.get_data()[:300]
    assert f"has shape {shape}: no values" in response.get_json()["error"]


def test_v2_instance_limit_is_checked_before_any_tensor_is_decoded(
    hostile: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A BYTES tensor whose bytes do add up (2**18 empty strings, 1 MB) but whose instances
    are over SERVING_MAX_INSTANCES_PER_REQUEST (16 here): 413 before decoding it."""
    decoded: list[str] = []
    for name in ("binary_strings", "binary_values", "json_values"):  # as codec calls them
        real = getattr(v2_codec, name)
        monkeypatch.setattr(
            v2_codec, name, lambda *a, _real=real, _name=name: decoded.append(_name) or _real(*a)
        )
    count = 2**18
    inputs = [
        {"name": "n", "shape": [1], "datatype": "INT64", "data": [1]},
        {"name": "plan", "shape": [count], "datatype": "BYTES",
         "parameters": {"binary_data_size": 4 * count}},
    ]  # fmt: skip
    body, headers = v2_binary(inputs, bytes(4 * count))

    response = hostile.post("/v2/models/m/infer", data=body, headers=headers)

    assert response.status_code == 413, response.get_data()[:300]
    assert "SERVING_MAX_INSTANCES_PER_REQUEST" in response.get_json()["error"]
    assert "input 'plan'" in response.get_json()["error"]
    assert decoded == []


def test_v2_bytes_binary_shape_larger_than_its_elements_names_the_input(
    hostile: FlaskClient,
) -> None:
    inputs = [{"name": "plan", "shape": [16], "datatype": "BYTES",
               "parameters": {"binary_data_size": 9}}]  # fmt: skip
    body, headers = v2_binary(inputs, b"\x05\0\0\0basic")

    response = hostile.post("/v2/models/m/infer", data=body, headers=headers)

    assert response.status_code == 400
    error = response.get_json()["error"]
    assert error.startswith("inputs[0]: input 'plan'"), error
    assert "16 elements" in error and "9 bytes" in error


# -- 2. validation stops at the first error ---------------------------------------------


NUMBERS = ",".join(["1"] * N)  # N bare numbers where lists or objects belong
FLOATS = ",".join(["1.5"] * N)  # N floats where strings or integers belong
KEYS = ", ".join(f'"k{i}": 0' for i in range(N))  # N unknown fields (or columns)
V2_INPUT = '{"name": "a", "shape": [1], "datatype": "FP64", "data": [1]'

#: (schema, body): N bad elements each, where each used to be one error per union branch.
SCHEMA_BODIES: list[tuple[type[BaseModel], str]] = [
    (PredictRequest, f'{{"instances": [{NUMBERS}]}}'),
    (PredictRequest, f'{{"instances": [[1, 2, 3], {NUMBERS}]}}'),
    (PredictRequest, f'{{"instances": [[1, 2, 3]], "outputs": [{NUMBERS}]}}'),
    (PredictRequest, f'{{"instances": [[1]], {KEYS}}}'),
    (MlflowRequest, f'{{"inputs": [{NUMBERS}]}}'),
    (MlflowRequest, f'{{"inputs": [[1], {NUMBERS}]}}'),
    (MlflowRequest, f'{{"instances": [{NUMBERS}]}}'),
    (MlflowRequest, f'{{"dataframe_records": [{NUMBERS}]}}'),
    (MlflowRequest, f'{{"dataframe_split": {{"data": [{NUMBERS}]}}}}'),
    (MlflowRequest, f'{{"dataframe_split": {{"columns": [{FLOATS}], "data": [[1]]}}}}'),
    (MlflowRequest, f'{{"dataframe_split": {{"index": [{FLOATS}], "data": [[1]]}}}}'),
    (MlflowRequest, f'{{"inputs": {{{KEYS}}}}}'),
    (MlflowRequest, f'{{"inputs": [[1]], {KEYS}}}'),
    (TFPredictRequest, f'{{"inputs": {{{KEYS}}}}}'),
    (TFPredictRequest, f'{{"instances": [{{"a": 1}}, {NUMBERS}], "inputs": 5}}'),
    (TFPredictRequest, f'{{"instances": [1], {KEYS}}}'),
    (V2InferRequest, f'{{"inputs": [{NUMBERS}]}}'),
    (V2InferRequest, f'{{"inputs": [{V2_INPUT}}}], "outputs": [{NUMBERS}]}}'),
    (V2InferRequest, f'{{"inputs": [{V2_INPUT}, {KEYS}}}]}}'),
    (V2InferRequest, f'{{"inputs": [{V2_INPUT}, "shape": [{FLOATS}]}}]}}'),
]


@pytest.mark.parametrize(("schema", "body"), SCHEMA_BODIES)
def test_schemas_stop_at_the_first_bad_element(schema: type[BaseModel], body: str) -> None:
    """At most one error per union branch, not one per bad element (a million bare numbers
    as ``instances`` took 14-39 s and up to 2.3 GB before the 422)."""
    with pytest.raises(ValidationError) as caught:
        schema.model_validate_json(body)
    assert caught.value.error_count() <= 3, caught.value.error_count()


#: (path, body, the location the error must name first)
ROUTE_BODIES: list[tuple[str, str, str]] = [
    ("/predict", f'{{"instances": [{NUMBERS}]}}', "instances[0]"),
    ("/predict", f'{{"instances": [[1, 2, 3], {NUMBERS}]}}', "instances[1]"),
    ("/predict", f'{{"instances": [[1, 2, 3]], {KEYS}}}', "k0"),
    ("/invocations", f'{{"inputs": [{NUMBERS}]}}', "inputs[0]"),
    ("/invocations", f'{{"dataframe_records": [{NUMBERS}]}}', "dataframe_records[0]"),
    ("/invocations", f'{{"dataframe_split": {{"data": [{NUMBERS}]}}}}', "dataframe_split.data[0]"),
    ("/v1/models/m:predict", f'{{"inputs": {{{KEYS}}}}}', "inputs.k0"),
    ("/v1/models/m:predict", f'{{"instances": [[1, 2, 3]], {KEYS}}}', "k0"),
    ("/v2/models/m/infer", f'{{"inputs": [{NUMBERS}]}}', "inputs[0]"),
]


@pytest.mark.parametrize(("path", "body", "where"), ROUTE_BODIES)
def test_routes_refuse_a_large_bad_body_naming_the_first_bad_instance(
    hostile: FlaskClient, path: str, body: bytes, where: str
) -> None:
    response, peak = peak_of(lambda: hostile.post(path, data=body, content_type="application/json"))

    assert response.status_code in (400, 422), response.get_data()[:300]
    answer = response.get_json()
    message = answer.get("message") or answer["error"]
    message = message["message"] if isinstance(message, dict) else message
    assert message.startswith(f"{where}:"), message
    assert "more)" not in message, message  # one error, not one per bad element
    # the body as Python values, at most once per union branch the body does not fit (a
    # valid body of this size is one such copy); before, ~1 KB per bad element and branch
    assert peak < 25 * len(body), f"{peak / 1e6:.0f} MB for a {len(body) / 1e6:.1f} MB body"


def test_invocations_csv_of_bad_cells_names_the_first_one(hostile: FlaskClient) -> None:
    body = b"plan,n,x\n" + b"a,1,y\n" * 16

    response = hostile.post("/invocations", data=body, content_type="text/csv")

    assert response.status_code == 422
    assert response.get_json()["message"].startswith("csv[0].x: 'y' is not a number")


# -- 6. integer and float categories are checked as strings are --------------------------

TIER = feature("tier", "integer", np.int64, categories=frozenset({1, 2, 3}))
SCORE = feature("score", "float", np.float64, categories=frozenset({0.5, 1.5}))
PLAN = feature("plan", "string", object, categories=frozenset({"basic", "pro"}))


def _handle(*features: Feature) -> ModelHandle:
    names = tuple(f.name for f in features)
    return ModelHandle("h", "1", "callable", _zeros, features=features, feature_names=names)


@pytest.mark.parametrize(
    ("features", "instances", "loc"),
    [
        ((TIER, PLAN), Records([{"tier": 1, "plan": "pro"}, {"tier": 7, "plan": "pro"}]),
         "instances[1].tier"),
        ((TIER, PLAN), Frame([[1, "pro"], [7, "pro"]]), "instances[1][0] (feature 'tier')"),
        ((TIER, PLAN), Columns({"tier": [1, 7], "plan": ["pro", "pro"]}, 2), "inputs.tier[1]"),
        ((TIER, PLAN), Frame([["1", "pro"], ["7", "pro"]], ["tier", "plan"], "csv", text=True),
         "csv[1].tier"),
        ((TIER, PLAN), Tensors([("tier", np.array([1, 7])),
                                ("plan", np.array(["pro", "pro"], dtype=object))]),
         "inputs[0].data[1]"),
        ((TIER,), Frame([[1], [7]]), "instances[1][0] (feature 'tier')"),
        ((TIER,), Tensors([("input-0", np.array([[1], [7]]))]), "inputs[0].data[1][0]"),
        ((SCORE, PLAN), Records([{"score": 0.5, "plan": "pro"}, {"score": 2.5, "plan": "pro"}]),
         "instances[1].score"),
        ((SCORE,), Frame([[1.5], [2.5]]), "instances[1][0] (feature 'score')"),
    ],
)  # fmt: skip
def test_conform_refuses_an_unknown_number_category(
    features: tuple[Feature, ...], instances: Any, loc: str
) -> None:
    with pytest.raises(InvalidInput) as caught:
        conform(instances, _handle(*features))
    detail = caught.value.details[0]
    assert (detail["loc"], detail["type"]) == (loc, "unknown_category"), detail


@pytest.mark.parametrize("features", [(TIER,), (TIER, PLAN), (SCORE, PLAN), (SCORE,)])
def test_sample_batch_takes_values_each_feature_allows(features: tuple[Feature, ...]) -> None:
    batch = sample_batch(features, 3)

    for j, f in enumerate(features):
        values = batch[f.name] if batch.dtype.names else batch[:, j]
        assert f.categories is None or set(values.tolist()) <= f.categories, (f, values)


def test_a_pipeline_whose_integer_categories_exclude_zero_warms_up_and_refuses_7() -> None:
    model, frame = tier_pipeline()
    handle = estimator_handle(model, name="tier", version="1", format="pickle")

    assert handle.warmup(1, 8)  # fed 0 before: "Found unknown categories [0]"
    with pytest.raises(InvalidInput) as caught:
        conform(Records([{"tier": 7, "plan": "pro", "usage": 1.0}]), handle)
    assert caught.value.details[0]["loc"] == "instances[0].tier"
    known = frame.head(3)
    batch = conform(Records(known.to_dict("records")), handle)
    assert handle.predict_batch(batch)["predictions"].tolist() == model.predict(known).tolist()


# -- 12. text that is not a number for the client is not one here -------------------------


@pytest.mark.parametrize(
    ("cell", "column", "why"),
    [
        ("1" * 5000, "n", "is not an integer the model's int64 input can hold"),
        ("-" + "9" * 4301, "n", "is not an integer the model's int64 input can hold"),
        ("1" * 5000, "x", "is outside the float64 range"),
        ("\u0661\u0662", "n", "is not a number"),  # Arabic-Indic digits: int() reads 12
        ("\uff11\uff12", "n", "is not a number"),  # full-width digits
        ("\u0661.5", "x", "is not a number"),
        ("\uff11e3", "x", "is not a number"),
    ],
)
def test_invocations_csv_numbers_are_ascii_and_bounded(
    hostile: FlaskClient, cell: str, column: str, why: str
) -> None:
    row = {"plan": "a", "n": "1", "x": "2.5"} | {column: cell}
    body = f"plan,n,x\n{row['plan']},{row['n']},{row['x']}\n".encode()

    response = hostile.post("/invocations", data=body, content_type="text/csv")

    assert response.status_code == 422, response.get_data()[:300]
    message = response.get_json()["message"]
    assert message.startswith(f"csv[0].{column}: ") and why in message, message


def test_v2_bytes_tensor_of_json_numbers_says_it_wants_strings(hostile: FlaskClient) -> None:
    inputs = [
        {"name": "plan", "shape": [1], "datatype": "BYTES", "data": [7]},
        {"name": "n", "shape": [1], "datatype": "INT64", "data": [1]},
        {"name": "x", "shape": [1], "datatype": "FP64", "data": [1.0]},
    ]

    response = hostile.post("/v2/models/m/infer", json={"inputs": inputs})

    assert response.status_code == 400
    error = response.get_json()["error"]
    assert error.startswith("inputs[0]: input 'plan': data[0] = 7 is not a string"), error
    assert "BYTES elements are JSON strings" in error, error


def test_invocations_csv_of_too_many_rows_is_413_before_reading_them_all(
    hostile: FlaskClient,
) -> None:
    """Found by the attack: 700k one-cell rows (2 MB) were all read before the 413 (2.1 s
    and +194 MB in a worker, against 0.1 s and +16 MB for a valid CSV that size). Reading
    stops at the row past SERVING_MAX_INSTANCES_PER_REQUEST (16 here)."""
    body = b"plan,n,x\n" + b"pro,1,0.5\n" * 200_000
    answer, peak = peak_of(lambda: hostile.post("/invocations", data=body, content_type="text/csv"))
    few = b"plan,n,x\n" + b"pro,1,0.5\n" * 16

    assert answer.status_code == 413
    assert "SERVING_MAX_INSTANCES_PER_REQUEST" in answer.get_json()["message"]
    assert peak < 6 * len(body)  # the body, its text and a reader of it (was 70 MB: 35x)
    assert hostile.post("/invocations", data=few, content_type="text/csv").status_code == 200


ROW = b'[{"plan": "a", "n": 1, "x": 0.5}]'
GOOD_BODIES = [
    ("/predict", "application/json", b'{"instances": %s}' % ROW),
    ("/predict/m", "application/json", b'{"instances": %s}' % ROW),
    ("/v1/models/m:predict", "application/json", b'{"instances": %s}' % ROW),
    ("/invocations", "application/json", b'{"dataframe_records": %s}' % ROW),
    ("/invocations", "text/csv", b"plan,n,x\na,1,0.5\n"),
    (
        "/v2/models/m/infer",
        "application/json",
        b'{"inputs": [{"name": "plan", "datatype": "BYTES", "shape": [1], "data": ["a"]},'
        b' {"name": "n", "datatype": "INT64", "shape": [1], "data": [1]},'
        b' {"name": "x", "datatype": "FP64", "shape": [1], "data": [0.5]}]}',
    ),
]


@pytest.mark.parametrize(("path", "content_type", "body"), GOOD_BODIES)
@pytest.mark.parametrize("encoding", ["gzip", "br", "deflate, gzip"])
def test_every_route_refuses_a_compressed_body_naming_its_content_encoding(
    hostile: FlaskClient, path: str, content_type: str, body: bytes, encoding: str
) -> None:
    plain = hostile.post(path, data=body, content_type=content_type)
    # A body said to be compressed is not read as if it were not: a gzipped JSON body got
    # "not valid JSON: expected value at line 1 column 1", a plain one labelled gzip was
    # answered, on every route but V2's.
    labelled = hostile.post(
        path, data=body, content_type=content_type, headers={"Content-Encoding": encoding}
    )

    assert plain.status_code == 200, plain.get_data()[:300]
    assert labelled.status_code == 415, labelled.get_data()[:300]  # RFC 9110, 15.5.16
    assert labelled.headers["Accept-Encoding"] == "identity"
    answer = labelled.get_json()
    message = answer.get("message") or answer["error"]
    message = message["message"] if isinstance(message, dict) else message
    assert f"Content-Encoding {encoding!r} is not supported" in message, message
    assert "unsupported_content_encoding" in labelled.get_data(as_text=True)


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/predict/nope", 404),
        ("/v1/models/nope:predict", 404),
        ("/v1/models/m/versions/9:predict", 409),
        ("/v2/models/nope/infer", 404),
    ],
)
def test_too_many_instances_for_a_model_not_served_here_is_404_or_409(
    hostile: FlaskClient, path: str, status: int
) -> None:
    # The README: an unknown model is a 404 whatever the body; 17 instances (over the
    # limit of 16) were a 413 first on /predict/<name> and TF Serving.
    rows = [{"plan": "a", "n": 1, "x": 0.5}] * 17
    body = (
        {"inputs": [{"name": "x", "datatype": "FP64", "shape": [17], "data": [0.5] * 17}]}
        if path.startswith("/v2")
        else {"instances": rows}
    )
    response = hostile.post(path, json=body)

    assert response.status_code == status, response.get_data()[:300]


@pytest.mark.parametrize(("path", "content_type", "body"), GOOD_BODIES[:5])
@pytest.mark.parametrize("charset", ["utf-16", "UTF-32LE", '"latin-1"'])
def test_a_json_or_csv_body_in_another_charset_is_415_naming_utf8(
    hostile: FlaskClient, path: str, content_type: str, body: bytes, charset: str
) -> None:
    # JSON is UTF-8 (RFC 8259, section 8.1): a UTF-16 body was read as UTF-8 and refused
    # as "not valid JSON: expected value at line 1 column 1"; a CSV one was taken, then
    # refused with a 422 "not UTF-8".
    encoding = charset.strip('"')
    declared = f"{content_type}; charset={charset}"
    other = hostile.post(path, data=body.decode().encode(encoding), content_type=declared)
    utf8 = hostile.post(path, data=body, content_type=f"{content_type}; Charset=UTF-8")
    parameter = hostile.post(path, data=body, content_type=f"{content_type}; foo")

    assert other.status_code == 415, other.get_data()[:300]
    assert "UTF-8" in other.get_data(as_text=True)
    assert (utf8.status_code, parameter.status_code) == (200, 200)
