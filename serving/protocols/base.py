"""What every protocol's routes share: the app's data plane, body reading, JSON answers,
and the error-body plumbing.

A protocol package (``serving.protocols.predict``, ``v2``, ``tfserving``, ``mlflow``)
declares itself as one ``ProtocolSpec``: its blueprint, its OpenAPI operations (which
also say which routes are open without an API key: ``security=False``), how it spells an
error body, and the path prefixes whose unmatched requests (404, 405) are its errors too.
``serving.app.create_app`` collects them; nothing is registered at import.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
from flask import Blueprint, Response, current_app, g, request

from serving.dataplane import DataPlane
from serving.errors import (
    PayloadTooLarge,
    RequestTimeout,
    ServingError,
    UnreadableBody,
    UnsupportedMediaType,
    UnsupportedTransferCoding,
)
from serving.openapi import Operation
from serving.settings import Settings

__all__ = [
    "ErrorBodies",
    "ErrorBody",
    "ProtocolSpec",
    "dataplane",
    "error_answer",
    "json_bytes",
    "json_response",
    "jsonable",
    "model_before_body",
    "read_body",
    "read_json_body",
    "service_error_body",
    "unexpected_answer",
    "with_call",
]

log = logging.getLogger("serving")

_BODY_SETTING = "SERVING_MAX_BODY_BYTES"

#: ``(status, code, message, details) -> body``: how one protocol spells an error.
ErrorBody = Callable[[int, str, str, list[dict[str, Any]]], dict[str, Any]]


def service_error_body(
    status: int, code: str, message: str, details: list[dict[str, Any]]
) -> dict[str, Any]:
    """The service's own error shape: ``{"error": {"code", "message", "details"}}``."""
    return {"error": {"code": code, "message": message, "details": details}}


@dataclass(frozen=True)
class ProtocolSpec:
    """One protocol's routes as ``create_app`` wires them.

    :param error_body: its error shape (KServe V2 and TF Serving clients expect
        ``{"error": "message"}``, MLflow's ``{"error_code", "message"}``); ``None``: the
        service's. The status is the same whatever the shape.
    :param path_prefixes: requests under these paths that no route matched (404, 405)
        get ``error_body`` too, so ``/v1/models/a:b`` is a TF Serving error.
    """

    bp: Blueprint
    operations: Sequence[Operation]
    error_body: ErrorBody | None = None
    path_prefixes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ErrorBodies:
    """Each protocol's error shape, by blueprint name and by path prefix."""

    by_blueprint: Mapping[str, ErrorBody] = field(default_factory=dict)
    by_prefix: Mapping[str, ErrorBody] = field(default_factory=dict)

    @classmethod
    def of(cls, protocols: Sequence[ProtocolSpec]) -> ErrorBodies:
        with_body = [(p, p.error_body) for p in protocols if p.error_body is not None]
        return cls(
            {p.bp.name: body for p, body in with_body},
            {prefix: body for p, body in with_body for prefix in p.path_prefixes},
        )

    def build(self, status: int, code: str, message: str, details: list[dict[str, Any]]) -> Any:
        """The error body for the current request, in its route's protocol."""
        return self.current()(status, code, message, details)

    def current(self) -> ErrorBody:
        """How the current request's protocol spells an error (by its route's blueprint,
        else its path), the service's shape by default."""
        build = self.by_blueprint.get(request.blueprint or "") if request else None
        if build is None and request and request.blueprint is None:
            path = request.path
            build = next((b for p, b in self.by_prefix.items() if path.startswith(p)), None)
        return build or service_error_body


def error_answer(
    exc: ServingError, body_of: ErrorBody, request_id: str | None
) -> tuple[bytes, list[tuple[str, str]]]:
    """The JSON body (in ``body_of``'s shape) and the headers besides Content-Type and
    Content-Length of the answer to a request that failed with ``exc`` (its status); a
    server error other than 503 is logged first, with the model's own traceback when it
    raised. For the app's error handler and the ``/predict`` fast path alike."""
    status = exc.status
    if status >= 500 and status != 503:  # 503s are expected; metrics count them
        log.error(
            "request %s failed: %s %s", request_id, exc.code, exc.message,
            exc_info=exc.__cause__,
        )  # fmt: skip
    data = json_bytes(body_of(status, exc.code, exc.message, exc.details))
    if status == 503:
        return data, [("Retry-After", "1")]
    if status == 401:
        return data, [("WWW-Authenticate", 'Bearer realm="serving"')]
    return data, []


