"""``create_app()``: the one place the service is wired (settings, blueprints, errors, metrics)."""

from __future__ import annotations

import functools
import logging
import re
import time
import uuid

import orjson
from flask import Flask, Response, g, request
from werkzeug.exceptions import HTTPException

from serving import __version__
from serving.api import docs, health, mlflow, predict, tfserving, v2
from serving.api import metrics as metrics_api
from serving.api.common import ServingContext, error_body, json_response
from serving.auth import OPEN_ROUTES, check_api_key, load_api_keys
from serving.cache import ModelCache, current_cache
from serving.errors import ServingError
from serving.loaders import ModelHandle
from serving.metrics import ServingMetrics, default_metrics
from serving.openapi import build_document
from serving.runtime import ModelRuntime
from serving.settings import Settings, load_settings

__all__ = ["create_app"]

log = logging.getLogger("serving")
#: One JSON line per request (serving.hooks gives it a JSON formatter under Gunicorn).
access_log = logging.getLogger("serving.access")

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def create_app(
    settings: Settings | None = None,
    model_handle: ModelHandle | None = None,
    *,
    metrics: ServingMetrics | None = None,
) -> Flask:
    """Build the WSGI app. Does no I/O: importing ``wsgi.py`` before fork stays cheap.

    :param settings: defaults to ``load_settings()`` (the ``SERVING_*`` environment).
    :param model_handle: serve this in-memory model, loaded and batched at once (tests,
        embedding). Without it the app serves this process's ``ModelCache`` (the models of
        ``SERVING_MODELS``, or the one model), which the Gunicorn ``post_fork`` hook
        builds; under another WSGI server the first request builds it and starts loading
        in the background.
    :param metrics: defaults to the process's metrics in prometheus-client's default registry.
    :raises SettingsError: when ``settings`` is None and the environment has a bad value.
    """
    settings = settings or load_settings()
    metrics = metrics or default_metrics()
    if model_handle is not None:
        runtime = ModelRuntime(settings, metrics)
        runtime.load(model_handle)
        cache = ModelCache(settings, metrics, runtimes=[runtime])

        def get_models() -> ModelCache:
            return cache
    else:

        def get_models() -> ModelCache:
            return current_cache(lambda: ModelCache(settings, metrics))

    app = Flask("serving")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.extensions["serving"] = ServingContext(settings, metrics, get_models)

    modules = (predict, v2, tfserving, mlflow, health, metrics_api, docs)
    for module in modules:
        app.register_blueprint(module.bp)

    @functools.cache
    def openapi_document() -> bytes:
        operations = [op for module in modules for op in module.OPERATIONS]
        document = build_document(
            operations, title="serving", version=__version__, api_keys=bool(api_keys)
        )
        return orjson.dumps(document)

    app.extensions["serving_openapi"] = openapi_document

    app.register_error_handler(ServingError, _serving_error)
    app.register_error_handler(HTTPException, _http_error)
    app.register_error_handler(Exception, _unexpected_error)

    api_keys = load_api_keys(settings)
    open_routes = OPEN_ROUTES - ({"/metrics"} if settings.metrics_require_auth else set())

    @app.before_request
    def _start() -> None:
        g.started = time.perf_counter()
        g.log_fields = {}
        incoming = request.headers.get("X-Request-ID", "")
        g.request_id = incoming if _REQUEST_ID.fullmatch(incoming) else uuid.uuid4().hex
        if api_keys and request.path not in open_routes:
            check_api_key(request.headers, api_keys)

    @app.after_request
    def _finish(response: Response) -> Response:
        response.headers["X-Request-ID"] = g.get("request_id", "")
        route = _template(request.url_rule.rule) if request.url_rule is not None else "<unmatched>"
        duration_s = time.perf_counter() - g.get("started", time.perf_counter())
        metrics.observe_request(request.method, route, response.status_code, duration_s)
        if settings.access_log:
            models = get_models()
            access_log.info(
                "request",
                extra={
                    "request_id": g.get("request_id"),
                    "method": request.method[:16],
                    "route": route,
                    "status": response.status_code,
                    "latency_ms": round(duration_s * 1000, 3),
                    "model": models.model_name,
                    "model_version": models.model_version,
                    **g.get("log_fields", {}),
                },
            )
        return response

    return app


@functools.cache
def _template(rule: str) -> str:
    """A Flask rule as the OpenAPI path template, for metric labels and logs:
    ``/v1/models/<tf_model:model_name>:predict`` -> ``/v1/models/{model_name}:predict``."""
    return re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule)


def _serving_error(exc: ServingError) -> Response:
    if exc.status >= 500 and exc.status != 503:  # 503s are expected; metrics count them
        log.error("request %s failed: %s %s", g.get("request_id"), exc.code, exc.message)
    response = json_response(error_body(exc.status, exc.code, exc.message, exc.details), exc.status)
    if exc.status == 503:
        response.headers["Retry-After"] = "1"
    elif exc.status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="serving"'
    return response


def _http_error(exc: HTTPException) -> Response:
    status = exc.code or 500
    code = re.sub(r"\W+", "_", (exc.name or "http_error").lower()).strip("_")
    target = f"{request.method[:16]} {request.path[:200]}"
    allow = getattr(exc, "valid_methods", None)
    if status == 404:
        message = f"no route for {target}"
    elif status == 405 and allow:
        message = f"{target}: method not allowed; allowed: {', '.join(allow)}"
    else:
        message = exc.description or exc.name
    response = json_response(error_body(status, code, message, []), status)
    if allow:
        response.headers["Allow"] = ", ".join(allow)
    return response


def _unexpected_error(exc: Exception) -> Response:
    log.exception("request %s failed with an unexpected error", g.get("request_id"))
    return json_response(error_body(500, "internal_error", "internal server error", []), 500)
