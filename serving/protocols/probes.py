"""The service's own routes: ``GET /livez`` (liveness), ``GET /healthz`` (readiness),
``GET /metrics`` (Prometheus) and ``GET /openapi.json``.

Liveness does not look at the model: a worker still loading is alive and must not be
restarted for it. Readiness is 200 only when every live worker of the server has every
model loaded and warmed up and its batcher running (``serving.server.board.readiness``; the body
says ``"workers": {"ready": N, "total": M}``); otherwise 503 with the same body.
With API keys configured, ``/healthz`` without one says only the status and the workers'
counts (no model names, no load errors). ``/metrics`` is the Prometheus text format,
summed over all Gunicorn workers. The OpenAPI document is built once per process from
every protocol's ``OPERATIONS`` (``serving.openapi``).
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, current_app, request

from serving.auth import has_api_key
from serving.observe.metrics import CONTENT_TYPE_LATEST
from serving.openapi import Operation
from serving.protocols.base import ProtocolSpec, dataplane, json_response
from serving.protocols.schemas import (
    ErrorResponse,
    HealthResponse,
    LivenessResponse,
    OpenAPIDocument,
)
from serving.server.board import readiness

__all__ = ["OPERATIONS", "PROTOCOL", "bp"]

bp = Blueprint("probes", __name__)

#: What ``/healthz`` tells a request without a key of the workers: counts and the rollout's
#: state, never a model's name, path or load error (``errors``, ``stages``).
_WITHOUT_KEY = frozenset({"ready", "total", "loading", "failed", "rollout"})

OPERATIONS = [
    Operation(
        "get",
        "/livez",
        "Liveness: 200 while the process can serve or may still",
        {200: LivenessResponse, 503: LivenessResponse},
        tag="probes",
        security=False,
        traced=False,
    ),
    Operation(
        "get",
        "/healthz",
        "Readiness: 200 only when every model of every worker is loaded and batching",
        {200: HealthResponse, 503: HealthResponse},
        tag="probes",
        security=False,
        traced=False,
    ),
    Operation(
        "get",
        "/metrics",
        "Prometheus text format, summed over all Gunicorn workers",
        {200: None, 401: ErrorResponse},
        tag="probes",
        text_responses={200: "text/plain"},
        traced=False,
    ),
    Operation(
        "get",
        "/openapi.json",
        "This document",
        {200: OpenAPIDocument},
        tag="probes",
        security=False,
    ),
]

PROTOCOL = ProtocolSpec(bp, OPERATIONS)


@bp.get("/livez")
def livez() -> Response:
    """200 while the process can serve or may still; 503 once a model's runtime has failed
    (load failed, batcher thread dead, predict call stuck), when only a restart helps."""
    if dataplane().models.state == "failed":
        return json_response({"status": "failed"}, 503)
    return json_response({"status": "alive"})


@bp.get("/healthz")
def healthz() -> Response:
    """Readiness of the server: 200 only when every worker has every model ready.

    When API keys are configured, a request without a valid one gets only the status and
    the workers' counts: model names, providers and failed workers' load errors (a path,
    a corrupt file's bytes) are for callers with a key, as the metadata routes are.
    """
    models = dataplane().models
    state = models.state
    ready, workers = readiness(state)
    if state == "ready" and not ready:
        state = "loading"  # this worker is ready, another is not yet
    keys = current_app.extensions.get("serving_api_keys", ())
    if keys and not has_api_key(request.headers, keys):
        summary: dict[str, Any] = {"status": state}
        if workers is not None:
            summary["workers"] = {k: v for k, v in workers.items() if k in _WITHOUT_KEY}
        return json_response(summary, 200 if ready else 503)
    default = models.default
    body = {
        "status": state,
        "model_name": models.model_name,
        "model_version": models.model_version,
        "queue_depth": default.queue_depth,
        "max_queue_depth": default.settings.max_queue_depth,
        "execution_provider": default.handle.execution_provider if default.handle else None,
        "models": [
            {
                "name": runtime.model_name,
                "version": runtime.model_version,
                "status": runtime.state,
                "queue_depth": runtime.queue_depth,
                "max_queue_depth": runtime.settings.max_queue_depth,
                "execution_provider": runtime.handle.execution_provider if runtime.handle else None,
                "engine": runtime.handle.engine if runtime.handle else None,
            }
            for runtime in models.runtimes
        ],
    }
    if workers is not None:
        body["workers"] = workers
    return json_response(body, 200 if ready else 503)


@bp.get("/metrics")
def metrics() -> Response:
    body = dataplane().metrics.render()
    return Response(body, mimetype=None, content_type=CONTENT_TYPE_LATEST)


@bp.get("/openapi.json")
def openapi() -> Response:
    body: bytes = current_app.extensions["serving_openapi"]()
    return Response(body, mimetype="application/json")