def unexpected_answer(body_of: ErrorBody, request_id: str | None) -> bytes:
    """The 500 body for an exception no handler expected, logged with its traceback:
    call it while handling the exception."""
    log.exception("request %s failed with an unexpected error", request_id)
    return json_bytes(body_of(500, "internal_error", "internal server error", []))


def with_call(view: Callable[..., Response]) -> Callable[..., Response]:
    """A prediction view that takes the request's ``Call`` (``serving.context``: request
    id, deadline, route, payload-log draw; made by the app's before-request hook) as its
    first argument, to hand to ``DataPlane.infer``: the one place a view's context comes
    from ``flask.g``."""

    @functools.wraps(view)
    def wrapped(*args: Any, **kwargs: Any) -> Response:
        return view(g.call, *args, **kwargs)

    wrapped.predicts = True  # type: ignore[attr-defined]  # counted as arriving (serving.app)
    return wrapped


def model_before_body(plane: DataPlane, model_name: str | None, version: str | None) -> None:
    """Called while refusing a request's body: raise ``ModelNotFound`` (404) or
    ``VersionConflict`` (409) instead when the route names a model (``model_name``) this
    server does not serve, as a good body would get; else return, and the body's own
    error stands. Only on that path: a good request looks its model up once, in the data
    plane."""
    if model_name is not None:
        plane.models.resolve(model_name, version)


def dataplane() -> DataPlane:
    """The app's data plane (``create_app`` puts it in ``app.extensions["serving"]``)."""
    plane: DataPlane = current_app.extensions["serving"]
    return plane


def read_json_body(environ: Mapping[str, Any], settings: Settings) -> bytes:
    """The raw body of the request of WSGI ``environ``, checked to be ``application/json``
    and at most ``SERVING_MAX_BODY_BYTES``.

    :raises UnsupportedMediaType: (415) for another or no Content-Type, or a charset other
        than UTF-8 (JSON is UTF-8: RFC 8259, section 8.1).
    :raises PayloadTooLarge: (413) over the limit, declared or while reading.
    :raises UnreadableBody: (400) as ``read_body``.
    :raises RequestTimeout: (408) as ``read_body``.
    """
    # request.mimetype, without building the request's headers (~4 us): the media type is
    # what comes before any parameter, trimmed and lowercased (RFC 9110, 8.3.1).
    # JSON as werkzeug's is_json has it: application/json or application/<any>+json.
    content_type = environ.get("CONTENT_TYPE", "")
    mimetype, _, parameters = content_type.partition(";")
    mimetype = mimetype.strip().lower()
    if mimetype != "application/json" and not (
        mimetype.startswith("application/") and mimetype.endswith("+json")
    ):
        raise UnsupportedMediaType(content_type or None)
    if parameters and _charset(parameters) not in (None, "utf-8", "utf8", "us-ascii"):
        raise UnsupportedMediaType(content_type, "application/json in UTF-8")
    return read_body(environ, settings)


def _charset(parameters: str) -> str | None:
    """The ``charset`` of a Content-Type's parameters (``a=1; charset="UTF-16"``),
    unquoted and lowercased; None without one."""
    for parameter in parameters.split(";"):
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip('"').lower()
    return None


