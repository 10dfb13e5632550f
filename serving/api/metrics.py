"""``GET /metrics``: Prometheus text format, summed over all Gunicorn workers."""

from __future__ import annotations

from flask import Blueprint, Response

from serving.api.common import context
from serving.metrics import CONTENT_TYPE_LATEST
from serving.openapi import Operation
from serving.schemas import ErrorResponse

__all__ = ["OPERATIONS", "bp"]

bp = Blueprint("metrics", __name__)

OPERATIONS = [
    Operation(
        "get",
        "/metrics",
        "Prometheus text format, summed over all Gunicorn workers",
        {200: None, 401: ErrorResponse},
        tag="probes",
        text_responses={200: "text/plain"},
    )
]


@bp.get("/metrics")
def metrics() -> Response:
    return Response(context().metrics.render(), mimetype=None, content_type=CONTENT_TYPE_LATEST)
