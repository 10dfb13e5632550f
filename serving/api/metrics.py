"""``GET /metrics``: Prometheus text format, summed over all Gunicorn workers."""

from __future__ import annotations

from flask import Blueprint, Response

from serving.api.common import context
from serving.metrics import CONTENT_TYPE_LATEST

__all__ = ["bp"]

bp = Blueprint("metrics", __name__)


@bp.get("/metrics")
def metrics() -> Response:
    return Response(context().metrics.render(), mimetype=None, content_type=CONTENT_TYPE_LATEST)
