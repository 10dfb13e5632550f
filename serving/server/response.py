"""``ServingResponse``: Gunicorn's HTTP/1 response as ``ServingWorker`` sends it.

Two changes, each an override:

* **Headers and body in one write.** Gunicorn writes a response's headers with one
  ``sendall`` and its body with another. A worker killed between the two (``SIGKILL``, the
  OOM killer) leaves the client, or the proxy in front, with headers and no body: nginx has
  passed the headers on and can no longer retry the request on another replica
  (``proxy_next_upstream``; ``tests/deploy/test_nginx.py`` caught it about once in ten
  runs). A body written in one piece of exactly its ``Content-Length`` (every JSON answer
  here) goes with its headers; chunked, streamed, empty and file responses go as Gunicorn
  sends them.
* **``Connection: close`` when the body is left undrained.** Gunicorn drains at most
  ``_DRAIN_MAX_BYTES`` (64 KiB) of a body the application did not read before the next
  request, then closes: an answer leaving that much (or a chunked body not read to its end,
  whose length is unknown, or a body whose read passed its deadline: the 408) must say it
  closes (RFC 9112 section 9.6), or the client sends its next request on a connection about
  to close and loses it.

``GunicornAnswer`` stands in for the client socket while Gunicorn writes an answer itself
(its ``handle_error``: a bad request line or header, a transfer coding it does not know, a
URI too long): it keeps the status and reason off the bytes instead of sending Gunicorn's
HTML page, and ``json_answer`` is what the worker sends instead: the same status, the
service's JSON error shape, ``Connection: close``. So it is counted like the app's own, and
a client reading JSON errors can read it.

Imports only the standard library, ``serving.server.connection`` and Gunicorn.
"""

from __future__ import annotations

import contextlib
import json
import re
from http import HTTPStatus
from typing import Any

from gunicorn import util  # type: ignore[import-untyped]
from gunicorn.http import parser, wsgi  # type: ignore[import-untyped]

from serving.server.connection import Reader

__all__ = ["DRAIN_BYTES", "GunicornAnswer", "ServingResponse", "json_answer"]

#: Most bytes of an unread body Gunicorn drains before the next request on a connection.
DRAIN_BYTES: int = getattr(parser, "_DRAIN_MAX_BYTES", 64 * 1024)


class ServingResponse(wsgi.Response):  # type: ignore[misc]
    """Gunicorn's ``Response`` for one request read through ``reader``."""

    headers_sent: bool

    def __init__(self, req: Any, sock: Any, cfg: Any, reader: Reader) -> None:
        super().__init__(req, sock, cfg)
        self.reader = reader

    def should_close(self) -> bool:
        return bool(super().should_close()) or self.reader.expired or self._left_undrained()

    def _left_undrained(self) -> bool:
        body_reader: Any = getattr(getattr(self.req, "body", None), "reader", None)
        length = getattr(body_reader, "length", None)
        if isinstance(length, int):  # Content-Length: what is left of it
            return length >= DRAIN_BYTES
        if hasattr(body_reader, "parser"):  # chunked: its parser is None once at the end
            return body_reader.parser is not None
        return False

    def write(self, arg: Any) -> Any:
        whole = (
            not self.headers_sent
            and not self.chunked
            and isinstance(arg, bytes)
            and 0 < len(arg) == self.response_length
            and not self._omits_body
        )
        if not whole:
            return super().write(arg)
        lines = self.default_headers()
        lines.extend(["%s: %s\r\n" % (k, v) for k, v in self.headers])  # noqa: UP031 (as Gunicorn)
        head = ("%s\r\n" % "".join(lines)).encode("latin-1")  # noqa: UP031
        self.headers_sent = True
        self.sent = len(arg)
        self.sock.sendall(head + arg)
        return None


class GunicornAnswer:
    """A client socket that keeps the status line of the first answer written to it
    (``status``, 0 until one is; ``reason``) and sends nothing: for an answer Gunicorn
    writes itself, which the worker then sends as ``json_answer``."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self.status = 0
        self.reason = ""

    def _saw(self, data: Any) -> None:
        if not self.status:
            line = bytes(data[:128]).split(b"\r\n", 1)[0].split(b" ", 2)
            if len(line) > 1 and line[0].startswith(b"HTTP/") and line[1].isdigit():
                self.status = int(line[1])
                self.reason = line[2].decode("latin-1") if len(line) > 2 else ""

    def send(self, data: Any, *args: Any) -> int:
        self._saw(data)
        return len(data)

    def sendall(self, data: Any, *args: Any) -> None:
        self._saw(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


#: Our stable codes for the statuses whose codes the app's own errors have too.
_CODES = {500: "internal_error", 501: "unsupported_transfer_coding"}


def json_answer(status: int, reason: str, refused: BaseException, request_id: str) -> bytes:
    """A whole HTTP/1.1 answer that closes its connection, with ``Date`` (RFC 9110, 6.6.1),
    the service's JSON error body and ``X-Request-ID``: ``code`` the reason in snake case
    (``uri_too_long``), ``message`` the reason and what Gunicorn ``refused`` (at most 256
    characters); for a 500 (an exception of the server's, not the request's), only the
    reason. Gunicorn's ``reason`` is kept, except the "Bad Request" it gives a 500 or 501:
    that status's own phrase instead."""
    if reason == "Bad Request" and status != 400:
        with contextlib.suppress(ValueError):
            reason = HTTPStatus(status).phrase
    code = _CODES.get(status) or re.sub(r"\W+", "_", reason.lower()).strip("_") or "http_error"
    message = reason if status == 500 else f"{reason}: {refused}"
    error = {"code": code, "message": message[:256], "details": []}
    body = json.dumps({"error": error}).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\nDate: {util.http_date()}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"X-Request-ID: {request_id}\r\n\r\n"
    )
    return head.encode("latin-1") + body
