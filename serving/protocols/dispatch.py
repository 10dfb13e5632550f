"""The one answerer of every prediction route, without Flask's per-request machinery.

Flask's own work per request (a request context, URL matching, dispatching the hooks, a
``Response`` and its headers) costs about as much as a prediction's own Python besides
the model. ``Dispatcher`` is WSGI middleware that ``create_app`` puts in front of the
Flask app: it answers the ``Route``s every ``ProtocolSpec`` declares (``/predict``, KServe
V2 ``infer``, TF Serving ``:predict``, ``/invocations``) and hands every other request to
Flask, which answers the cold routes (probes, metadata, ``/docs``) and every path no
prediction route matches.

Matching is werkzeug's own ``Map`` (converters, percent-decoding, 405 with ``Allow``),
with Flask's Host check: a Host that werkzeug cannot bind (a label IDNA refuses) goes to
Flask, which answers 400. Each request has one lifecycle, traced or not:
``RequestHooks.start`` -> trace -> API key -> handler -> error answer ->
``RequestHooks.finish``; each error is answered by ``error_answer`` in its protocol's style.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from werkzeug.datastructures import EnvironHeaders
from werkzeug.exceptions import HTTPException, MethodNotAllowed
from werkzeug.http import HTTP_STATUS_CODES
from werkzeug.routing import Map, MapAdapter, Rule

from serving.auth import check_api_key
from serving.dataplane import DataPlane
from serving.errors import ServingError
from serving.observe import tracing
from serving.protocols.base import (
    ErrorStyle,
    ErrorStyles,
    Handler,
    ProtocolSpec,
    error_answer,
    http_error_answer,
    unexpected_answer,
)
from serving.protocols.hooks import RequestHooks

__all__ = ["Dispatcher", "prediction_map"]

#: A WSGI application: ``(environ, start_response) -> body chunks``.
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

#: Status lines as werkzeug writes them (``422 UNPROCESSABLE ENTITY``).
_STATUS = {code: f"{code} {name.upper()}" for code, name in HTTP_STATUS_CODES.items()}
_UNMATCHED = "<unmatched>"


@dataclass(frozen=True, slots=True)
class _Target:
    """What answers one route: its handler, protocol (blueprint name), OpenAPI template,
    the API keys it needs (none when open) and its error style."""

    handler: Handler
    protocol: str
    route: str
    keys: tuple[bytes, ...]
    style: ErrorStyle
    predicts: bool = True


def prediction_map(protocols: Sequence[ProtocolSpec]) -> Map:
    """Every protocol's prediction routes as one werkzeug ``Map`` (POST only, slashes not
    merged; each rule's endpoint its own rule string)."""
    converters = {name: c for protocol in protocols for name, c in protocol.converters.items()}
    rules = [
        Rule(route.rule, endpoint=route.rule, methods=["POST"], defaults=route.defaults)
        for protocol in protocols
        for route in protocol.routes
    ]
    return Map(rules, converters=converters, merge_slashes=False)


