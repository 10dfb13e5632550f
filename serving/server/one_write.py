"""Send a response's status line, headers and body in one ``sendall``, not two.

Gunicorn writes a response's headers with one ``sendall`` and its body with another. A
worker killed between the two (``SIGKILL``, the OOM killer) leaves the client, or the
proxy in front, with headers and no body: nginx has already passed the headers on and can
no longer retry the request on another replica (``proxy_next_upstream``), so the client
sees a broken response (``tests/deploy/test_nginx.py`` caught it about once in ten runs
with a model running on request threads). Written together, a response is on the wire
whole or not at all, and each response costs one system call fewer.

Only a body written in one piece of exactly its ``Content-Length`` (every JSON answer
here) is joined to its headers; chunked, streamed, empty and ``sendfile`` responses go
as Gunicorn sends them. ``join_headers_and_body`` patches Gunicorn's ``Response`` in the
calling worker process (after fork), and does nothing when Gunicorn's response lacks the
hooks it relies on (``_emit_body``, Gunicorn 23+).

Boundary: standard library and, when called, ``gunicorn.http.wsgi``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["join_headers_and_body"]


def join_headers_and_body() -> bool:
    """Patch ``gunicorn.http.wsgi.Response`` in this process; True when patched."""
    from gunicorn.http import wsgi  # type: ignore[import-untyped]

    response = wsgi.Response
    if getattr(response, "_serving_one_write", False):
        return True
    if not all(hasattr(response, name) for name in ("_emit_body", "send_headers", "write")):
        return False
    write, send_headers, emit_body = response.write, response.send_headers, response._emit_body

    def one_write(self: Any, arg: Any) -> Any:
        # The whole body, of its declared length, before any header was sent.
        self._serving_head = None
        self._serving_join = (
            not self.headers_sent
            and not self.chunked
            and isinstance(arg, bytes)
            and 0 < len(arg) == self.response_length
            and not getattr(self, "_omits_body", False)
        )
        try:
            result = write(self, arg)
        finally:
            self._serving_join = False
        head, self._serving_head = self._serving_head, None
        if head is not None:  # write() returned before emitting the body: send them now
            send_all(self, head)
        return result

    def deferred_headers(self: Any) -> Any:
        if not getattr(self, "_serving_join", False) or self.headers_sent:
            return send_headers(self)
        lines = self.default_headers()
        lines.extend(["%s: %s\r\n" % (k, v) for k, v in self.headers])  # noqa: UP031 (as Gunicorn)
        self._serving_head = ("%s\r\n" % "".join(lines)).encode("latin-1")  # noqa: UP031
        self.headers_sent = True
        return None

    def joined_body(self: Any, data: bytes) -> Any:
        head = getattr(self, "_serving_head", None)
        if head is None:
            return emit_body(self, data)
        self._serving_head = None
        return send_all(self, head + data)

    def send_all(self: Any, data: bytes) -> None:
        self.sock.sendall(data)

    response.write, response.send_headers, response._emit_body = (
        one_write,
        deferred_headers,
        joined_body,
    )
    response._serving_one_write = True
    return True
