"""serving/server/response.py on Gunicorn's own request parser, over a socket pair: headers
and body in one write, Connection: close for a body left undrained, and the status of an
answer Gunicorn writes itself."""

from __future__ import annotations

import json
import socket
from email.utils import parsedate_to_datetime
from typing import Any

import pytest
from gunicorn.config import Config  # type: ignore[import-untyped]
from gunicorn.http import RequestParser, wsgi  # type: ignore[import-untyped]
from gunicorn.util import write_error  # type: ignore[import-untyped]

from serving.server.connection import Reader
from serving.server.response import DRAIN_BYTES, GunicornAnswer, ServingResponse, json_answer


class Recording:
    """A socket that records each ``sendall`` (the test's only fake: the wire is real)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.sends = sock, []  # type: list[bytes]

    def sendall(self, data: bytes) -> None:
        self.sends.append(bytes(data))
        self.sock.sendall(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


def respond(  # type: ignore[no-untyped-def]
    request: bytes,
    status: str,
    headers: list[tuple[str, str]],
    body: list[bytes],
    *,
    response_class: Any = ServingResponse,
    read_body: int = -1,
):
    """Gunicorn parses ``request`` and answers it with ``body`` written piece by piece, the
    app having read ``read_body`` bytes of the request body (-1: all of it): (the sendall
    calls, the bytes the client received)."""
    server, client = socket.socketpair()
    with server, client:
        client.sendall(request)
        cfg = Config()
        reader = Reader(server, None)
        req = next(iter(RequestParser(cfg, reader, ("127.0.0.1", 1))))
        if read_body:
            req.body.read(read_body if read_body > 0 else None)
        sock = Recording(server)
        args = (reader,) if response_class is ServingResponse else ()
        resp, _ = wsgi.create(
            req, sock, ("127.0.0.1", 1), ("127.0.0.1", 8000), cfg,
            response_class=response_class, response_args=args,
        )  # fmt: skip
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
BODY = b'{"predictions":[0]}'
JSON = [("Content-Type", "application/json"), ("Content-Length", str(len(BODY)))]


def test_response_sends_headers_and_a_whole_body_together() -> None:
    sends, received = respond(POST, "200 OK", JSON, [BODY])

    assert len(sends) == 1 and sends[0] == received
    assert received.startswith(b"HTTP/1.1 200 OK\r\n") and received.endswith(b"\r\n\r\n" + BODY)
    assert b"Content-Length: 19\r\n" in received
    assert b"Connection: keep-alive\r\n" in received


def test_gunicorns_own_response_sends_them_apart() -> None:
    sends, received = respond(POST, "200 OK", JSON, [BODY], response_class=wsgi.Response)

    assert len(sends) == 2 and sends[1] == BODY and b"".join(sends) == received


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
def test_response_leaves_other_responses_as_gunicorn_sends_them(
    case: tuple[bytes, str, list[tuple[str, str]], list[bytes], bytes],
) -> None:
    request, status, headers, body, tail = case

    sends, received = respond(request, status, headers, body)

    assert len(sends) >= 1 and b"".join(sends) == received
    assert received.startswith(f"HTTP/1.1 {status}\r\n".encode()) and received.endswith(tail)


def _big_post(length: int) -> bytes:
    head = f"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n"
    return head.encode() + b"x" * 1000  # the rest never comes (nor is it read)


def test_an_answer_leaving_the_drain_limit_unread_says_it_closes() -> None:
    """Gunicorn drains at most 64 KiB of an unread body before the next request, then
    closes: the answer must say so, or the client's next request on it is lost."""
    _, left = respond(_big_post(DRAIN_BYTES + 1000), "413 X", JSON, [BODY], read_body=0)
    _, small = respond(_big_post(DRAIN_BYTES - 1), "413 X", JSON, [BODY], read_body=0)

    assert b"Connection: close\r\n" in left
    assert b"Connection: keep-alive\r\n" in small  # Gunicorn drains that much


def test_an_unfinished_chunked_body_says_it_closes() -> None:
    chunked = b"POST /p HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"
    done = b"POST /p HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n\r\n"

    _, unfinished = respond(chunked, "413 X", JSON, [BODY], read_body=0)
    _, finished = respond(done, "200 OK", JSON, [BODY])

    assert b"Connection: close\r\n" in unfinished
    assert b"Connection: keep-alive\r\n" in finished


def test_gunicorns_own_answer_is_kept_not_sent_and_sent_as_json() -> None:
    server, client = socket.socketpair()
    with server, client:
        answer = GunicornAnswer(server)
        assert answer.status == 0
        write_error(answer, 431, "Request Header Fields Too Large", "too many")
        refused = ValueError("too many headers")
        server.sendall(json_answer(answer.status, answer.reason, refused, "req-1"))
        server.shutdown(socket.SHUT_WR)
        received = client.recv(65536)

    assert answer.status == 431
    head, _, body = received.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    date = lines.pop(1).decode()
    assert date.startswith("Date: ") and parsedate_to_datetime(date[6:]).tzinfo is not None
    assert lines == [
        b"HTTP/1.1 431 Request Header Fields Too Large",
        b"Connection: close",
        b"Content-Type: application/json",
        f"Content-Length: {len(body)}".encode(),
        b"X-Request-ID: req-1",
    ]
    assert json.loads(body) == {
        "error": {
            "code": "request_header_fields_too_large",
            "message": "Request Header Fields Too Large: too many headers",
            "details": [],
        }
    }


def test_gunicorns_own_501_says_not_implemented_not_bad_request() -> None:
    """Found by the attack: Gunicorn gives each of its refusals the reason "Bad Request",
    a 501 too; the status line carries the status's own phrase."""
    answer = json_answer(501, "Bad Request", ValueError("Unsupported transfer coding"), "r")

    assert answer.startswith(b"HTTP/1.1 501 Not Implemented\r\n")
    body = json.loads(answer.partition(b"\r\n\r\n")[2])
    assert body["error"]["message"].startswith("Not Implemented: ")
