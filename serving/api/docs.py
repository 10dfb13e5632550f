"""``GET /openapi.json``: the OpenAPI 3.1 document, built once per process from the
blueprints' ``OPERATIONS`` (``serving.openapi``)."""

from __future__ import annotations

from flask import Blueprint, Response, current_app

from serving.openapi import Operation
from serving.schemas import OpenAPIDocument

__all__ = ["OPERATIONS", "bp"]

bp = Blueprint("docs", __name__)

OPERATIONS = [
    Operation(
        "get",
        "/openapi.json",
        "This document",
        {200: OpenAPIDocument},
        tag="probes",
        security=False,
    )
]


@bp.get("/openapi.json")
def openapi() -> Response:
    body: bytes = current_app.extensions["serving_openapi"]()
    return Response(body, mimetype="application/json")
