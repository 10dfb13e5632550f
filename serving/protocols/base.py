"""What every protocol shares: how it declares itself (``ProtocolSpec``: its cold routes
on a Flask blueprint, its prediction ``Route``s for the dispatcher, its OpenAPI operations
and its error style), the ``Answer`` a prediction handler returns, the one mapping of an
error to its answer, and JSON encoding.

A protocol package (``serving.protocols.predict``, ``v2``, ``tfserving``, ``mlflow``)
declares itself as one ``ProtocolSpec``; ``serving.app.create_app`` collects them, and
nothing is registered at import.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
from flask import Blueprint, Response, current_app, request
from werkzeug.exceptions import HTTPException
from werkzeug.routing import BaseConverter

from serving.dataplane import DataPlane
from serving.errors import InvalidInput, ServingError, UnsupportedContentEncoding
from serving.openapi import Operation

__all__ = [
    "SERVICE_STYLE",
    "Answer",
    "ErrorBody",
    "ErrorStyle",
    "ErrorStyles",
    "Handler",
    "ProtocolSpec",
    "Route",
    "dataplane",
    "error_answer",
    "http_error_answer",
    "json_answer",
    "json_bytes",
    "json_response",
    "jsonable",
    "model_before_body",
    "response_of",
    "service_error_body",
    "template",
    "unexpected_answer",
]

log = logging.getLogger("serving")

#: ``(status, code, message, details) -> body``: how one protocol spells an error.
ErrorBody = Callable[[int, str, str, list[dict[str, Any]]], dict[str, Any]]


def service_error_body(
    status: int, code: str, message: str, details: list[dict[str, Any]]
) -> dict[str, Any]:
    """The service's own error shape: ``{"error": {"code", "message", "details"}}``."""
    return {"error": {"code": code, "message": message, "details": details}}


@dataclass(frozen=True, slots=True)
class ErrorStyle:
    """How one protocol answers an error.

    :param body: its error body (KServe V2 and TF Serving clients expect
        ``{"error": "message"}``, MLflow's ``{"error_code", "message"}``).
    :param invalid_input_status: the status of every ``InvalidInput`` (and its
        ``MalformedJSON``), when not their own (422, 400): KServe V2 answers every invalid
        request with 400 (Triton too), ``code`` the same. Every other error has its own
        status whatever the style.
    """

    body: ErrorBody = service_error_body
    invalid_input_status: int | None = None

    def status(self, exc: ServingError) -> int:
        """The HTTP status of an answer with ``exc``."""
        if self.invalid_input_status is not None and isinstance(exc, InvalidInput):
            return self.invalid_input_status
        return exc.status


#: The service's own style (``/predict``, the probes, the docs).
SERVICE_STYLE = ErrorStyle()


@dataclass(frozen=True, slots=True)
class Answer:
    """What a prediction handler answers: the status, the body's bytes and media type, and
    any headers besides Content-Type, Content-Length and X-Request-ID (which the
    dispatcher writes)."""

    body: bytes
    status: int = 200
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()


#: A prediction handler: ``(plane, call, environ, **route arguments) -> Answer``; it raises
#: a ``ServingError`` for an error answer (``error_answer``).
Handler = Callable[..., Answer]


@dataclass(frozen=True)
class Route:
    """One prediction route, answered by the dispatcher (``serving.protocols.dispatch``),
    POST only.

    :param rule: a werkzeug rule (``/v2/models/<model_name>/infer``); its converters are
        werkzeug's and the protocol's ``ProtocolSpec.converters``.
    :param handler: called with the rule's arguments by name, and ``defaults``'.
    """

    rule: str
    handler: Handler
    defaults: Mapping[str, Any] | None = None

    @property
    def template(self) -> str:
        """The rule as its OpenAPI path template (``template``)."""
        return template(self.rule)


@dataclass(frozen=True)
class ProtocolSpec:
    """One protocol as ``create_app`` wires it.

    :param bp: its cold routes (metadata, health): Flask views.
    :param operations: every route's OpenAPI operation, the prediction routes' too; an
        operation documented without security is open without an API key.
    :param style: its error style; the service's by default.
    :param path_prefixes: requests that no route matched (404, 405) under these paths get
        ``style`` too: a prefix ending in ``/`` matches the paths under it, any other only
        itself (``/ping``, so ``/pingx`` and ``/ping/x`` are the service's 404s).
    :param routes: its prediction routes, answered by the dispatcher, not Flask.
    :param converters: werkzeug converters its routes' rules name (``tf_model``), for
        the dispatcher's map and the blueprint's rules alike.
    :param examples: its prediction routes' example request bodies (``/docs``), by
        OpenAPI path, built from an ``Example``.
    """

    bp: Blueprint
    operations: Sequence[Operation]
    style: ErrorStyle = SERVICE_STYLE
    path_prefixes: tuple[str, ...] = ()
    routes: tuple[Route, ...] = ()
    converters: Mapping[str, type[BaseConverter]] = field(default_factory=dict)
    examples: Callable[[Example], Mapping[str, Any]] | None = None