def read_body(environ: Mapping[str, Any], settings: Settings) -> bytes:
    """The raw body of the request of WSGI ``environ``, whatever its Content-Type, at most
    ``SERVING_MAX_BODY_BYTES``.

    Chunked bodies (no Content-Length) are cut off at the same limit while they are read.
    For protocols whose clients send no or a non-JSON Content-Type (KServe V2's binary
    tensors); the JSON routes call ``read_json_body``.

    :raises PayloadTooLarge: (413) over the limit, declared or while reading.
    :raises UnreadableBody: (400) for a compressed body (a Content-Encoding other than
        ``identity``: none is decoded, and a compressed body read as it is would be refused
        for the wrong reason, or a plain one mislabelled answered), or when the server
        cannot read it (bad chunk encoding, the client went away mid-body).
    :raises RequestTimeout: (408) when the body did not arrive in time: under Gunicorn a
        read waits at most ``SERVING_REQUEST_TIMEOUT_MS`` after the headers
        (``serving.server.worker.ServingWorker.handle_request``).
    """
    max_body_bytes = settings.max_body_bytes
    encoding = environ.get("HTTP_CONTENT_ENCODING", "")
    if encoding and encoding.strip().lower() != "identity":
        raise UnreadableBody(
            f"Content-Encoding {encoding[:32]!r} is not supported: send the body uncompressed"
        )
    coding = environ.get("HTTP_TRANSFER_ENCODING", "")
    if coding and any(part.strip().lower() != "chunked" for part in coding.split(",")):
        raise UnsupportedTransferCoding(coding[:64])
    declared = environ.get("CONTENT_LENGTH", "")  # werkzeug's content_length costs ~10 us
    length = int(declared) if declared.isdigit() else None
    if length is not None and length > max_body_bytes:
        raise PayloadTooLarge("request body", length, max_body_bytes, _BODY_SETTING, "bytes")
    if length is None and not environ.get("wsgi.input_terminated"):
        return b""  # neither a length nor a chunked body: WSGI says there is none
    # Read straight from wsgi.input (werkzeug's stream wrappers cost ~14 us a request).
    # Chunked (no Content-Length): werkzeug would stop quietly at the limit and hand on a
    # truncated body (a 400 for the wrong reason). Read one byte past the limit to tell.
    wanted = length if length is not None else max_body_bytes + 1
    stream = environ["wsgi.input"]
    parts: list[bytes] = []
    got = 0
    try:
        while got < wanted:
            part = stream.read(wanted - got)
            if not part:
                break
            parts.append(part)
            got += len(part)
    except TimeoutError:
        limit_ms = settings.request_timeout_ms
        expected = f"the {length} bytes its Content-Length declared" if length else "its body"
        raise RequestTimeout(
            f"the request took more than {limit_ms:g} ms to arrive, past "
            f"SERVING_REQUEST_TIMEOUT_MS ({limit_ms:g} ms): the client sent {got} bytes of "
            f"{expected}"
        ) from None
    except Exception as exc:  # the server's own errors: bad chunk size, client gone
        raise UnreadableBody(f"request body could not be read: {type(exc).__name__}") from exc
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    if length is None and len(data) > max_body_bytes:
        raise PayloadTooLarge("chunked request body", None, max_body_bytes, _BODY_SETTING, "bytes")
    if length is not None and len(data) < length:
        # Under Gunicorn wsgi.input ends quietly when the client half-closes: a body cut
        # short would otherwise be parsed as if complete (a CSV losing its last rows).
        raise UnreadableBody(
            f"request body could not be read: the client sent {len(data)} of the "
            f"{length} bytes its Content-Length declared"
        )
    return data


def json_response(body: dict[str, Any], status: int = 200) -> Response:
    """``body`` as a JSON response (``json_bytes``)."""
    return Response(json_bytes(body), status=status, mimetype="application/json")


def json_bytes(body: dict[str, Any]) -> bytes:
    """Serialize ``body`` with orjson (numpy arrays natively; NaN and Infinity become null)."""
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def jsonable(array: npt.NDArray[Any]) -> Any:
    """orjson serializes numeric and bool arrays natively, but only C-contiguous ones (a batch
    slice of a Fortran-ordered output, e.g. GaussianNB's predict_proba, is not); labels
    (str/object) go through tolist(). Non-finite floats become null."""
    if array.dtype.kind in "biuf":
        return np.ascontiguousarray(array)
    return array.tolist()
