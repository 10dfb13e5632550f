"""``create_app()``: the one place the service is wired: settings, the data plane over the
models served, the dispatcher of every protocol's prediction routes and each protocol's
blueprint of cold routes, error styles, API keys, error handlers, the access log and
request metrics."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import orjson
from flask import Flask, Response, g, request
from werkzeug.exceptions import HTTPException
from werkzeug.routing import Map

from serving import __version__
from serving.auth import check_api_key, load_api_keys
from serving.cache import ModelCache, current_cache
from serving.context import Call
from serving.dataplane import DataPlane
from serving.errors import ServingError
from serving.model.loaders import ModelHandle
from serving.model.schema import instance_json_schema
from serving.observe import tracing
from serving.observe.metrics import ServingMetrics, default_metrics
from serving.openapi import Operation, build_document
from serving.protocols import docs, mlflow, predict, probes, tfserving, v2
from serving.protocols.base import (
    ErrorStyles,
    Example,
    ProtocolSpec,
    error_answer,
    http_error_answer,
    response_of,
    template,
    unexpected_answer,
)
from serving.protocols.dispatch import Dispatcher
from serving.protocols.hooks import RequestHooks
from serving.runtime import ModelRuntime
from serving.settings import Settings, load_settings

__all__ = ["create_app"]


#: Every protocol served, in registration order.
PROTOCOLS: tuple[ProtocolSpec, ...] = (
    predict.PROTOCOL,
    v2.PROTOCOL,
    tfserving.PROTOCOL,
    mlflow.PROTOCOL,
    probes.PROTOCOL,
    docs.PROTOCOL,
)


class _Map(Map):
    """werkzeug's URL map without ``merge_slashes``: it answered ``/predict//x`` with a
    308 HTML redirect whose ``Location`` was built from the client's ``Host`` header; a
    path with an empty segment is now a 404 like any other unknown path."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("merge_slashes", False)
        super().__init__(*args, **kwargs)


class _Flask(Flask):
    """Flask that asks once per function, not once per request, whether a hook or view
    is a coroutine function: ``ensure_sync`` (documented for overriding) runs for every
    before- and after-request hook and the view, each time calling
    ``inspect.iscoroutinefunction`` (about 50 opcodes). Its URL map merges no slashes
    (``_Map``)."""

    url_map_class = _Map

    def __init__(self, import_name: str) -> None:
        super().__init__(import_name)
        self._sync: dict[Callable[..., Any], Callable[..., Any]] = {}

    def ensure_sync(self, func: Callable[..., Any]) -> Callable[..., Any]:
        sync = self._sync.get(func)
        if sync is None:
            sync = self._sync[func] = super().ensure_sync(func)
        return sync


def _running_settings() -> Settings | None:
    """Under a Gunicorn started with gunicorn.conf.py (its hooks module loaded in the
    master, inherited at fork), the settings its master checked; else None."""
    hooks = sys.modules.get("serving.server.hooks")
    return hooks.running_settings() if hooks is not None else None


