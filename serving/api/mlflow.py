"""MLflow / SageMaker scoring: ``GET /ping`` and ``POST /invocations``, so clients of
``mlflow models serve`` (and SageMaker-style containers) work against this server.

``/invocations`` takes MLflow's JSON bodies (``dataframe_split``, ``dataframe_records``,
``instances``, ``inputs``; ``params`` accepted and ignored) or ``text/csv`` with a header
row, scores them with the default model (the first of ``SERVING_MODELS``) through the
shared request path and batcher, and answers ``{"predictions": [...]}``: one label or
value per instance, like MLflow's scikit-learn flavour. Named columns are reordered to the
model's feature names; a model without names takes them positionally. Errors are MLflow's
``{"error_code", "message"}`` plus our ``code``, with the service's statuses.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from flask import Blueprint, Response, request

from serving.api.common import (
    context,
    json_response,
    read_body,
    read_json_body,
    register_error_body,
)
from serving.api.frames import frame_matrix, invalid, parse_csv, records_matrix
from serving.api.inference import check_instance_count, jsonable, run_batch, to_matrix
from serving.errors import UnsupportedMediaType
from serving.handle import ModelHandle
from serving.openapi import Operation, errors
from serving.schemas import parse_body
from serving.schemas_mlflow import (
    MlflowErrorResponse,
    MlflowRequest,
    MlflowResponse,
    PingResponse,
)
from serving.workers import readiness

__all__ = ["OPERATIONS", "bp"]

bp = Blueprint("mlflow", __name__)

OPERATIONS = [
    Operation(
        "get",
        "/ping",
        "SageMaker/MLflow health check: 200 when every model is ready, 503 otherwise",
        {200: PingResponse, 503: PingResponse},
        tag="mlflow",
        security=False,
    ),
    Operation(
        "post",
        "/invocations",
        "MLflow scoring: one prediction per row of a DataFrame (JSON or CSV), default model",
        {200: MlflowResponse}
        | errors(MlflowErrorResponse, 400, 401, 408, 413, 415, 422, 500, 503, 504),
        request=MlflowRequest,
        tag="mlflow",
        text_request_media_types=("text/csv",),
    ),
]

_ERROR_CODES = {
    400: "MALFORMED_REQUEST",
    401: "UNAUTHENTICATED",
    500: "INTERNAL_ERROR",
    503: "TEMPORARILY_UNAVAILABLE",
    408: "DEADLINE_EXCEEDED",
    504: "DEADLINE_EXCEEDED",
}


def _error_code(status: int) -> str:
    """MLflow's ``error_code`` for an HTTP status (its ``databricks_pb2.ErrorCode`` names)."""
    return _ERROR_CODES.get(status, "BAD_REQUEST" if status < 500 else "INTERNAL_ERROR")


register_error_body("mlflow", lambda status, code, message, details: {
    "error_code": _error_code(status), "message": message, "code": code,
}, "/invocations", "/ping")  # fmt: skip


@bp.get("/ping")
def ping() -> Response:
    """200 ``{"status": "ready"}`` once every worker has every model ready, else 503 with
    the state (SageMaker and ``mlflow models serve`` clients poll it before scoring)."""
    state = context().get_models().state
    ready, _ = readiness(state)
    if state == "ready" and not ready:
        state = "loading"  # this worker is ready, another is not yet
    response = json_response({"status": state}, 200 if ready else 503)
    if not ready:
        response.headers["Retry-After"] = "1"
    return response


@bp.post("/invocations", provide_automatic_options=False)
def invocations() -> Response:
    """Score a DataFrame with the default model.

    :raises UnsupportedMediaType: (415) unless ``application/json`` or ``text/csv``.
    :raises InvalidInput: (422) for a body MLflow would refuse, a missing or unknown column
        name, or a value that is not a finite number.
    """
    ctx = context()
    limit = ctx.settings.max_body_bytes
    mimetype = request.mimetype
    if mimetype == "text/csv":
        columns, data = parse_csv(read_body(limit))
        check_instance_count(len(data))
        runtime = ctx.get_models().resolve()
        handle, _ = runtime.require_ready()
        rows = frame_matrix(columns, data, handle, "csv", "csv.header")
        field = "csv (instance 0 is line 2)"
    elif mimetype == "application/json" or mimetype.endswith("+json"):
        body = parse_body(MlflowRequest, read_json_body(limit))
        runtime = ctx.get_models().resolve()
        handle, _ = runtime.require_ready()
        rows = _json_rows(body, handle)
        field = next(name for name in MlflowRequest.model_fields if getattr(body, name))
    else:
        raise UnsupportedMediaType(request.content_type, "application/json or text/csv")
    _, outputs = run_batch(runtime, rows, field)
    return json_response({"predictions": jsonable(outputs["predictions"])})


def _json_rows(body: MlflowRequest, handle: ModelHandle) -> npt.NDArray[np.float64]:
    """The rows of whichever data field ``body`` has (the schema allows exactly one)."""
    if body.dataframe_split is not None:
        split = body.dataframe_split
        check_instance_count(len(split.data))
        if split.index is not None and len(split.index) != len(split.data):
            msg = f"has {len(split.index)} labels for {len(split.data)} rows"
            raise invalid("dataframe_split.index", msg, "index_length")
        field = "dataframe_split.data"
        return frame_matrix(split.columns, split.data, handle, field, "dataframe_split.columns")
    if body.dataframe_records is not None:
        check_instance_count(len(body.dataframe_records))
        return records_matrix(body.dataframe_records, handle, "dataframe_records")
    if body.instances is not None:
        check_instance_count(len(body.instances))
        if isinstance(body.instances[0], dict):
            return records_matrix(body.instances, handle, "instances")
        return to_matrix(body.instances, handle, "instances")
    inputs = body.inputs
    assert inputs is not None
    if not isinstance(inputs, dict):
        if not inputs:
            raise invalid("inputs", "no instances", "too_short")
        check_instance_count(len(inputs))
        return to_matrix(inputs, handle, "inputs")
    if not inputs:
        raise invalid("inputs", "no columns", "too_short")
    columns = list(inputs)
    n = len(inputs[columns[0]])
    for name in columns:
        if len(inputs[name]) != n:
            msg = f"has {len(inputs[name])} values; every column needs one per instance ({n})"
            raise invalid(f"inputs.{name}", msg, "instance_count")
    if n == 0:
        raise invalid("inputs", "no instances", "too_short")
    check_instance_count(n)
    data = [[inputs[name][i] for name in columns] for i in range(n)]
    return frame_matrix(columns, data, handle, "inputs", "inputs")
