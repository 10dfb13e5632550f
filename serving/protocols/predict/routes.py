"""``POST /predict``: ``{"instances": [[...], ...]}`` -> one prediction per instance."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from flask import Blueprint, Response, request

from serving.context import Call
from serving.dataplane import DataPlane
from serving.errors import InvalidInput, ServingError
from serving.openapi import Operation, errors
from serving.protocols.base import (
    ProtocolSpec,
    dataplane,
    json_response,
    model_before_body,
    read_json_body,
    with_call,
)
from serving.protocols.predict import codec
from serving.protocols.predict.schemas import PredictRequest, PredictResponse
from serving.protocols.schemas import ErrorResponse, parse_body

__all__ = ["OPERATIONS", "PROTOCOL", "bp", "respond"]

bp = Blueprint("predict", __name__)

OPERATIONS = [
    Operation(
        "post",
        path,
        summary,
        {200: PredictResponse}
        | errors(ErrorResponse, 400, 401, 404, 408, 409, 413, 415, 422, 500, 501, 503, 504),
        request=PredictRequest,
    )
    for path, summary in (
        ("/predict", "One prediction per instance from the default model (or body.model)"),
        ("/predict/{model_name}", "One prediction per instance from the model named"),
    )
]

#: Errors in the service's own shape.
PROTOCOL = ProtocolSpec(bp, OPERATIONS)


@bp.post("/predict", defaults={"model_name": None}, provide_automatic_options=False)
@bp.post("/predict/<model_name>", provide_automatic_options=False)
@with_call
def predict(call: Call, model_name: str | None) -> Response:
    """Predict with the model the path or ``model`` names (``respond``)."""
    return json_response(respond(dataplane(), call, model_name, request.environ))


def respond(
    plane: DataPlane, call: Call, model_name: str | None, environ: Mapping[str, Any]
) -> dict[str, Any]:
    """The answer to the ``/predict`` request of WSGI ``environ``, by the model the path
    (``model_name``) or the body's ``model`` names (default: the first of
    ``SERVING_MODELS``); the body's ``model_version`` picks another version of it, or is
    refused with 409 when this replica lacks it. The Flask view and the fast path
    (``serving.protocols.predict.fast``) both answer with it.

    :raises InvalidInput: (422) when the path and the body name different models; as
        ``DataPlane.infer`` for the rest (each ``ServingError`` is answered with its
        status).
    """
    try:
        body = parse_body(PredictRequest, read_json_body(environ, plane.settings))
    except ServingError:
        model_before_body(plane, model_name, None)
        raise
    if model_name is not None and body.model not in (None, model_name):
        msg = f"names model {body.model!r}, but the path names {model_name!r}"
        raise InvalidInput.at("model", msg, "model")
    answer = plane.infer(
        call, model_name or body.model, body.model_version, codec.decode(body),
        outputs=body.outputs,
    )  # fmt: skip
    latency_ms = round((time.perf_counter() - answer.timing.started) * 1000.0, 3)
    return codec.encode(answer, body.outputs, latency_ms)
