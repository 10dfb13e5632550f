"""The service's exceptions: one small tree, mapped to HTTP once, in ``serving.app``.

::

    ServingError (status, code)                 500 internal_error
     ├── InvalidInput                            422 invalid_input
     │    └── MalformedJSON                      400 malformed_json
     ├── UnreadableBody                          400 unreadable_body
     ├── UnsupportedMediaType                    415 unsupported_media_type
     │    └── UnsupportedContentEncoding         415 unsupported_content_encoding
     ├── UnsupportedTransferCoding               501 unsupported_transfer_coding
     ├── Unauthorized                            401 unauthorized
     ├── PayloadTooLarge                         413 payload_too_large
     ├── ModelNotFound                           404 model_not_found
     │    └── LabelNotFound                      404 label_not_found
     ├── VersionConflict                         409 version_conflict
     ├── NotReady                                503 not_ready
     ├── Overloaded                              503 overloaded
     ├── RequestTimeout                          408 request_timeout
     ├── InferenceTimeout                        504 timeout
     ├── InferenceError                          500 inference_error
     ├── ModelLoadError                          500 model_load_error
     ├── ControlRefused                          409 control_refused
     ├── LoadFailed                              400 load_failed
     └── ControlTimeout                          504 control_timeout
    SettingsError (ValueError)                   start-up only, never an HTTP answer

Each error keeps its fields on the exception and builds its message from them, so
the message a caller reads and the one logged are the same. This module imports
only the standard library: ``batching`` and ``loaders`` raise these errors without
pulling in Flask or pydantic.
"""

from __future__ import annotations

from typing import Any, ClassVar, Self

__all__ = [
    "ControlRefused",
    "ControlTimeout",
    "InferenceError",
    "InferenceTimeout",
    "InvalidInput",
    "LabelNotFound",
    "LoadFailed",
    "MalformedJSON",
    "ModelLoadError",
    "ModelNotFound",
    "NotReady",
    "Overloaded",
    "PayloadTooLarge",
    "RequestTimeout",
    "ServingError",
    "SettingsError",
    "Unauthorized",
    "UnreadableBody",
    "UnsupportedContentEncoding",
    "UnsupportedMediaType",
    "UnsupportedTransferCoding",
    "VersionConflict",
]


