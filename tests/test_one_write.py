"""serving.server.one_write on Gunicorn's own request parser and Response, over a socket pair."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from gunicorn.config import Config  # type: ignore[import-untyped]
from gunicorn.http import RequestParser, wsgi  # type: ignore[import-untyped]

from serving.server.one_write import join_headers_and_body


class Recording:
    """A socket that records each ``sendall`` (the test's only fake: the wire is real)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.sends = sock, []  # type: list[bytes]

    def sendall(self, data: bytes) -> None:
        self.sends.append(bytes(data))
        self.sock.sendall(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


@pytest.fixture
def patched() -> Iterator[None]:
    saved = {n: wsgi.Response.__dict__[n] for n in ("write", "send_headers", "_emit_body")}
    assert join_headers_and_body()
    yield
    for name, value in saved.items():
        setattr(wsgi.Response, name, value)
    del wsgi.Response._serving_one_write


def respond(request: bytes, status: str, headers: list[tuple[str, str]], body: list[bytes]):  # type: ignore[no-untyped-def]
    """Gunicorn parses ``request`` and answers it with ``body`` written piece by piece:
    (the sendall calls, the bytes the client received)."""
    server, client = socket.socketpair()
    with server, client:
        client.sendall(request)
        cfg = Config()
        req = next(iter(RequestParser(cfg, server, ("127.0.0.1", 1))))
        sock = Recording(server)
        resp, _ = wsgi.create(req, sock, ("127.0.0.1", 1), ("127.0.0.1", 8000), cfg)
        resp.start_response(status, headers)
        for piece in body:
            resp.write(piece)
        resp.close()
        server.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := client.recv(65536):
            received += chunk
    return sock.sends, received


POST = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"


def test_one_write_sends_headers_and_a_whole_body_together(patched: None) -> None:
    body = b'{"predictions":[0]}'
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]

    sends, received = respond(POST, "200 OK", headers, [body])

    assert len(sends) == 1 and sends[0] == received
    assert received.startswith(b"HTTP/1.1 200 OK\r\n") and received.endswith(b"\r\n\r\n" + body)
    assert b"Content-Length: 19\r\n" in received


def test_gunicorn_alone_sends_them_apart() -> None:
    body = b'{"predictions":[0]}'
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]

    sends, received = respond(POST, "200 OK", headers, [body])

    assert len(sends) == 2 and sends[1] == body and b"".join(sends) == received


HEAD = b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\n"
OTHERS = {
    # streamed without a length: chunked, as Gunicorn frames it
    "chunked": (POST, "200 OK", [("Content-Type", "text/plain")], [b"ab", b"cd"], b"0\r\n\r\n"),
    # a body in two pieces of a declared length
    "two pieces": (POST, "200 OK", [("Content-Length", "4")], [b"ab", b"cd"], b"abcd"),
    # no body at all
    "no body": (POST, "204 No Content", [], [], b"\r\n\r\n"),
    # HEAD: headers only, whatever the app writes
    "head": (HEAD, "200 OK", [("Content-Length", "2")], [b"{}"], b"\r\n\r\n"),
}


@pytest.mark.parametrize("case", OTHERS.values(), ids=OTHERS.keys())
def test_one_write_leaves_other_responses_as_gunicorn_sends_them(
    patched: None, case: tuple[bytes, str, list[tuple[str, str]], list[bytes], bytes]
) -> None:
    request, status, headers, body, tail = case

    sends, received = respond(request, status, headers, body)

    assert len(sends) >= 1 and b"".join(sends) == received
    assert received.startswith(f"HTTP/1.1 {status}\r\n".encode()) and received.endswith(tail)
