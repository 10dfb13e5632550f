"""TF Serving's REST API: ``POST /v1/models/{name}[/versions/{version}]:predict`` (and
``:classify``, ``:regress``), model status and model metadata, so TensorFlow Serving
clients can call this server unchanged.
Each also answers under ``/v1/models/{name}/labels/{label}``, a version label of the model's
``SERVING_MODELS`` entries (``"labels": {"stable": "1"}``, TF Serving's ``version_labels``);
an unknown label is a 404 ``label_not_found``.

Source: https://www.tensorflow.org/tfx/serving/api_rest. Requests go through the data
plane (``serving.dataplane``) and the model's batcher, merged with ``/predict`` and the
other protocols. Errors are TF Serving's ``{"error": message}`` plus our stable
``code``, with the service's statuses (404 unknown model, 409 version not served, 422
invalid input). ``signature_name`` may only name the one signature, ``serving_default``.
Model names cannot contain ``:`` or ``/`` (``SERVING_MODELS`` refuses them), so
``<name>:predict`` always splits at the last ``:``; versions cannot end in a method.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np
from flask import Blueprint, Response
from werkzeug.routing import BaseConverter

from serving.context import Call
from serving.dataplane import DataPlane, Inference
from serving.errors import InvalidInput, LabelNotFound, ServingError
from serving.model.handle import Outputs, TensorSpec
from serving.openapi import Operation, errors
from serving.protocols.base import (
    Answer,
    ErrorStyle,
    Handler,
    ProtocolSpec,
    Route,
    dataplane,
    json_answer,
    json_response,
    model_before_body,
)
from serving.protocols.bodies import read_json_body
from serving.protocols.schemas import parse_body
from serving.protocols.tfserving.codec import (
    classify_result,
    columnar_outputs,
    decode,
    decode_examples,
    regress_result,
    row_predictions,
)
from serving.protocols.tfserving.schemas import (
    TFClassifyResponse,
    TFErrorResponse,
    TFExamplesRequest,
    TFMetadataResponse,
    TFPredictRequest,
    TFPredictResponse,
    TFRegressResponse,
    TFStatusResponse,
)
from serving.runtime import ModelRuntime, State

__all__ = ["OPERATIONS", "PROTOCOL", "bp"]

bp = Blueprint("tfserving", __name__)

SIGNATURE = "serving_default"
#: A TF Serving request body (both name an optional ``signature_name``).
_Body = TypeVar("_Body", TFPredictRequest, TFExamplesRequest)
_MODEL = "/v1/models/<tf_model:model_name>"
_VERSION = _MODEL + "/versions/<model_version>"
_LABEL = _MODEL + "/labels/<tf_model:label>"


def _both(suffix: str) -> tuple[str, str, str]:
    """The OpenAPI paths of a route: the model, a version of it, a version label of it."""
    return (
        "/v1/models/{model_name}" + suffix,
        "/v1/models/{model_name}/versions/{model_version}" + suffix,
        "/v1/models/{model_name}/labels/{label}" + suffix,
    )


def _version(
    plane: DataPlane, model_name: str, model_version: str | None, label: str | None
) -> str | None:
    """The version asked for: ``model_version``, or the one ``label`` names.

    :raises ModelNotFound: (404) no model ``model_name``.
    :raises LabelNotFound: (404) the model has no such label.
    """
    if label is None:
        return model_version
    labels = plane.models.version_labels(model_name)
    if label not in labels:
        plane.models.resolve(model_name)  # an unknown model is a model_not_found
        raise LabelNotFound(model_name, label, sorted(labels))
    return labels[label]


_PREDICT_ERRORS = errors(
    TFErrorResponse, 400, 401, 404, 408, 409, 413, 415, 422, 500, 501, 503, 504
)
#: TF Serving's POST methods: their summary, answer and body.
_METHODS = (
    (":predict", "TF Serving predict: row (instances) or columnar (inputs) format",
     TFPredictResponse, TFPredictRequest),
    (":classify", "TF Serving classify: each example's class labels with their probabilities",
     TFClassifyResponse, TFExamplesRequest),
    (":regress", "TF Serving regress: each example's predicted number (regression models)",
     TFRegressResponse, TFExamplesRequest),
)  # fmt: skip
OPERATIONS = [
    *(
        Operation(
            "post", path, summary, {200: answer} | _PREDICT_ERRORS, request=body, tag="tfserving"
        )
        for method, summary, answer, body in _METHODS
        for path in _both(method)
    ),
    *(
        Operation(
            "get",
            path,
            "TF Serving model status: the state of each version served",
            {200: TFStatusResponse} | errors(TFErrorResponse, 401, 404, 409),
            tag="tfserving",
        )
        for path in _both("")
    ),
    *(
        Operation(
            "get",
            path,
            "TF Serving model metadata: inputs, outputs and the feature names in order",
            {200: TFMetadataResponse} | errors(TFErrorResponse, 401, 404, 409, 503),
            tag="tfserving",
        )
        for path in _both("/metadata")
    ),
]


class ModelNameConverter(BaseConverter):
    """A model name: one path segment without ``:``, so ``<name>:predict`` routes."""

    regex = r"[^/:]+"


def _error_body(
    status: int, code: str, message: str, details: list[dict[str, Any]]
) -> dict[str, Any]:
    return {"error": message, "code": code}


def predict(
    plane: DataPlane,
    call: Call,
    environ: Mapping[str, Any],
    *,
    model_name: str,
    model_version: str | None = None,
    label: str | None = None,
) -> Answer:
    """Row format answers ``{"predictions": ...}``, columnar ``{"outputs": ...}``."""
    model_version, body = _read(
        plane, environ, TFPredictRequest, model_name, model_version=model_version, label=label
    )
    answer = plane.infer(call, model_name, model_version, decode(body))
    if body.instances is not None:
        return json_answer({"predictions": row_predictions(answer.outputs)})
    return json_answer({"outputs": columnar_outputs(answer.outputs)})


def _read(
    plane: DataPlane,
    environ: Mapping[str, Any],
    schema: type[_Body],
    model_name: str,
    *,
    model_version: str | None,
    label: str | None,
) -> tuple[str | None, _Body]:
    """The version asked for (``label``'s, if one) and the body as ``schema``.

    :raises ModelNotFound: (404) no such model, whatever the body.
    :raises InvalidInput: (422) for a signature other than the one served.
    """
    model_version = _version(plane, model_name, model_version, label)
    try:
        body = parse_body(schema, read_json_body(environ, plane.settings))
    except ServingError:
        model_before_body(plane, model_name, model_version)
        raise
    if body.signature_name not in (None, "", SIGNATURE):
        msg = f"signature {body.signature_name!r} not found; the model has {SIGNATURE!r}"
        raise InvalidInput.at("signature_name", msg, "signature")
    return model_version, body


def _examples(
    plane: DataPlane,
    call: Call,
    environ: Mapping[str, Any],
    model_name: str,
    *,
    model_version: str | None,
    label: str | None,
) -> Inference:
    """The answer to a ``:classify`` or ``:regress`` body's examples."""
    model_version, body = _read(
        plane, environ, TFExamplesRequest, model_name, model_version=model_version, label=label
    )
    return plane.infer(call, model_name, model_version, decode_examples(body))


def _method(result: Callable[[Outputs, tuple[Any, ...] | None], list[Any]]) -> Handler:
    """The handler of ``:classify`` or ``:regress``: the examples answered, then
    ``{"result": result(outputs, classes)}``."""

    def handle(
        plane: DataPlane,
        call: Call,
        environ: Mapping[str, Any],
        *,
        model_name: str,
        model_version: str | None = None,
        label: str | None = None,
    ) -> Answer:
        answer = _examples(
            plane, call, environ, model_name, model_version=model_version, label=label
        )
        return json_answer({"result": result(answer.outputs, answer.handle.classes)})

    return handle


#: ``{"result": [[[label, probability], ...], ...]}``, one list per example.
classify = _method(classify_result)
#: ``{"result": [number, ...]}``, one per example.
regress = _method(regress_result)


_STATES: dict[State, tuple[str, str]] = {
    "loading": ("LOADING", "UNAVAILABLE"),
    "ready": ("AVAILABLE", "OK"),
    "stopping": ("UNLOADING", "UNAVAILABLE"),
    "failed": ("END", "UNKNOWN"),
}


def _version_status(runtime: ModelRuntime) -> dict[str, Any]:
    state, error_code = _STATES[runtime.state]
    message = ""
    if runtime.state == "failed":
        message = runtime.problem() or str(runtime.error)
    status = {"error_code": error_code, "error_message": message}
    return {"version": runtime.model_version, "state": state, "status": status}


@bp.get(_MODEL, defaults={"model_version": None})
@bp.get(_VERSION)
@bp.get(_LABEL, defaults={"model_version": None})
def status(model_name: str, model_version: str | None, label: str | None = None) -> Response:
    """Every version of the model this worker serves (or the one asked for), with its
    state; 200 whatever the state, as TF Serving answers."""
    plane = dataplane()
    model_version = _version(plane, model_name, model_version, label)
    cache = plane.models
    pinned = cache.resolve(model_name, model_version)
    runtimes = [pinned] if model_version is not None else [
        runtime for runtime in cache.runtimes if runtime.model_name == model_name
    ]  # fmt: skip
    return json_response({"model_version_status": [_version_status(r) for r in runtimes]})


_TF_DTYPES = {
    ("f", 2): "DT_HALF", ("f", 4): "DT_FLOAT", ("f", 8): "DT_DOUBLE",
    ("i", 1): "DT_INT8", ("i", 2): "DT_INT16", ("i", 4): "DT_INT32", ("i", 8): "DT_INT64",
    ("u", 1): "DT_UINT8", ("u", 2): "DT_UINT16", ("u", 4): "DT_UINT32", ("u", 8): "DT_UINT64",
    ("b", 1): "DT_BOOL",
}  # fmt: skip


def _tensor_info(spec: TensorSpec) -> dict[str, Any]:
    """A ``TensorSpec`` as TF Serving's TensorInfo (sizes are decimal strings, int64 in
    proto JSON; ``-1`` for the batch axis)."""
    dtype = np.dtype(spec.dtype)
    name = _TF_DTYPES.get((dtype.kind, dtype.itemsize), "DT_STRING" if dtype.kind in "OUS" else
                          "DT_INVALID")  # fmt: skip
    dims = [{"size": str(size), "name": ""} for size in spec.shape]
    return {"dtype": name, "tensor_shape": {"dim": dims, "unknown_rank": False}, "name": spec.name}


@bp.get(_MODEL + "/metadata", defaults={"model_version": None})
@bp.get(_VERSION + "/metadata")
@bp.get(_LABEL + "/metadata", defaults={"model_version": None})
def metadata(model_name: str, model_version: str | None, label: str | None = None) -> Response:
    """The ``serving_default`` signature's inputs and outputs, and the feature names.

    :raises NotReady: (503) until the model is loaded (its inputs are not known before).
    """
    plane = dataplane()
    model_version = _version(plane, model_name, model_version, label)
    runtime, handle = plane.ready(model_name, model_version)
    signature = {
        "inputs": {spec.name: _tensor_info(spec) for spec in handle.input_specs()},
        "outputs": {spec.name: _tensor_info(spec) for spec in runtime.outputs},
        "method_name": "tensorflow/serving/predict",
    }
    names = list(handle.feature_names) if handle.feature_names is not None else None
    body = {
        "model_spec": {"name": handle.name, "signature_name": "", "version": handle.version},
        "metadata": {
            "signature_def": {"signature_def": {SIGNATURE: signature}},
            "feature_names": names,
        },
    }
    return json_response(body)


#: Errors as ``{"error": message, "code"}``, with the service's statuses.
PROTOCOL = ProtocolSpec(
    bp,
    OPERATIONS,
    ErrorStyle(_error_body),
    ("/v1/",),
    routes=(
        Route(_MODEL + ":predict", predict),
        Route(_VERSION + ":predict", predict),
        Route(_LABEL + ":predict", predict),
        *(Route(path + ":classify", classify) for path in (_MODEL, _VERSION, _LABEL)),
        *(Route(path + ":regress", regress) for path in (_MODEL, _VERSION, _LABEL)),
    ),
    converters={"tf_model": ModelNameConverter},
    examples=lambda example: {
        path: {"instances": [example.instance]} for path in _both(":predict")
    },
)
