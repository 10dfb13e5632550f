"""MLflow / SageMaker scoring: ``GET /ping`` and ``POST /invocations``, so clients of
``mlflow models serve`` (and SageMaker-style containers) work against this server.

``/invocations`` takes MLflow's JSON bodies (``dataframe_split``, ``dataframe_records``,
``instances``, ``inputs``; ``params`` accepted and ignored) or ``text/csv`` with a header
row, scores them with the default model (the first of ``SERVING_MODELS``) through the
shared request path and batcher, and answers ``{"predictions": [...]}``: what
``mlflow.pyfunc`` answers, one label or value per instance, or each instance's class
probabilities for an MLflow folder saved with ``pyfunc_predict_fn="predict_proba"``.
Named columns are reordered to the model's feature names; a model without names takes
them positionally. Errors are MLflow's ``{"error_code", "message"}`` plus our ``code``,
with the service's statuses.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flask import Blueprint, Response

from serving import __version__
from serving.context import Call
from serving.dataplane import DataPlane
from serving.errors import UnsupportedMediaType
from serving.inputs.instances import Instances
from serving.inputs.rules import MLFLOW
from serving.openapi import Operation, errors
from serving.protocols.base import (
    Answer,
    ErrorStyle,
    Example,
    ProtocolSpec,
    Route,
    dataplane,
    json_answer,
    json_response,
    jsonable,
)
from serving.protocols.bodies import is_json, media_type, read_json_body, read_utf8_body
from serving.protocols.mlflow.codec import decode, decode_csv
from serving.protocols.mlflow.schemas import (
    MlflowErrorResponse,
    MlflowRequest,
    MlflowResponse,
    PingResponse,
)
from serving.protocols.schemas import parse_body
from serving.server.board import readiness

__all__ = ["OPERATIONS", "PROTOCOL", "bp"]

bp = Blueprint("mlflow", __name__)

OPERATIONS = [
    *(
        Operation(
            "get",
            path,
            "SageMaker/MLflow health check: 200 when every model is ready, 503 otherwise",
            {200: PingResponse, 503: PingResponse},
            tag="mlflow",
            security=False,
            traced=False,
        )
        for path in ("/ping", "/health")
    ),
    Operation(
        "get",
        "/version",
        "The server's version, as text (MLflow's scoring server answers its own)",
        {200: None} | errors(MlflowErrorResponse, 401),
        tag="mlflow",
        text_responses={200: "text/plain"},
    ),
    Operation(
        "post",
        "/invocations",
        "MLflow scoring: one prediction per row of a DataFrame (JSON or CSV), default model "
        "(labels, or probabilities for an MLflow folder saved with predict_fn predict_proba)",
        {200: MlflowResponse}
        | errors(MlflowErrorResponse, 400, 401, 408, 413, 415, 422, 500, 501, 503, 504),
        request=MlflowRequest,
        tag="mlflow",
        text_request_media_types=("text/csv",),
    ),
]

_ERROR_CODES = {
    400: "MALFORMED_REQUEST",
    422: "INVALID_PARAMETER_VALUE",  # as MLflow answers a body its schema refuses
    401: "UNAUTHENTICATED",
    500: "INTERNAL_ERROR",
    501: "NOT_IMPLEMENTED",
    503: "TEMPORARILY_UNAVAILABLE",
    408: "DEADLINE_EXCEEDED",
    504: "DEADLINE_EXCEEDED",
}


def _error_code(status: int) -> str:
    """MLflow's ``error_code`` for an HTTP status (its ``databricks_pb2.ErrorCode`` names)."""
    return _ERROR_CODES.get(status, "BAD_REQUEST" if status < 500 else "INTERNAL_ERROR")


def _error_body(
    status: int, code: str, message: str, details: list[dict[str, Any]]
) -> dict[str, Any]:
    return {"error_code": _error_code(status), "message": message, "code": code}


@bp.get("/version")
def version() -> Response:
    return Response(__version__, mimetype="text/plain")


@bp.get("/ping")
@bp.get("/health")
def ping() -> Response:
    """200 ``{"status": "ready"}`` once every worker has every model ready, else 503 with
    the state (SageMaker and ``mlflow models serve`` clients poll it before scoring)."""
    state = dataplane().models.state
    ready, _ = readiness(state)
    if state == "ready" and not ready:
        state = "loading"  # this worker is ready, another is not yet
    response = json_response({"status": state}, 200 if ready else 503)
    if not ready:
        response.headers["Retry-After"] = "1"
    return response


def invocations(plane: DataPlane, call: Call, environ: Mapping[str, Any]) -> Answer:
    """Score a DataFrame with the default model.

    :raises UnsupportedMediaType: (415) unless ``application/json`` or ``text/csv``, in
        UTF-8.
    :raises InvalidInput: (422) for a body MLflow would refuse, a missing or unknown column
        name, or a value that is not a finite number.
    """
    mimetype = media_type(environ)
    if mimetype == "text/csv":
        instances: Instances = decode_csv(
            read_utf8_body(environ, plane.settings, mimetype),
            plane.settings.max_instances_per_request,
        )
    elif is_json(mimetype):
        body = read_json_body(environ, plane.settings)
        instances = decode(parse_body(MlflowRequest, body))
    else:
        content_type = environ.get("CONTENT_TYPE") or None
        raise UnsupportedMediaType(content_type, "application/json or text/csv")
    answer = plane.infer(call, None, None, instances, rules=MLFLOW)
    output = answer.outputs[answer.handle.pyfunc_output]
    return json_answer({"predictions": jsonable(output)})


#: Errors as MLflow's ``{"error_code", "message"}`` plus our ``code``.
PROTOCOL = ProtocolSpec(
    bp,
    OPERATIONS,
    ErrorStyle(_error_body),
    ("/invocations", "/ping", "/health", "/version"),
    routes=(Route("/invocations", invocations),),
    examples=lambda example: {"/invocations": _invocations_example(example)},
)


def _invocations_example(example: Example) -> dict[str, Any]:
    """``/invocations``' body of ``example``: MLflow's ``dataframe_split`` when the model
    names its columns, else ``inputs``."""
    if example.names:
        return {"dataframe_split": {"columns": list(example.names), "data": [example.values]}}
    return {"inputs": [example.values]}
