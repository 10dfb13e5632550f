"""``GET /livez`` (liveness: the process answers) and ``GET /healthz`` (readiness).

Liveness does not look at the model: a worker still loading is alive and must not be
restarted for it. Readiness is 200 only when every live worker of the server has every
model loaded and warmed up and its batcher running (``serving.workers.readiness``; the body
says ``"workers": {"ready": N, "total": M}``); otherwise 503 with the same body.
"""

from __future__ import annotations

from flask import Blueprint, Response

from serving.api.common import context, json_response
from serving.openapi import Operation
from serving.schemas import HealthResponse, LivenessResponse
from serving.workers import readiness

__all__ = ["OPERATIONS", "bp"]

bp = Blueprint("health", __name__)

OPERATIONS = [
    Operation(
        "get",
        "/livez",
        "Liveness: 200 while the process can serve or may still",
        {200: LivenessResponse, 503: LivenessResponse},
        tag="probes",
        security=False,
    ),
    Operation(
        "get",
        "/healthz",
        "Readiness: 200 only when every model of every worker is loaded and batching",
        {200: HealthResponse, 503: HealthResponse},
        tag="probes",
        security=False,
    ),
]


@bp.get("/livez")
def livez() -> Response:
    """200 while the process can serve or may still; 503 once a model's runtime has failed
    (load failed, batcher thread dead, predict call stuck), when only a restart helps."""
    if context().get_models().state == "failed":
        return json_response({"status": "failed"}, 503)
    return json_response({"status": "alive"})


@bp.get("/healthz")
def healthz() -> Response:
    """Readiness of the server: 200 only when every worker has every model ready."""
    models = context().get_models()
    state = models.state
    ready, workers = readiness(state)
    if state == "ready" and not ready:
        state = "loading"  # this worker is ready, another is not yet
    default = models.default
    body = {
        "status": state,
        "model_name": models.model_name,
        "model_version": models.model_version,
        "queue_depth": models.queue_depth,
        "max_queue_depth": models.max_queue_depth,
        "execution_provider": default.handle.execution_provider if default.handle else None,
        "models": [
            {
                "name": runtime.model_name,
                "version": runtime.model_version,
                "status": runtime.state,
                "queue_depth": runtime.queue_depth,
                "execution_provider": runtime.handle.execution_provider if runtime.handle else None,
            }
            for runtime in models.runtimes
        ],
    }
    if workers is not None:
        body["workers"] = workers
    return json_response(body, 200 if ready else 503)
