"""serving/server/connection.py: a request head known complete, the parser reading a head
the main loop read, and a thread's reads bounded and uncounted while they wait."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from gunicorn.config import Config  # type: ignore[import-untyped]

from serving.batching.arrivals import Arrivals
from serving.server.connection import (
    HEAD_READ_BYTES,
    INCOMPLETE,
    ChunkedBody,
    Reader,
    ServingConn,
    body_end,
    chunked_start,
    head_complete,
)
from tests.waiting import until


@pytest.mark.parametrize(
    ("head", "complete"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n", False),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", True),
        (b"POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}", True),  # body along
        (b"GET / HTTP/1.1\nHost: x\n\n", True),  # bare LF: the parser answers it (400)
        (b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 20000, True),  # too long to wait for
        (b"", False),
    ],
)
def test_head_complete_sees_the_blank_line_or_a_head_too_long_to_wait_for(
    head: bytes, complete: bool
) -> None:
    assert head_complete(head) is complete
    assert len(b"X: y\r\n" * 20000) > HEAD_READ_BYTES


def test_head_complete_finds_a_terminator_straddling_two_reads() -> None:
    first, second = b"GET / HTTP/1.1\r\nHost: x\r\n\r", b"\n"

    assert not head_complete(first)
    assert head_complete(first + second, searched_from=len(first))


def _conn(server: socket.socket, arrivals: Arrivals | None = None) -> ServingConn:
    conn = ServingConn(Config(), server, ("127.0.0.1", 1), ("127.0.0.1", 8000))
    conn.arrivals = arrivals
    conn.deadline = time.monotonic() + 10  # the head's (the main loop sets it)
    return conn


def test_the_parser_reads_the_head_the_main_loop_read_then_the_socket() -> None:
    server, client = socket.socketpair()
    with server, client:
        conn = _conn(server)
        conn.head = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\n{}"
        client.sendall(b"[1]}")  # the rest of the body, still on the socket
        conn.init()
        req = next(conn.parser)

        assert (req.method, req.path) == ("POST", "/predict")
        assert req.body.read() == b"{}[1]}"
        assert conn.head == b""


def test_a_pipelined_request_read_with_a_body_goes_back_to_the_head() -> None:
    server, client = socket.socketpair()
    with server, client:
        conn = _conn(server)
        conn.head = (
            b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}GET /livez HTTP/1.1\r\n"
        )
        conn.init()
        assert next(conn.parser).body.read() == b"{}"
        conn.parser.finish_body()
        conn.take_read_ahead()

        assert conn.head == b"GET /livez HTTP/1.1\r\n"
        assert not head_complete(conn.head)


def test_a_read_waiting_for_the_client_is_not_counted_until_bytes_come() -> None:
    """Found by an attack: a trickling body was counted while its thread only waited for
    the client, and every batch of the worker waited SERVING_MAX_BATCH_LATENCY_MS for it."""
    arrivals = Arrivals()
    server, client = socket.socketpair()
    with server, client:
        reader = Reader(server, arrivals)
        arrivals.enter()  # the thread took the request up
        client.sendall(b"ab")
        assert (reader.recv(16), arrivals.count) == (b"ab", 1)  # no wait: still counted
        seen: list[int] = []

        def send_later() -> None:
            until(lambda: arrivals.count == 0, 5, what="the waiting read uncounted")
            seen.append(arrivals.count)
            client.sendall(b"cd")

        sender = threading.Thread(target=send_later)
        sender.start()
        assert reader.recv(16) == b"cd"
        sender.join(5)

    assert seen == [0]  # while it waited
    assert arrivals.count == 1  # counted again once bytes came


def test_a_read_past_its_deadline_raises_and_marks_the_reader_expired() -> None:
    server, client = socket.socketpair()
    with server, client:
        reader = Reader(server, None)
        reader.deadline = time.monotonic() + 0.2
        client.sendall(b"ab")
        assert reader.recv(16) == b"ab"
        assert not reader.expired
        with pytest.raises(TimeoutError):
            reader.recv(16)  # nothing more comes
        assert reader.expired
        with pytest.raises(TimeoutError):
            reader.recv(16)  # past it: at once
        assert server.gettimeout() is None  # the socket's own timeout is left as it was


def test_a_head_the_thread_finishes_reading_ends_at_the_heads_deadline() -> None:
    """The parser reading the rest of a long head on a thread: past the head's deadline
    its read sees the end of the stream and the parser gives up (quietly, as on a client
    that went away), instead of waiting for good."""
    from gunicorn.http.errors import NoMoreData  # type: ignore[import-untyped]

    server, client = socket.socketpair()
    with server, client:
        conn = _conn(server)
        conn.head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 100
        conn.deadline = time.monotonic() + 0.3
        conn.init()
        started = time.monotonic()
        with pytest.raises(NoMoreData):
            next(conn.parser)
        waited = time.monotonic() - started

    assert waited < 5  # the socket has no timeout of its own: without the deadline, forever


@pytest.mark.parametrize(
    ("head", "end"),
    [
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n", 52),
        (b"POST / HTTP/1.1\r\ncontent-length:5\r\n\r\nab", 42),  # part of it along
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", None),  # no body
        (b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n", None),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n", None),
        (b"POST / HTTP/1.1\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n", None),
        (b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", None),
        (b"POST / HTTP/1.1\r\nContent-Length: 2000\r\n\r\n", None),  # past the limit
        (b"POST / HTTP/1.1\r\nX-Content-Length: 5\r\n\r\n", None),  # another header
    ],
)
def test_body_end_reads_only_a_body_with_one_content_length_within_the_limit(
    head: bytes, end: int | None
) -> None:
    assert body_end(head, most_bytes=1000) == end


CHUNKED_HEAD = b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    ("head", "start"),
    [
        (CHUNKED_HEAD, len(CHUNKED_HEAD)),
        (b"POST / HTTP/1.1\r\ntransfer-encoding:  Chunked \r\n\r\n5\r\n", 49),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", None),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", None),
        (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n", None),
        (
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            None,
        ),
        (b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n", None),
    ],
)
def test_chunked_start_reads_only_a_body_framed_by_chunked_alone(
    head: bytes, start: int | None
) -> None:
    assert chunked_start(head) == start


def test_chunked_body_ends_after_its_last_chunk_and_trailers_as_bytes_come() -> None:
    body = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Sum: 1\r\n\r\n"
    request = CHUNKED_HEAD + body + b"GET /next HTTP/1.1\r\n"  # pipelined: not the body's
    scan = ChunkedBody(len(CHUNKED_HEAD), most_bytes=100)

    ends = [scan.end(request[:n]) for n in range(len(CHUNKED_HEAD), len(request) + 1)]

    complete = len(CHUNKED_HEAD) + len(body)
    assert ends[: len(body)] == [INCOMPLETE] * len(body)
    assert set(ends[len(body) :]) == {complete}
    assert scan.data_bytes == 11


@pytest.mark.parametrize(
    "body",
    [
        b"zz\r\nhello\r\n",  # not a size
        b"5\r\nhelloXX",  # no CRLF after the data
        b"65\r\n",  # 101 bytes of data: over the limit
        b"5\r\nhello\r\n" * 20 + b"1\r\n",  # the sum over the limit
        b"1" * 2000,  # a size line longer than the main loop reads
        b"\r\n",  # an empty size
    ],
)
def test_chunked_body_a_thread_reads_on_when_malformed_or_over_the_limit(body: bytes) -> None:
    scan = ChunkedBody(len(CHUNKED_HEAD), most_bytes=100)

    assert scan.end(CHUNKED_HEAD + body) is None


def test_chunked_body_without_trailers_ends_after_the_last_chunks_crlf() -> None:
    request = CHUNKED_HEAD + b"0\r\n\r\n"
    scan = ChunkedBody(len(CHUNKED_HEAD), most_bytes=100)

    assert scan.end(request[:-2]) == INCOMPLETE
    assert scan.end(request) == len(request)


def test_without_expect_continue_drops_only_a_lone_http11_100_continue() -> None:
    from serving.server.connection import without_expect_continue

    head = b"POST /p HTTP/1.1\r\nHost: x\r\nExpect: 100-Continue \r\nContent-Length: 2\r\n\r\n"
    assert without_expect_continue(head) == (
        b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n"
    )
    assert without_expect_continue(head + b"{}") == (
        b"POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    )
    assert without_expect_continue(head.replace(b"HTTP/1.1", b"HTTP/1.0")) is None  # ignored
    assert without_expect_continue(head.replace(b"100-Continue", b"gzip")) is None  # 417
    twice = head.replace(b"Host: x", b"Expect: 100-continue")
    assert without_expect_continue(twice) is None  # the parser judges it
    assert without_expect_continue(head[:-2]) is None  # not a whole head yet
    assert without_expect_continue(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n") is None


def test_without_expect_continue_leaves_a_field_name_with_a_space_to_the_parser() -> None:
    """Found by the second attack: ``Expect : 100-continue`` was stripped and served
    (Gunicorn refuses a space before the colon in any other field: 400)."""
    from serving.server.connection import without_expect_continue

    head = b"POST /p HTTP/1.1\r\nHost: x\r\nExpect : 100-continue\r\nContent-Length: 2\r\n\r\n"
    assert without_expect_continue(head) is None
