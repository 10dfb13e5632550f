"""One client connection of ``ServingWorker`` (``serving.server.worker``): its request head
read on the worker's main loop, then its request read by a thread through ``Reader``.

A connection is in one of two places. **On the main loop** (``Head``): accepted, or kept
alive after an answer, its socket non-blocking in the worker's poller; each time it is
readable the loop reads what is there into ``head``, and once the request line and headers
are all in (``head_complete``) the connection goes to a thread, the head and whatever body
came with it handed to Gunicorn's parser. Until then it costs no thread: a thousand idle or
trickling connections cost a thousand buffers and a poller entry each, and the loop closes
the ones past their deadline (``SERVING_HEADER_TIMEOUT_S`` from the accept or from the
first byte after a keep-alive answer; Gunicorn's ``keepalive`` for one that sent nothing
since its last answer). As nginx and every event-driven server do.

**On a thread**: the parser reads the rest through ``Reader``, which bounds each read by
the phase's deadline (the head's, for a head longer than the loop reads; then the body's,
``SERVING_REQUEST_TIMEOUT_MS`` after the headers) and uncounts the request from the
requests on their way to a batcher (``serving.batching.arrivals``) while it waits for the
client.

Imports only the standard library, ``serving.batching.arrivals``, ``lingering`` and Gunicorn.
"""

from __future__ import annotations

import re
import select
import socket
import time
from typing import Any

from gunicorn import http  # type: ignore[import-untyped]
from gunicorn.workers import gthread  # type: ignore[import-untyped]

from serving.batching.arrivals import Arrivals
from serving.server.lingering import Lingerer

__all__ = [
    "HEAD_READ_BYTES",
    "INCOMPLETE",
    "ChunkedBody",
    "Reader",
    "ServingConn",
    "body_end",
    "chunked_start",
    "head_complete",
]

#: Most bytes of a request head the main loop reads before handing the connection to a
#: thread anyway (the parser then reads the rest, by the same deadline, or refuses it:
#: Gunicorn's ``limit_request_line`` and ``limit_request_fields`` apply there). nginx's
#: largest head buffers are 4 x 8 KiB; with ``worker_connections`` (4,096) this bounds
#: what heads on the main loop hold to 128 MiB per worker, whatever the clients send.
HEAD_READ_BYTES = 32 * 1024


def head_complete(head: bytes, searched_from: int = 0) -> bool:
    """Whether ``head`` holds a whole request line and headers (the blank line ending
    them), looking from ``searched_from`` (less the 3 bytes a terminator can straddle), or
    is as long as the main loop reads (``HEAD_READ_BYTES``)."""
    if len(head) >= HEAD_READ_BYTES:
        return True
    start = max(0, searched_from - 3)
    return head.find(b"\r\n\r\n", start) >= 0 or head.find(b"\n\n", start) >= 0


_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length[ \t]*:[ \t]*([0-9]{1,12})[ \t]*(?=\r\n)", re.I)
#: A body framed otherwise (chunked), or one the client sends only once answered.
_NOT_BY_LENGTH = re.compile(rb"\r\n(?:transfer-encoding|expect)[ \t]*:", re.I)


def body_end(head: bytes, most_bytes: int) -> int | None:
    """Where the request's body ends, counted from the start of ``head`` (a complete
    head, perhaps with some of its body), when the main loop may read the body too: the
    head's length plus its one ``Content-Length``. None where a thread should take the
    connection as it is: no body, a body framed otherwise (chunked) or sent only once
    answered (``Expect: 100-continue``: ``without_expect_continue`` first), several or
    odd lengths (the parser refuses
    them), or a body larger than ``most_bytes``. Only decides where to read; Gunicorn's
    parser still parses the whole request."""
    end = head.find(b"\r\n\r\n")
    if end < 0:
        return None
    headers = head[: end + 2]
    if _NOT_BY_LENGTH.search(headers):
        return None
    lengths = _CONTENT_LENGTH.findall(headers)
    if len(lengths) != 1 or not 0 < int(lengths[0]) <= most_bytes:
        return None
    return end + 4 + int(lengths[0])