class ServingError(Exception):
    """Base of every error the service answers with.

    :param message: what went wrong, in words for the caller.
    :param details: optional list of JSON-able dicts, each naming one location
        (``{"loc": "instances[3][5]", "msg": "..."}``).
    """

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal_error"
    #: Whether what the caller sent caused it, not the server or the model: every 4xx,
    #: and a 5xx a class says so of (501: a transfer coding the caller chose). An answer
    #: with such an error writes no ERROR line.
    caller_fault: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "caller_fault" not in cls.__dict__:
            cls.caller_fault = cls.status < 500

    def __init__(self, message: str, details: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or []


class InvalidInput(ServingError):
    """The request body is well-formed JSON but not a valid request (the caller's fault)."""

    status = 422
    code = "invalid_input"

    @classmethod
    def at(cls, loc: str, msg: str, kind: str) -> Self:
        """The refusal of what is at ``loc`` (``instances[3].plan``, ``inputs[1].data[7]``):
        message ``"<loc>: <msg>"`` and the one detail ``{"loc", "msg", "type": kind}``
        that every protocol's error body carries."""
        return cls(f"{loc}: {msg}", [{"loc": loc, "msg": msg, "type": kind}])


class MalformedJSON(InvalidInput):
    """The request body is not parseable JSON."""

    status = 400
    code = "malformed_json"


class UnreadableBody(ServingError):
    """The request body could not be read: bad chunked encoding, or the client went away."""

    status = 400
    code = "unreadable_body"


class Unauthorized(ServingError):
    """No valid API key was presented for a protected route."""

    status = 401
    code = "unauthorized"


class UnsupportedMediaType(ServingError):
    """The request body is not declared as ``application/json`` (or another type the route
    accepts, such as ``text/csv`` on ``/invocations``)."""

    status = 415
    code = "unsupported_media_type"

    def __init__(self, content_type: str | None, accepted: str = "application/json") -> None:
        self.content_type, self.accepted = content_type, accepted
        got = content_type or "no Content-Type"
        super().__init__(f"request body must be {accepted}, got {got}")


class UnsupportedContentEncoding(UnsupportedMediaType):
    """The body was sent compressed (a ``Content-Encoding`` other than ``identity``): none
    is decoded, and read as it is it would be refused for the wrong reason (RFC 9110,
    15.5.16: 415, answered with ``Accept-Encoding: identity``)."""

    code = "unsupported_content_encoding"

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        ServingError.__init__(
            self, f"Content-Encoding {encoding[:32]!r} is not supported: send the body uncompressed"
        )


class UnsupportedTransferCoding(ServingError):
    """The body was sent with a transfer coding besides ``chunked`` (``gzip, chunked``):
    none is decoded, so the server does not implement it (RFC 9112, 6.1: 501)."""

    status = 501
    code = "unsupported_transfer_coding"
    caller_fault = True

    def __init__(self, coding: str) -> None:
        self.coding = coding
        super().__init__(
            f"Transfer-Encoding {coding!r} is not supported: send the body plain or chunked"
        )


class PayloadTooLarge(ServingError):
    """The body or the number of instances is over a configured limit."""

    status = 413
    code = "payload_too_large"

    def __init__(self, what: str, size: int | None, limit: int, setting: str, unit: str) -> None:
        self.what, self.size, self.limit, self.setting = what, size, limit, setting
        got = "" if size is None else f" ({size} {unit})"
        super().__init__(f"{what}{got} is over the limit of {limit} {unit} ({setting})")


class ModelNotFound(ServingError):
    """The request named a model this replica does not serve at all."""

    status = 404
    code = "model_not_found"

    def __init__(self, name: str, served: list[str], message: str | None = None) -> None:
        self.name, self.served = name, served
        super().__init__(
            message
            or f"model {name!r} is not served here (this replica serves {', '.join(served)})"
        )

    @classmethod
    def in_repository(cls, name: str, folders: list[str]) -> Self:
        """No model folder ``name`` in the model repository, which holds ``folders``."""
        held = ", ".join(folders[:20]) + (", ..." if len(folders) > 20 else "")
        return cls(name, [], f"the model repository has no model {name!r} (it holds {held})")


class LabelNotFound(ModelNotFound):
    """The request named a version label (TF Serving's ``version_labels``) the model
    does not have."""

    code = "label_not_found"

    def __init__(self, name: str, label: str, labels: list[str]) -> None:
        ServingError.__init__(
            self,
            f"model {name!r} has no version label {label!r} "
            f"(its labels: {', '.join(labels) or 'none'})",
        )
        self.name, self.served, self.label = name, [name], label


class VersionConflict(ServingError):
    """The request pinned a model version this replica does not serve."""

    status = 409
    code = "version_conflict"

    def __init__(
        self, requested: str, served: str, name: str | None = None, why: str | None = None
    ) -> None:
        self.requested, self.served, self.name, self.why = requested, served, name, why
        model = f" of model {name!r}" if name is not None else ""
        because = f" (version {requested!r} is not served: {why})" if why else ""
        super().__init__(
            f"model_version {requested!r}{model} was requested but this replica serves "
            f"{served!r}{because}"
        )


class NotReady(ServingError):
    """The model is not loaded yet, or the batcher is stopping."""

    status = 503
    code = "not_ready"


class Overloaded(ServingError):
    """The batcher's queue is full; the caller should retry later."""

    status = 503
    code = "overloaded"


class RequestTimeout(ServingError):
    """The request itself took the whole deadline to arrive (a slow client, not the model)."""

    status = 408
    code = "request_timeout"


class InferenceTimeout(ServingError):
    """The instances were not answered within the allowed time."""

    status = 504
    code = "timeout"


class InferenceError(ServingError):
    """The model raised, or returned output that does not match its input rows."""

    status = 500
    code = "inference_error"


class ModelLoadError(ServingError):
    """The model artifact could not be found, checked or loaded.

    :param path: the artifact's path, as configured.
    :param reason: the cause, in words.
    """

    status = 500
    code = "model_load_error"

    def __init__(self, path: object, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"cannot load model {path}: {reason}")


class ControlRefused(ServingError):
    """A repository load or unload (``POST /v2/repository/models/{name}/load``) the server
    does not take: model control is not ``explicit``, or the unload would leave nothing to
    serve.

    :param name: the model named.
    :param reason: why, in words.
    """

    status = 409
    code = "control_refused"

    def __init__(self, name: str, reason: str) -> None:
        self.name, self.reason = name, reason
        super().__init__(f"model {name!r}: {reason}")


class LoadFailed(ServingError):
    """A repository load or unload did not take: the model has no servable version, or a
    worker could not load it (the server serves on what it served before).

    :param name: the model named.
    :param reason: which check or which worker failed, and why.
    """

    status = 400
    code = "load_failed"

    def __init__(self, name: str, reason: str) -> None:
        self.name, self.reason = name, reason
        super().__init__(f"model {name!r}: {reason}")


class ControlTimeout(ServingError):
    """A repository load or unload was not over within its deadline (it goes on).

    :param name: the model named.
    :param seconds: the deadline, in seconds.
    """

    status = 504
    code = "control_timeout"

    def __init__(self, name: str, seconds: float) -> None:
        self.name, self.seconds = name, seconds
        super().__init__(
            f"model {name!r}: not over within {seconds:g} s; it goes on (see /healthz and "
            "POST /v2/repository/index)"
        )


class SettingsError(ValueError):
    """A ``SERVING_`` environment variable has a value the service does not accept.

    :param variable: the environment variable's name, e.g. ``SERVING_MAX_BATCH_SIZE``.
    :param problem: what it accepts and what was wrong, in one line.
    """

    def __init__(self, variable: str, problem: str) -> None:
        self.variable, self.problem = variable, problem
        super().__init__(f"{variable}: {problem}")
