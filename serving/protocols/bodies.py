"""Reading a request's body from its WSGI environ: the size limit, the transfer and
content codings accepted, deadlines, and the media type, for every protocol's handlers.

Straight from ``wsgi.input``: werkzeug's request and stream wrappers cost ~14 us a request
on the prediction path, which the dispatcher (``serving.protocols.dispatch``) answers
without building them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from serving.context import BODY_OVER_LIMIT
from serving.errors import (
    PayloadTooLarge,
    RequestTimeout,
    UnreadableBody,
    UnsupportedContentEncoding,
    UnsupportedMediaType,
    UnsupportedTransferCoding,
)
from serving.settings import Settings

__all__ = ["is_json", "media_type", "read_body", "read_json_body", "read_utf8_body"]

_BODY_SETTING = "SERVING_MAX_BODY_BYTES"


def read_json_body(environ: Mapping[str, Any], settings: Settings) -> bytes:
    """The raw body of the request of WSGI ``environ``, checked to be ``application/json``
    and at most ``SERVING_MAX_BODY_BYTES``.

    :raises UnsupportedMediaType: (415) for another or no Content-Type, or a charset other
        than UTF-8 (JSON is UTF-8: RFC 8259, section 8.1).
    :raises PayloadTooLarge: (413) over the limit, declared or while reading.
    :raises UnreadableBody: (400) as ``read_body``.
    :raises RequestTimeout: (408) as ``read_body``.
    """
    content_type = environ.get("CONTENT_TYPE", "")
    if not is_json(_media_type(content_type)[0]):
        raise UnsupportedMediaType(content_type or None)
    return read_utf8_body(environ, settings, "application/json")


def read_utf8_body(environ: Mapping[str, Any], settings: Settings, media: str) -> bytes:
    """The raw body of a request whose media type (``media``) was checked, as
    ``read_body``, once its Content-Type declares no charset other than UTF-8 (or its
    subset US-ASCII).

    :raises UnsupportedMediaType: (415) for another charset (``text/csv; charset=latin-1``
        was taken, then refused as "not UTF-8" with a 422).
    """
    content_type = environ.get("CONTENT_TYPE", "")
    parameters = _media_type(content_type)[1]
    if parameters and _charset(parameters) not in (None, "utf-8", "utf8", "us-ascii"):
        raise UnsupportedMediaType(content_type, f"{media} in UTF-8")
    return read_body(environ, settings)


def media_type(environ: Mapping[str, Any]) -> str:
    """The media type of the request of WSGI ``environ``'s Content-Type, without its
    parameters, trimmed and lowercased (``request.mimetype`` without building the request's
    headers, ~4 us: RFC 9110, 8.3.1); ``""`` without one."""
    return _media_type(environ.get("CONTENT_TYPE", ""))[0]


def is_json(mimetype: str) -> bool:
    """Whether ``mimetype`` (``media_type``'s) is JSON as werkzeug's ``is_json`` has it:
    ``application/json`` or ``application/<any>+json``."""
    return mimetype == "application/json" or (
        mimetype.startswith("application/") and mimetype.endswith("+json")
    )


def _media_type(content_type: str) -> tuple[str, str]:
    """``(media type, parameters)`` of a Content-Type value."""
    mimetype, _, parameters = content_type.partition(";")
    return mimetype.strip().lower(), parameters


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
    :raises UnsupportedContentEncoding: (415) for a compressed body (a Content-Encoding
        other than ``identity``: none is decoded, and a compressed body read as it is
        would be refused for the wrong reason, or a plain one mislabelled answered).
    :raises UnreadableBody: (400) when the server cannot read it (bad chunk encoding, the
        client went away mid-body).
    :raises RequestTimeout: (408) when the body did not arrive in time: under Gunicorn a
        read waits at most ``SERVING_REQUEST_TIMEOUT_MS`` after the headers
        (``serving.server.worker.ServingWorker.handle_request``).
    """
    max_body_bytes = settings.max_body_bytes
    encoding = environ.get("HTTP_CONTENT_ENCODING", "")
    if encoding and encoding.strip().lower() != "identity":
        raise UnsupportedContentEncoding(encoding)
    coding = environ.get("HTTP_TRANSFER_ENCODING", "")
    if coding and any(part.strip().lower() != "chunked" for part in coding.split(",")):
        raise UnsupportedTransferCoding(coding[:64])
    declared = environ.get("CONTENT_LENGTH", "")  # werkzeug's content_length costs ~10 us
    length = int(declared) if declared.isdigit() else None
    if length is not None and length > max_body_bytes:
        raise PayloadTooLarge("request body", length, max_body_bytes, _BODY_SETTING, "bytes")
    if environ.get(BODY_OVER_LIMIT):  # its chunks declared more (our worker saw them)
        raise PayloadTooLarge("chunked request body", None, max_body_bytes, _BODY_SETTING, "bytes")
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