#: No space before the colon: Gunicorn refuses such a field name (400), as RFC 9112 says.
_EXPECT = re.compile(rb"\r\nexpect:([^\r\n]*)", re.I)
#: The interim answer to ``Expect: 100-continue`` (RFC 9110, 10.1.1).
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def without_expect_continue(head: bytes) -> bytes | None:
    """``head`` (a complete head, perhaps with some of its body) without its
    ``Expect: 100-continue`` field, when that is the request's one expectation and it is
    HTTP/1.1: the main loop then answers it (``CONTINUE``) and reads the body, and the
    thread's parser, seeing no expectation, sends no second 100. None otherwise (no
    expectation, another one: Gunicorn answers 417; HTTP/1.0: ignored, as RFC 9110
    says)."""
    end = head.find(b"\r\n\r\n")
    if end < 0:
        return None
    headers = head[: end + 2]
    found = list(_EXPECT.finditer(headers))
    if len(found) != 1 or found[0].group(1).strip().lower() != b"100-continue":
        return None
    if not headers[: headers.find(b"\r\n")].endswith(b" HTTP/1.1"):
        return None
    return head[: found[0].start()] + head[found[0].end() :]


_TRANSFER_ENCODING = re.compile(rb"\r\ntransfer-encoding[ \t]*:([^\r\n]*)", re.I)
_LENGTH_OR_EXPECT = re.compile(rb"\r\n(?:content-length|expect)[ \t]*:", re.I)
#: Longest chunk size line (the size and its extensions) and trailer section the main
#: loop reads of a chunked body; a longer one goes to a thread, whose parser judges it.
CHUNK_LINE_BYTES = 1024
TRAILER_BYTES = 8 * 1024
#: ``ChunkedBody.end``: the body is not complete yet.
INCOMPLETE = -1


def chunked_start(head: bytes) -> int | None:
    """Where a chunked body begins in ``head`` (a complete head, perhaps with some of its
    body), when the main loop may read it: one ``Transfer-Encoding`` of exactly
    ``chunked``, neither ``Content-Length`` nor ``Expect``; None where a thread should
    take the connection as it is (Gunicorn's parser refuses or reads the others)."""
    end = head.find(b"\r\n\r\n")
    if end < 0:
        return None
    headers = head[: end + 2]
    codings = _TRANSFER_ENCODING.findall(headers)
    if len(codings) != 1 or codings[0].strip().lower() != b"chunked":
        return None
    if _LENGTH_OR_EXPECT.search(headers):
        return None
    return end + 4


class ChunkedBody:
    """Where a chunked body (RFC 9112, 7.1) read into a buffer ends, found as its bytes
    come, each byte looked at once: chunk size lines, their data and CRLF, the last
    chunk and its trailers. Only decides where to read; Gunicorn's parser still parses
    the whole request on the thread.

    Usage::

        body = ChunkedBody(chunked_start(buffer), most_bytes=2 * 1024 * 1024)
        body.end(buffer)        # INCOMPLETE, the index past the body, or None
    """

    __slots__ = ("at", "data_bytes", "most_bytes", "over_limit")

    def __init__(self, at: int, most_bytes: int) -> None:
        self.at, self.most_bytes = at, most_bytes
        #: The chunk data so far, in bytes.
        self.data_bytes = 0
        #: Whether a chunk declared more data than ``most_bytes`` in all.
        self.over_limit = False

    def end(self, buffer: bytes) -> int | None:
        """The index just past the body in ``buffer`` (all of it read so far, from the
        start of the request), ``INCOMPLETE`` while more is to come, or None when a
        thread should read on: a malformed size line (the parser answers 400) or more
        than ``most_bytes`` of data (the body read answers 413)."""
        while True:
            line_end = buffer.find(b"\r\n", self.at, self.at + CHUNK_LINE_BYTES)
            if line_end < 0:
                return INCOMPLETE if len(buffer) - self.at < CHUNK_LINE_BYTES else None
            size_text = buffer[self.at : line_end].split(b";", 1)[0].strip()
            if not size_text or size_text.strip(b"0123456789abcdefABCDEF"):
                return None
            size = int(size_text, 16)  # any length: the line is at most CHUNK_LINE_BYTES
            if size == 0:
                return self._trailers_end(buffer, line_end + 2)
            if self.data_bytes + size > self.most_bytes:
                self.over_limit = True
                return None
            chunk_end = line_end + 2 + size
            if len(buffer) < chunk_end + 2:
                return INCOMPLETE
            if buffer[chunk_end : chunk_end + 2] != b"\r\n":
                return None
            self.data_bytes += size
            self.at = chunk_end + 2

    def _trailers_end(self, buffer: bytes, start: int) -> int | None:
        """Past the trailer section that begins at ``start`` (none: just CRLF)."""
        if buffer.startswith(b"\r\n", start):
            return start + 2
        end = buffer.find(b"\r\n\r\n", start, start + TRAILER_BYTES)
        if end >= 0:
            return end + 4
        return INCOMPLETE if len(buffer) - start < TRAILER_BYTES else None