def create_app(
    settings: Settings | None = None,
    model_handle: ModelHandle | None = None,
    *,
    models: ModelCache | Sequence[ModelHandle] | None = None,
    metrics: ServingMetrics | None = None,
) -> Flask:
    """Build the WSGI app. Does no I/O unless given handles: importing ``wsgi.py`` before
    fork stays cheap.

    :param settings: defaults to ``load_settings()`` (the ``SERVING_*`` environment).
    :param models: the models to serve: a ``ModelCache`` (loaded or not, served as is), or
        in-memory ``ModelHandle``s, each loaded and batched at once (tests, embedding),
        the first the default. Without it the app serves this process's ``ModelCache``
        (the models of ``SERVING_MODELS``, or the one model), which the Gunicorn
        ``post_fork`` hook builds; under another WSGI server the first request builds it
        and starts loading in the background.
    :param model_handle: one handle, as ``models=[model_handle]``.
    :param metrics: defaults to the process's metrics in prometheus-client's default registry.
    :raises SettingsError: when ``settings`` is None and the environment has a bad value.

    Usage::

        app = create_app(settings, models=[ModelHandle.from_callable(f, n_features=3)])
        app.extensions["serving"].models.stop()     # the DataPlane; stops the batchers
    """
    settings = settings or _running_settings() or load_settings()
    metrics = metrics or default_metrics()
    if model_handle is not None:
        models = [model_handle]
    plane = DataPlane(settings, metrics, _models_getter(settings, metrics, models))

    app = _Flask("serving")
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.extensions["serving"] = plane
    for protocol in PROTOCOLS:
        app.url_map.converters.update(protocol.converters)  # before the rules that name them
        app.register_blueprint(protocol.bp)

    api_keys = load_api_keys(settings)
    app.extensions["serving_api_keys"] = api_keys  # /healthz's detail needs one
    operations = [op for protocol in PROTOCOLS for op in protocol.operations]
    if not settings.metrics_require_auth:  # /metrics is open: documented so, too
        operations = [replace(op, security=False) if op.path == "/metrics" else op
                      for op in operations]  # fmt: skip
    # Open without a key: the operations documented without security (probes, health,
    # and /metrics unless SERVING_METRICS_REQUIRE_AUTH).
    open_routes = {op.path for op in operations if not op.security}
    untraced = {op.path for op in operations if not op.traced}

    app.extensions["serving_openapi"] = _openapi(plane, operations, bool(api_keys))

    styles = ErrorStyles.of(PROTOCOLS)
    app.register_error_handler(ServingError, functools.partial(_serving_error, styles))
    app.register_error_handler(HTTPException, functools.partial(_http_error, styles))
    app.register_error_handler(Exception, functools.partial(_unexpected_error, styles))

    hooks = RequestHooks(plane, metrics)
    _install_request_hooks(
        app, hooks, api_keys=api_keys, open_routes=open_routes, untraced=untraced
    )
    # Every prediction route, answered without Flask's per-request machinery; Flask
    # answers the rest.
    app.wsgi_app = Dispatcher(  # type: ignore[method-assign]
        app.wsgi_app, plane, hooks, PROTOCOLS, api_keys=api_keys, open_routes=open_routes
    )

    return app


def _install_request_hooks(
    app: Flask,
    hooks: RequestHooks,
    *,
    api_keys: tuple[bytes, ...],
    open_routes: set[str],
    untraced: set[str],
) -> None:
    """Per request Flask answers (the cold routes; the dispatcher answers the prediction
    routes with the same ``RequestHooks``): before it, the request's ``Call``
    (``RequestHooks.start``; ``g.call``, with the model its URL names for the access log),
    its trace and the API key check; after it, the
    X-Request-ID header, then the request metrics and the access log line
    (``RequestHooks.finish``)."""

    @app.before_request
    def _start() -> None:
        # The objects behind Flask's proxies, looked up once: each proxy access costs ~1 us.
        state, req = _current(g), _current(request)
        url_rule = req.url_rule
        rule = template(url_rule.rule) if url_rule is not None else "<unmatched>"
        state.call = call = hooks.start(req.environ, req.blueprint or "", rule, predicts=False)
        named = req.view_args or {}  # the model the URL names, else none (not the default)
        call.timing.model = named.get("model_name", "")
        call.timing.version = named.get("model_version")
        state.trace = tracing.start_request(req.environ, req.method[:16], rule) if (
            rule not in untraced and tracing.active()
        ) else None  # fmt: skip
        if api_keys and rule not in open_routes:  # by route template: /docs/{asset}
            check_api_key(req.headers, api_keys)

    @app.after_request
    def _finish(response: Response) -> Response:
        state, req = _current(g), _current(request)
        call: Call | None = getattr(state, "call", None)
        if call is None:  # before_request never ran (Flask answered on its own)
            return response
        response.headers.add("X-Request-ID", call.request_id)  # no view sets it: no set()
        # Every error is answered, by the handlers create_app registers, so this runs.
        hooks.finish(call, req.method, response.status_code, getattr(state, "trace", None))
        return response


