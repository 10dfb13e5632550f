"""``POST /predict``: ``{"instances": [[...], ...]}`` -> one prediction per instance."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from flask import Blueprint

from serving.context import Call
from serving.dataplane import DataPlane
from serving.errors import InvalidInput, ServingError
from serving.openapi import Operation, errors
from serving.protocols.base import Answer, ProtocolSpec, Route, json_answer, model_before_body
from serving.protocols.bodies import read_json_body
from serving.protocols.predict import codec
from serving.protocols.predict.schemas import PredictRequest, PredictResponse
from serving.protocols.schemas import ErrorResponse, parse_body

__all__ = ["OPERATIONS", "PROTOCOL", "bp", "predict"]

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


def predict(
    plane: DataPlane, call: Call, environ: Mapping[str, Any], *, model_name: str | None = None
) -> Answer:
    """The answer to the ``/predict`` request of WSGI ``environ``, by the model the path
    (``model_name``) or the body's ``model`` names (default: the first of
    ``SERVING_MODELS``); the body's ``model_version`` picks another version of it, or is
    refused with 409 when this replica lacks it.

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
    return json_answer(codec.encode(answer, body.outputs, latency_ms))


#: No cold routes (``bp`` is empty); errors in the service's own shape.
PROTOCOL = ProtocolSpec(
    bp,
    OPERATIONS,
    routes=(Route("/predict", predict), Route("/predict/<model_name>", predict)),
    examples=lambda example: {
        path: {"instances": [example.instance]} for path in ("/predict", "/predict/{model_name}")
    },
)