class Reader:
    """A connection's socket as Gunicorn's request parser reads it on a thread.

    Each ``recv`` waits at most until ``deadline`` (``time.monotonic()``; None: no limit),
    and a read that has to wait for the client uncounts the request from ``arrivals``
    until bytes come (a batch cannot know when a slow client will be done). While the
    head is read (``in_head``: one longer than the main loop reads), the deadline is the
    head's, and a read past it returns the end of the stream: the parser then gives up
    on the connection quietly, as on a client that went away.

    :raises TimeoutError: from ``recv`` at or past the deadline, once the head is read
        (``expired`` is then True: the rest of the body will not be read, so the
        connection closes).
    """

    __slots__ = ("arrivals", "deadline", "expired", "in_head", "sock")

    def __init__(self, sock: socket.socket, arrivals: Arrivals | None) -> None:
        self.sock, self.arrivals = sock, arrivals
        self.deadline: float | None = None
        self.in_head = False
        self.expired = False

    def recv(self, size: int) -> bytes:
        arrivals = self.arrivals
        waits = not _has_bytes(self.sock)
        if waits and arrivals is not None:
            arrivals.leave()  # waiting for the client
        if self.deadline is None:
            data = self.sock.recv(size)
        elif self.in_head:
            try:
                data = self._recv_by_deadline(size, self.deadline)
            except TimeoutError:
                return b""  # the head's deadline: as if the client had gone
        else:
            data = self._recv_by_deadline(size, self.deadline)
        if waits and data and arrivals is not None:
            arrivals.enter()
        return data

    def _recv_by_deadline(self, size: int, deadline: float) -> bytes:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            self.expired = True
            raise TimeoutError("request: deadline passed")
        previous = self.sock.gettimeout()  # the send limit (ServingWorker.handle_request)
        self.sock.settimeout(remaining)
        try:
            return self.sock.recv(size)
        except TimeoutError:
            self.expired = True
            raise
        finally:
            self.sock.settimeout(previous)


class ServingConn(gthread.TConn):  # type: ignore[misc]
    """Gunicorn's gthread connection, with its head read on the main loop (``head``, the
    bytes read so far; ``deadline``, when the loop closes it unless they are complete) and
    its parser reading through a ``Reader``. HTTP/1.1 over TCP only: the worker refuses
    TLS and HTTP/2 at start (``ServingWorker.check_config``)."""

    initialized: bool
    parser: Any

    def __init__(self, cfg: Any, sock: socket.socket, client: Any, server: Any) -> None:
        super().__init__(cfg, sock, client, server)
        self.head = b""
        self.deadline = 0.0
        self.reader: Reader | None = None
        self.arrivals: Arrivals | None = None
        self.lingerer: Lingerer | None = None
        #: While the main loop reads the body too: where it ends in ``head``, and when
        #: the body is due (then a thread takes it anyway, to answer 408).
        self.body_end: int | None = None
        self.body_deadline: float | None = None
        #: A chunked body the main loop reads, and the bytes of the worker's budget this
        #: connection's buffer holds (its whole length, or what came so far of a chunked
        #: body).
        self.chunked: ChunkedBody | None = None
        self.reserved = 0
        #: Its chunked body declared more than the limit (``serving.context.BODY_OVER_LIMIT``).
        self.body_over_limit = False

    def init(self) -> None:
        """On the thread, before the parser reads: the parser on a ``Reader`` (once), the
        head's deadline on it (until ``ServingWorker.handle_request`` sets the body's),
        and the head the main loop read given to it."""
        if not self.initialized:
            self.initialized = True
            self.sock.setblocking(True)
            self.reader = Reader(self.sock, self.arrivals)
            self.parser = http.get_parser(self.cfg, self.reader, self.client)
        assert self.reader is not None
        self.reader.deadline, self.reader.in_head = self.deadline, True
        if self.head:
            self.parser.unreader.unread(self.head)
            self.head = b""

    def close(self, graceful: bool = False) -> None:
        """Close; a graceful close lingers in ``lingerer``'s thread, not on the caller's."""
        if graceful and self.lingerer is not None:
            self.lingerer.close(self.sock)
        else:
            super().close(graceful)

    def take_read_ahead(self) -> None:
        """Move what the parser read past the last request (a pipelined request, read with
        the previous body) back into ``head``, for the main loop to complete."""
        if self.parser is not None:
            self.head = self.parser.unreader.take_buffered() + self.head


def _has_bytes(sock: Any) -> bool:
    """Whether a read of ``sock`` would return at once (bytes, or the end of the stream,
    are there). True when it cannot tell (a closed socket, whose read fails at once)."""
    try:
        poll = select.poll()
        poll.register(sock, select.POLLIN)
        return bool(poll.poll(0))
    except (OSError, ValueError):
        return True