def _models_getter(
    settings: Settings, metrics: ServingMetrics, models: ModelCache | Sequence[ModelHandle] | None
) -> Callable[[], ModelCache]:
    """How the data plane finds the models it serves: those given, else this process's."""
    if models is None:
        return lambda: current_cache(
            lambda: ModelCache.of(
                settings.model_settings(), metrics, refused=settings.refused_models()
            )
        )
    if not isinstance(models, ModelCache):
        if not models:
            raise ValueError("models: give at least one ModelHandle, or a ModelCache")
        runtimes = []
        for handle in models:
            model = settings.model_defaults(
                name=handle.name, version=handle.version, path=handle.source,
                format=handle.format, labels=settings.version_labels(handle.name),
            )  # fmt: skip
            runtime = ModelRuntime(model, metrics)
            runtime.load(handle)
            runtimes.append(runtime)
        models = ModelCache(runtimes)
    cache = models
    return lambda: cache


def _openapi(plane: DataPlane, operations: list[Operation], api_keys: bool) -> Callable[[], bytes]:
    """``/openapi.json``'s bytes: built once before the models are ready and once after,
    when it also holds each model's instance schema (``Instance.<model>.<version>``)."""
    documents: dict[bool, bytes] = {}

    def document() -> bytes:
        models = plane.models
        ready = models.state == "ready"
        if ready not in documents:
            schemas = _instance_schemas(models) if ready else {}
            example = _example(models) if ready else None
            bodies: dict[str, Any] = {}
            parameters: dict[str, str] = {}
            if example is not None:
                for protocol in PROTOCOLS:
                    bodies |= protocol.examples(example) if protocol.examples else {}
                handle = example.handle
                parameters = {"model_name": handle.name, "model_version": handle.version}
                labels = plane.models.version_labels(handle.name)
                if labels:
                    parameters["label"] = next(iter(labels))
            documents[ready] = orjson.dumps(build_document(
                operations, title="serving", version=__version__, api_keys=api_keys,
                instances=schemas, examples=bodies, parameters=parameters,
            ))  # fmt: skip
        return documents[ready]

    return document


def _instance_schemas(models: ModelCache) -> dict[str, dict[str, Any]]:
    """Each served model version's instance schema, for the OpenAPI document."""
    schemas = {}
    for runtime in models.runtimes:
        handle = runtime.handle
        if handle is not None and handle.features:
            named = handle.feature_names is not None
            schema = instance_json_schema(handle.features, named)
            schema["description"] = (
                f"One instance of model {handle.name!r} version {handle.version!r}"
                + (" (or a list of its values in this order)" if named else "")
            )
            schemas[f"Instance.{handle.name}.{handle.version}"] = schema
    return schemas


def _example(models: ModelCache) -> Example | None:
    """One instance the default model answers (zeros, a known category;
    ``ModelHandle.sample``), keyed by feature name when the model has names: what each
    protocol's example body in ``/docs`` is built from."""
    handle = models.default.handle
    if handle is None or not handle.features:
        return None
    row = handle.sample(1)
    names = row.dtype.names
    if names is not None:
        values = [row[name][0] for name in names]
    else:
        values = list(row[0])
        names = handle.feature_names
    values = [value.item() if isinstance(value, np.generic) else value for value in values]
    return Example(handle, tuple(names) if names else None, values)


def _current(proxy: Any) -> Any:
    """The object behind a Flask context proxy (``g``, ``request``)."""
    return proxy._get_current_object()


def _request_id() -> str | None:
    """The current request's id, for the log (None before the request hook ran)."""
    call: Call | None = g.get("call")
    return call.request_id if call is not None else None


def _serving_error(styles: ErrorStyles, exc: ServingError) -> Response:
    return response_of(error_answer(exc, styles.current(), _request_id()))


def _http_error(styles: ErrorStyles, exc: HTTPException) -> Response:
    return response_of(http_error_answer(exc, styles.current(), request.method, request.path))


def _unexpected_error(styles: ErrorStyles, exc: Exception) -> Response:
    return response_of(unexpected_answer(styles.current(), _request_id()))
