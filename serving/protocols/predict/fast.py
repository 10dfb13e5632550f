"""``POST /predict`` answered without Flask's per-request machinery.

Flask's own work per request (a request context, URL matching, dispatching the hooks, a
``Response`` and its headers) costs about as much as all of ``/predict``'s own Python
besides the model. ``FastPredict`` is WSGI middleware that ``create_app`` puts in front of
the Flask app. It answers ``POST /predict`` and ``POST /predict/<model_name>`` itself,
calling what the Flask route and hooks call: ``RequestHooks``, ``check_api_key``,
``routes.respond`` and ``error_answer``. The answer is Flask's byte for byte: status,
headers and body (``tests/test_fast_path.py`` diffs the two over a corpus of requests).

Every other request goes to Flask. So does a ``/predict`` request while tracing is on
(its span reads werkzeug's headers), or one whose model name Flask might route otherwise
(outside printable ASCII, or holding a ``/`` or ``%``), or whose Host Flask refuses with
a 400 before routing (a label empty or over 63 characters: ``_binds``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from typing import Any

from werkzeug.datastructures import EnvironHeaders
from werkzeug.exceptions import HTTPException
from werkzeug.http import HTTP_STATUS_CODES
from werkzeug.routing import Map

from serving.auth import check_api_key
from serving.dataplane import DataPlane
from serving.errors import ServingError
from serving.observe import tracing
from serving.protocols.base import error_answer, json_bytes, service_error_body, unexpected_answer
from serving.protocols.hooks import RequestHooks
from serving.protocols.predict.routes import respond

__all__ = ["FastPredict"]

#: A WSGI application: ``(environ, start_response) -> body chunks``.
WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

#: A model name in the path that every router reads alike: printable ASCII but ``/`` and ``%``.
_NAME = re.compile(r"[ -$&-.0-~]+")
#: Status lines as werkzeug writes them (``422 UNPROCESSABLE ENTITY``).
_STATUS = {code: f"{code} {name.upper()}" for code, name in HTTP_STATUS_CODES.items()}
_ROUTE, _NAMED_ROUTE = "/predict", "/predict/{model_name}"


class FastPredict:
    """The app's WSGI callable: ``/predict`` here, the rest by ``flask_app``.

    :param flask_app: the Flask app's own ``wsgi_app``, which answers every other request.
    :param api_keys: as ``serving.auth.load_api_keys``; checked unless ``/predict`` is in
        ``open_routes`` (route templates served without a key).

    Usage::

        app.wsgi_app = FastPredict(app.wsgi_app, plane, hooks, api_keys, open_routes)
    """

    __slots__ = ("_hooks", "_keys", "_plane", "flask_app")

    def __init__(
        self,
        flask_app: WSGIApp,
        plane: DataPlane,
        hooks: RequestHooks,
        api_keys: tuple[bytes, ...],
        open_routes: set[str],
    ) -> None:
        self.flask_app = flask_app
        self._plane = plane
        self._hooks = hooks
        self._keys = {
            route: () if route in open_routes else api_keys for route in (_ROUTE, _NAMED_ROUTE)
        }

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        path = environ.get("PATH_INFO", "")
        if path == _ROUTE:
            model_name, route = None, _ROUTE
        elif path[:9] == "/predict/" and _NAME.fullmatch(path, 9):
            model_name, route = path[9:], _NAMED_ROUTE
        else:
            return self.flask_app(environ, start_response)
        if (
            environ.get("REQUEST_METHOD") != "POST"
            or tracing.active()
            or not _binds(
                environ.get("HTTP_HOST"), environ.get("wsgi.url_scheme", "http"),
                environ.get("SERVER_NAME"), environ.get("SERVER_PORT"),
            )
        ):  # fmt: skip
            return self.flask_app(environ, start_response)
        hooks = self._hooks
        call = hooks.start(environ, "predict", route, predicts=True)
        status, headers = 200, list[tuple[str, str]]()
        try:
            keys = self._keys[route]
            if keys:
                check_api_key(EnvironHeaders(environ), keys)
            data = json_bytes(respond(self._plane, call, model_name, environ))
        except ServingError as exc:
            status = exc.status
            data, headers = error_answer(exc, service_error_body, call.request_id)
        except Exception:
            status = 500
            data = unexpected_answer(service_error_body, call.request_id)
        hooks.finish(call, "POST", status, None)
        start_response(
            _STATUS[status],
            [
                ("Content-Type", "application/json"),
                ("Content-Length", str(len(data))),
                *headers,
                ("X-Request-ID", call.request_id),
            ],
        )
        return [data]


@functools.lru_cache(maxsize=256)
def _binds(host: str | None, scheme: str, server_name: str | None, port: str | None) -> bool:
    """Whether werkzeug's URL map binds to a request with this ``Host`` header (or, without
    one, this server address), as Flask does before routing each request; it refuses a
    host that IDNA cannot encode (a label empty or over 63 characters) with 400 Bad Host.
    Asked of werkzeug itself, once per distinct value."""
    environ = {"wsgi.url_scheme": scheme, "REQUEST_METHOD": "POST", "PATH_INFO": _ROUTE}
    for key, value in (("HTTP_HOST", host), ("SERVER_NAME", server_name), ("SERVER_PORT", port)):
        if value is not None:
            environ[key] = value
    try:
        Map().bind_to_environ(environ, subdomain="")
    except HTTPException:
        return False
    return True