class Dispatcher:
    """The app's WSGI callable: the prediction routes here, the rest by ``flask_app``.

    :param flask_app: the Flask app's own ``wsgi_app``.
    :param api_keys: as ``serving.auth.load_api_keys``; checked on each route unless its
        template is in ``open_routes``.

    Usage::

        dispatcher = Dispatcher(app.wsgi_app, plane, hooks, PROTOCOLS, api_keys=(),
                                open_routes=set())
        app.wsgi_app = dispatcher
    """

    __slots__ = ("_binds", "_flask", "_hooks", "_keys", "_match", "_plane", "_prefixes",
                 "_styles", "_targets")  # fmt: skip

    def __init__(
        self,
        flask_app: WSGIApp,
        plane: DataPlane,
        hooks: RequestHooks,
        protocols: Sequence[ProtocolSpec],
        *,
        api_keys: tuple[bytes, ...],
        open_routes: set[str],
    ) -> None:
        self._flask = flask_app
        self._plane = plane
        self._hooks = hooks
        self._keys = api_keys
        self._styles = ErrorStyles.of(protocols)
        self._targets = {
            route.rule: _Target(
                route.handler,
                protocol.bp.name,
                route.template,
                () if route.template in open_routes else api_keys,
                protocol.style,
            )
            for protocol in protocols
            for route in protocol.routes
        }
        url_map = prediction_map(protocols)
        # Matching does not depend on the host (no host matching): one adapter serves all,
        # and a path's match (~10 us with a converter's regex) is asked once; refusals
        # (404, 405: exceptions) are not cached.
        adapter: MapAdapter = url_map.bind("localhost")
        self._match = functools.lru_cache(maxsize=1024)(adapter.match)
        # Each rule's static start (/predict, /v2/models/): any other path is Flask's.
        self._prefixes = tuple({rule.split("<", 1)[0] for rule in self._targets})
        self._binds = functools.lru_cache(maxsize=256)(functools.partial(_binds, url_map))

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path = environ.get("PATH_INFO", "")
        if path.startswith("//"):  # werkzeug's Request.path: "/" + PATH_INFO.lstrip("/")
            path = "/" + path.lstrip("/")
        if not path.startswith(self._prefixes) or not self._binds(
            environ.get("HTTP_HOST"), environ.get("wsgi.url_scheme", "http"),
            environ.get("SERVER_NAME"), environ.get("SERVER_PORT"),
        ):  # fmt: skip
            return self._flask(environ, start_response)
        method = environ.get("REQUEST_METHOD", "GET")
        if not path.isascii():  # as werkzeug reads PATH_INFO (WSGI's latin-1 of UTF-8)
            path = path.encode("latin-1", "replace").decode(errors="replace")
        try:
            endpoint, args = self._match(path, method)  # args shared: read, never changed
        except MethodNotAllowed as exc:
            target = self._refusal(exc, method, path)
            args = {}
        except HTTPException:  # no prediction route: Flask's 404, or one of its routes
            return self._flask(environ, start_response)
        else:
            target = self._targets[endpoint]
        return self._answer(environ, start_response, method, target, args)

    def _answer(
        self,
        environ: dict[str, Any],
        start_response: Callable[..., Any],
        method: str,
        target: _Target,
        args: Mapping[str, Any],
    ) -> list[bytes]:
        """The one lifecycle: start, trace, key, handler, error, finish."""
        hooks = self._hooks
        call = hooks.start(environ, target.protocol, target.route, predicts=target.predicts)
        trace = None
        try:
            if tracing.active():  # the span is current while the handler runs
                trace = tracing.start_request(environ, method[:16], target.route)
            if target.keys:
                check_api_key(EnvironHeaders(environ), target.keys)
            answer = target.handler(self._plane, call, environ, **args)
        except ServingError as exc:
            answer = error_answer(exc, target.style, call.request_id)
        except Exception:
            answer = unexpected_answer(target.style, call.request_id)
        hooks.finish(call, method, answer.status, trace)
        body = answer.body
        start_response(
            _STATUS[answer.status],
            [
                ("Content-Type", answer.content_type),
                ("Content-Length", str(len(body))),
                *answer.headers,
                ("X-Request-ID", call.request_id),
            ],
        )
        return [] if method == "HEAD" else [body]  # HEAD: the headers of a GET, no body

    def _refusal(self, exc: MethodNotAllowed, method: str, path: str) -> _Target:
        """A target that answers 405 (with ``Allow``) in the style of ``path``'s protocol,
        after the API key check every unmatched request gets."""
        style = self._styles.for_path(path)
        answer = http_error_answer(exc, style, method, path)
        return _Target(lambda *_: answer, "", _UNMATCHED, self._keys, style, predicts=False)


def _binds(
    url_map: Map, host: str | None, scheme: str, server_name: str | None, port: str | None
) -> bool:
    """Whether werkzeug's URL map binds to a request with this ``Host`` header (or, without
    one, this server address), as Flask does before routing each request: it refuses a
    host that IDNA cannot encode (a label empty or over 63 characters) with 400 Bad Host.
    Asked of werkzeug itself, once per distinct value (``Dispatcher._binds`` caches it)."""
    environ = {"wsgi.url_scheme": scheme, "REQUEST_METHOD": "POST", "PATH_INFO": "/"}
    for key, value in (("HTTP_HOST", host), ("SERVER_NAME", server_name), ("SERVER_PORT", port)):
        if value is not None:
            environ[key] = value
    try:
        url_map.bind_to_environ(environ, subdomain="")
    except HTTPException:
        return False
    return True
