"""``POST /predict``: ``{"instances": [[...], ...]}`` -> one prediction per instance."""

from __future__ import annotations

import time
from typing import Any

from flask import Blueprint, Response, g

from serving.api.common import context, json_response, read_json_body
from serving.api.inference import (
    check_instance_count,
    check_outputs,
    jsonable,
    run_batch,
    to_matrix,
)
from serving.openapi import Operation, errors
from serving.schemas import ErrorResponse, PredictRequest, PredictResponse, parse_body

__all__ = ["OPERATIONS", "bp"]

bp = Blueprint("predict", __name__)

OPERATIONS = [
    Operation(
        "post",
        "/predict",
        "One prediction per instance from the default model (or its pinned version)",
        {200: PredictResponse}
        | errors(ErrorResponse, 400, 401, 404, 408, 409, 413, 415, 422, 500, 503, 504),
        request=PredictRequest,
    )
]


@bp.post("/predict", provide_automatic_options=False)
def predict() -> Response:
    """Predict with the default model (the first of ``SERVING_MODELS``); ``model_version``
    picks another version of it, or is refused with 409 when this replica lacks it."""
    ctx = context()
    request = parse_body(PredictRequest, read_json_body(ctx.settings.max_body_bytes))
    check_instance_count(len(request.instances))
    runtime = ctx.get_models().resolve(None, request.model_version)
    handle, _ = runtime.require_ready()
    check_outputs(request.outputs, handle.output_names)
    rows = to_matrix(request.instances, handle)
    handle, outputs = run_batch(runtime, rows)
    body: dict[str, Any] = {"predictions": jsonable(outputs["predictions"])}
    if "probabilities" in outputs:
        body["probabilities"] = jsonable(outputs["probabilities"])
        if handle.classes is not None:
            body["classes"] = handle.classes
    if request.outputs is not None:
        check_outputs(request.outputs, tuple(outputs))
        body["outputs"] = {name: jsonable(outputs[name]) for name in request.outputs}
    body["model_name"] = handle.name
    body["model_version"] = handle.version
    body["latency_ms"] = round((time.perf_counter() - g.started) * 1000.0, 3)
    return json_response(body)
