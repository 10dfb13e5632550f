"""Helpers every blueprint uses: the app's serving context, body reading, JSON answers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from flask import Response, current_app, request
from werkzeug.exceptions import ClientDisconnected, RequestEntityTooLarge

from serving.cache import ModelCache
from serving.errors import PayloadTooLarge, UnreadableBody, UnsupportedMediaType
from serving.metrics import ServingMetrics
from serving.settings import Settings

__all__ = [
    "ErrorBody",
    "ServingContext",
    "context",
    "error_body",
    "json_response",
    "read_body",
    "read_json_body",
    "register_error_body",
]

_BODY_SETTING = "SERVING_MAX_BODY_BYTES"


@dataclass(frozen=True)
class ServingContext:
    """What ``create_app`` wires into ``app.extensions["serving"]``."""

    settings: Settings
    metrics: ServingMetrics
    #: This process's models (built lazily: under Gunicorn, after the fork).
    get_models: Callable[[], ModelCache]


#: ``(status, code, message, details) -> body``: how one protocol spells an error.
ErrorBody = Callable[[int, str, str, list[dict[str, Any]]], dict[str, Any]]
_ERROR_BODIES: dict[str, ErrorBody] = {}
_PREFIXES: dict[str, ErrorBody] = {}


def register_error_body(blueprint: str, build: ErrorBody, *path_prefixes: str) -> None:
    """Answer errors of ``blueprint``'s routes with ``build``'s body instead of the service's
    ``{"error": {"code", "message", "details"}}`` (KServe V2 and TF Serving clients expect
    ``{"error": "message"}``, MLflow's ``{"error_code", "message"}``). The status is the
    same whatever the shape. ``path_prefixes`` extend it to requests no route matched
    (404, 405) under those paths, so ``/v1/models/a:b`` is a TF Serving error too."""
    _ERROR_BODIES[blueprint] = build
    for prefix in path_prefixes:
        _PREFIXES[prefix] = build


def error_body(status: int, code: str, message: str, details: list[dict[str, Any]]) -> Any:
    """The error body for the current request, in its route's protocol."""
    build = _ERROR_BODIES.get(request.blueprint or "") if request else None
    if build is None and request and request.blueprint is None:
        build = next((b for p, b in _PREFIXES.items() if request.path.startswith(p)), None)
    if build is not None:
        return build(status, code, message, details)
    return {"error": {"code": code, "message": message, "details": details}}


def context() -> ServingContext:
    ctx: ServingContext = current_app.extensions["serving"]
    return ctx


def read_json_body(max_body_bytes: int) -> bytes:
    """The raw request body, checked to be ``application/json`` and at most ``max_body_bytes``.

    :raises UnsupportedMediaType: (415) for another or no Content-Type.
    :raises PayloadTooLarge: (413) over the limit, declared or while reading.
    :raises UnreadableBody: (400) as ``read_body``.
    """
    mimetype = request.mimetype
    if mimetype != "application/json" and not mimetype.endswith("+json"):
        raise UnsupportedMediaType(request.content_type)
    return read_body(max_body_bytes)


def read_body(max_body_bytes: int) -> bytes:
    """The raw request body, whatever its Content-Type, at most ``max_body_bytes``.

    Chunked bodies (no Content-Length) are cut off at the same limit while they are read.
    For protocols whose clients send no or a non-JSON Content-Type (KServe V2's binary
    tensors); the JSON routes call ``read_json_body``.

    :raises PayloadTooLarge: (413) over the limit, declared or while reading.
    :raises UnreadableBody: (400) when the server cannot read it (bad chunk encoding, the
        client went away mid-body).
    """
    length = request.content_length
    if length is not None and length > max_body_bytes:
        raise PayloadTooLarge("request body", length, max_body_bytes, _BODY_SETTING, "bytes")
    if length is None and request.environ.get("wsgi.input_terminated"):
        # Chunked: werkzeug would stop quietly at the limit and hand on a truncated body
        # (a 400 for the wrong reason). Read one byte past the limit to tell.
        try:
            data: bytes = request.environ["wsgi.input"].read(max_body_bytes + 1)
        except Exception as exc:  # the server's own errors: bad chunk size, client gone
            raise UnreadableBody(f"request body could not be read: {type(exc).__name__}") from exc
        if len(data) > max_body_bytes:
            raise PayloadTooLarge(
                "chunked request body", None, max_body_bytes, _BODY_SETTING, "bytes"
            )
        return data
    try:
        data = request.get_data(cache=False)
    except ClientDisconnected as exc:
        raise UnreadableBody("request body could not be read: the client went away") from exc
    except RequestEntityTooLarge:
        raise PayloadTooLarge(
            "request body", None, max_body_bytes, _BODY_SETTING, "bytes"
        ) from None
    if length is not None and len(data) < length:
        # Under Gunicorn wsgi.input ends quietly when the client half-closes: a body cut
        # short would otherwise be parsed as if complete (a CSV losing its last rows).
        raise UnreadableBody(
            f"request body could not be read: the client sent {len(data)} of the "
            f"{length} bytes its Content-Length declared"
        )
    return data


def json_response(body: dict[str, Any], status: int = 200) -> Response:
    """Serialize ``body`` with orjson (numpy arrays natively; NaN and Infinity become null)."""
    data = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    return Response(data, status=status, mimetype="application/json")