@dataclass(frozen=True)
class Example:
    """One instance the default model answers (zeros, false, a known category:
    ``ModelHandle.sample``), from which each protocol builds the request bodies "Try it
    out" in ``/docs`` sends (``ProtocolSpec.examples``: OpenAPI path -> body).

    :param names: the features' names, when the model has them; else the values are
        positional.
    :param values: one JSON value per feature, in the model's order.
    :param handle: the model, for what a protocol needs besides (V2: its inputs).
    """

    handle: Any
    names: tuple[str, ...] | None
    values: list[Any]

    @property
    def instance(self) -> Any:
        """The instance as ``/predict`` and TF Serving's row format take it."""
        return dict(zip(self.names, self.values, strict=True)) if self.names else self.values


@dataclass(frozen=True)
class ErrorStyles:
    """Each protocol's error style, by blueprint name and by path prefix."""

    by_blueprint: Mapping[str, ErrorStyle] = field(default_factory=dict)
    by_prefix: Mapping[str, ErrorStyle] = field(default_factory=dict)

    @classmethod
    def of(cls, protocols: Sequence[ProtocolSpec]) -> ErrorStyles:
        return cls(
            {p.bp.name: p.style for p in protocols},
            {prefix: p.style for p in protocols for prefix in p.path_prefixes},
        )

    def for_path(self, path: str) -> ErrorStyle:
        """The style of an unmatched request for ``path`` (``ProtocolSpec.path_prefixes``),
        the service's by default."""
        for prefix, style in self.by_prefix.items():
            if path == prefix or (prefix[-1] == "/" and path.startswith(prefix)):
                return style
        return SERVICE_STYLE

    def current(self) -> ErrorStyle:
        """The style of Flask's current request: its route's blueprint's, else its path's."""
        if not request:
            return SERVICE_STYLE
        if request.blueprint is not None:
            return self.by_blueprint.get(request.blueprint, SERVICE_STYLE)
        return self.for_path(request.path)


def error_answer(exc: ServingError, style: ErrorStyle, request_id: str | None) -> Answer:
    """The answer to a request that failed with ``exc``, in ``style``. A server error
    other than 503 (expected; metrics count them) that the caller did not cause
    (``ServingError.caller_fault``) is logged first, with the model's own traceback when
    it raised. For the dispatcher and the app's error handler alike."""
    status = style.status(exc)
    if status >= 500 and status != 503 and not exc.caller_fault:
        log.error(
            "request %s failed: %s %s", request_id, exc.code, exc.message,
            exc_info=exc.__cause__,
        )  # fmt: skip
    data = json_bytes(style.body(status, exc.code, exc.message, exc.details))
    if status == 503:
        return Answer(data, status, headers=(("Retry-After", "1"),))
    if status == 401:
        return Answer(data, status, headers=(("WWW-Authenticate", 'Bearer realm="serving"'),))
    if isinstance(exc, UnsupportedContentEncoding):  # what would be accepted: RFC 9110
        return Answer(data, status, headers=(("Accept-Encoding", "identity"),))
    return Answer(data, status)


def http_error_answer(exc: HTTPException, style: ErrorStyle, method: str, path: str) -> Answer:
    """The answer to a request werkzeug refused before any handler (404, 405 with its
    ``Allow``, 400 for a bad Host), in ``style``: ``code`` is the status's name
    (``method_not_allowed``)."""
    status = exc.code or 500
    code = re.sub(r"\W+", "_", (exc.name or "http_error").lower()).strip("_")
    target = f"{method[:16]} {path[:200]}"
    allow = getattr(exc, "valid_methods", None)
    if status == 404:
        message = f"no route for {target}"
    elif status == 405 and allow:
        message = f"{target}: method not allowed; allowed: {', '.join(allow)}"
    else:
        message = exc.description or exc.name
    headers = (("Allow", ", ".join(allow)),) if allow else ()
    return Answer(json_bytes(style.body(status, code, message, [])), status, headers=headers)


def unexpected_answer(style: ErrorStyle, request_id: str | None) -> Answer:
    """The 500 answer to an exception no handler expected, logged with its traceback:
    call it while handling the exception."""
    log.exception("request %s failed with an unexpected error", request_id)
    return Answer(json_bytes(style.body(500, "internal_error", "internal server error", [])), 500)


def model_before_body(plane: DataPlane, model_name: str | None, version: str | None) -> None:
    """Called while refusing a request's body: raise ``ModelNotFound`` (404) or
    ``VersionConflict`` (409) instead when the route names a model (``model_name``) this
    server does not serve, as a good body would get; else return, and the body's own
    error stands. Only on that path: a good request looks its model up once, in the data
    plane."""
    if model_name is not None:
        plane.resolve(model_name, version)


def dataplane() -> DataPlane:
    """The app's data plane, for a Flask view (``create_app`` puts it in
    ``app.extensions["serving"]``); a prediction handler is handed it."""
    plane: DataPlane = current_app.extensions["serving"]
    return plane


@functools.cache
def template(rule: str) -> str:
    """A werkzeug rule as its OpenAPI path template, for metric labels and logs:
    ``/v1/models/<tf_model:model_name>:predict`` -> ``/v1/models/{model_name}:predict``."""
    return re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule)


def json_answer(body: dict[str, Any]) -> Answer:
    """``body`` as a 200 JSON answer (``json_bytes``)."""
    return Answer(json_bytes(body))


def response_of(answer: Answer) -> Response:
    """``answer`` as a Flask response, for a Flask view or error handler."""
    response = Response(answer.body, status=answer.status, content_type=answer.content_type)
    for name, value in answer.headers:
        response.headers[name] = value
    return response


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
