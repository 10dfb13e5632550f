"""Bound the header and body phases of a request in a Gunicorn gthread worker.

A gthread worker hands a connection to one of its threads as soon as bytes arrive, and the
thread then reads the request line, the headers and (through the application) the body
with blocking reads and no time limit: a client that sends ``GET / HTTP/1.1\\r\\n`` and
stops, or headers with ``Content-Length: 100`` and 6 bytes of body, holds that thread
forever. Measured here: 400 such sockets against 2 workers and ``/livez`` stopped
answering; so did 128 stalled bodies against one worker of 64 threads, for good (Gunicorn
27 has no header or body timeout setting).

``limit_header_phase`` wraps the worker's ``handle`` (one request on a connection, from
its first byte) and ``handle_request`` (headers parsed): a reaper thread shuts down the
socket of a connection still in between after ``header_timeout_s`` seconds, so the blocked
read returns end-of-file and the thread is free (Gunicorn logs it at debug level as a
premature disconnection). The time counts from the accept, so connections queued for a
thread behind slow ones expire too, unless their headers have all arrived (peeked): a
whole request that waited for a thread is answered, not closed.

``limit_body_phase`` wraps ``handle_request``: while the application runs, every read of
the request body from the socket waits at most until ``body_timeout_s`` seconds after the
headers (``SERVING_REQUEST_TIMEOUT_MS``, the deadline the request path answers by). A read
past it raises ``TimeoutError``, which ``serving.protocols.base.read_body`` answers with
408 ``request_timeout``; Gunicorn then closes the connection (a body read that failed
leaves no place for the next request to start), and the thread is free. A body the
application did not read is drained by the same deadline before the next request.

``close_gracefully_off_the_main_loop`` moves Gunicorn's graceful close of a connection
(``Connection: close``, RFC 9112 section 9.6: half-close, then read until the client
closes, for at most 2 s) from the worker's main loop, which accepts nothing meanwhile, to
one daemon thread that lingers on every such socket at once: 10 clients that never
closed stopped a worker for 20 s, and 100 stalled bodies answered 408 for 200 s.

Imports only the standard library and, when called, Gunicorn's gthread worker module.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import queue
import selectors
import socket
import threading
import time
from typing import Any

__all__ = ["close_gracefully_off_the_main_loop", "limit_body_phase", "limit_header_phase"]

log = logging.getLogger(__name__)


def limit_header_phase(worker: Any, header_timeout_s: float, interval_s: float = 0.5) -> None:
    """Close connections of ``worker`` (a gthread worker, before ``init_process``) whose
    request line and headers take longer than ``header_timeout_s`` seconds to arrive."""
    from gunicorn.workers import gthread  # type: ignore[import-untyped]

    handle, handle_request = worker.handle, worker.handle_request
    reading: dict[Any, float] = {}
    lock = threading.Lock()
    connection_init = gthread.TConn.__init__

    def accepted(conn: Any, *args: Any, **kwargs: Any) -> None:
        connection_init(conn, *args, **kwargs)
        conn.serving_accepted_at = time.monotonic()  # a queued connection's time counts

    gthread.TConn.__init__ = accepted  # this worker process only (after fork)

    def timed_handle(conn: Any) -> Any:
        started = conn.__dict__.pop("serving_accepted_at", None) or time.monotonic()
        deadline = started + header_timeout_s
        now = time.monotonic()
        if deadline < now:  # waited for a thread past its time
            if _headers_arrived(conn.sock):  # the client was on time, the server was not
                deadline = now + header_timeout_s
            else:  # close now
                with contextlib.suppress(OSError):
                    conn.sock.shutdown(socket.SHUT_RDWR)
        with lock:
            reading[conn] = deadline
        try:
            return handle(conn)
        finally:
            with lock:
                reading.pop(conn, None)

    def headers_done(req: Any, conn: Any) -> Any:
        with lock:
            reading.pop(conn, None)
        return handle_request(req, conn)

    def reap() -> None:
        while True:
            time.sleep(interval_s)
            now = time.monotonic()
            with lock:
                late = [conn for conn, deadline in reading.items() if deadline < now]
                for conn in late:
                    del reading[conn]
            for conn in late:
                with contextlib.suppress(OSError):  # already closed
                    conn.sock.shutdown(socket.SHUT_RDWR)

    worker.handle, worker.handle_request = timed_handle, headers_done
    threading.Thread(target=reap, name="serving-header-timeout", daemon=True).start()


def _headers_arrived(sock: socket.socket, most_bytes: int = 65536) -> bool:
    """Whether a connection's request line and headers are all in its receive buffer
    (peeked, not read; within its first ``most_bytes`` bytes): such a request queued for a
    thread past the header timeout is served, as the client sent it in time."""
    try:
        waiting = sock.recv(most_bytes, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (OSError, ValueError):  # nothing yet, reset, or a TLS socket (no peeking)
        return False
    return b"\r\n\r\n" in waiting


class _BodyDeadline:
    """A connection's socket as Gunicorn's request parser reads it while the application
    reads the body: each ``recv`` waits at most until ``deadline`` (``time.monotonic()``).

    :raises TimeoutError: from ``recv`` at or past the deadline (then ``expired`` is True:
        the rest of the body will not be read, so the connection closes).
    """

    def __init__(self, sock: Any, deadline: float) -> None:
        self.sock, self.deadline = sock, deadline
        self.expired = False

    def recv(self, size: int) -> bytes:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            self.expired = True
            raise TimeoutError("request body: deadline passed")
        previous = self.sock.gettimeout()  # the send limit (limit_body_phase)
        self.sock.settimeout(remaining)
        try:
            data: bytes = self.sock.recv(size)
            return data
        except TimeoutError:
            self.expired = True
            raise
        finally:
            self.sock.settimeout(previous)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


def limit_body_phase(worker: Any, body_timeout_s: float, send_timeout_s: float) -> None:
    """Make every request body read of ``worker`` (a gthread worker, before
    ``init_process``) end with ``TimeoutError`` once ``body_timeout_s`` seconds have passed
    since its headers were parsed, and every response write give up after
    ``send_timeout_s`` seconds (``SERVING_HEADER_TIMEOUT_S``) of a client not reading it:
    a client that never reads held a worker thread for good (70 of them stopped ``/livez``,
    found by the attack on this branch); its connection is closed, one log line. Does
    nothing to a connection whose parser does not read through ``parser.unreader.sock``
    (Gunicorn's HTTP/1 parser does)."""
    from gunicorn.http import parser  # type: ignore[import-untyped]

    handle_request = worker.handle_request
    drain_bytes: int = getattr(parser, "_DRAIN_MAX_BYTES", 64 * 1024)

    def with_body_deadline(req: Any, conn: Any) -> Any:
        unreader: Any = getattr(getattr(conn, "parser", None), "unreader", None)
        sock: Any = getattr(unreader, "sock", None)
        if not hasattr(sock, "recv") or not hasattr(sock, "settimeout"):
            return handle_request(req, conn)
        deadline = time.monotonic() + body_timeout_s
        unreader.sock = body = _BodyDeadline(sock, deadline)
        _close_when_left_undrained(req, drain_bytes, body)
        previous = sock.gettimeout()
        sock.settimeout(send_timeout_s)
        try:
            keepalive = handle_request(req, conn)
            # A body the application left unread is drained before the next request, by
            # the same deadline: Gunicorn's own drain waits for each 1 KiB in full, so a
            # client trickling it held the thread for as long as it went on.
            if keepalive and hasattr(conn.parser, "finish_body"):
                return conn.parser.finish_body(deadline=deadline)
            return keepalive
        except TimeoutError:  # the body's own deadline is answered 408 inside the app
            log.info(
                "closing a connection whose client has not read its response for %g s "
                "(SERVING_HEADER_TIMEOUT_S)", send_timeout_s,
            )  # fmt: skip
            # Gunicorn closes a reset connection quietly; a timeout got a traceback.
            raise ConnectionResetError(errno.ECONNRESET, "client not reading") from None
        finally:
            unreader.sock = sock
            sock.settimeout(previous)

    worker.handle_request = with_body_deadline


def _close_when_left_undrained(req: Any, drain_bytes: int, body: _BodyDeadline) -> None:
    """Make ``req`` (a Gunicorn request whose body has a Content-Length) say it closes its
    connection when, as its response starts, ``drain_bytes`` or more of its body are
    unread: Gunicorn drains at most that much before the next request (``finish_body``)
    and then closes the connection, so the response must say ``Connection: close`` (RFC
    9112 section 9.6), or the client sends its next request on a connection about to
    close and loses it. A chunked body's unread length is unknown: one not read to its
    end closes the connection. So does a body whose read passed its deadline (``body``
    expired: the 408), whatever is left of it."""
    reader: Any = getattr(getattr(req, "body", None), "reader", None)
    should_close = getattr(req, "should_close", None)
    if isinstance(getattr(reader, "length", None), int):  # Content-Length

        def left_undrained() -> bool:
            return bool(reader.length >= drain_bytes)

    elif hasattr(reader, "parser"):  # chunked: its parser is None once at the end

        def left_undrained() -> bool:
            return reader.parser is not None

    else:
        return
    if not callable(should_close):
        return

    def or_left_undrained() -> bool:
        return bool(should_close()) or body.expired or left_undrained()

    req.should_close = or_left_undrained


class _Lingerer:
    """Closes half-closed sockets once their client closes, it has sent ``max_drain_bytes``
    more, or ``linger_s`` seconds have passed, for many sockets in one daemon thread."""

    def __init__(self, linger_s: float = 2.0, max_drain_bytes: int = 65536) -> None:
        self.linger_s, self.max_drain_bytes = linger_s, max_drain_bytes
        self._incoming: queue.SimpleQueue[tuple[socket.socket, float]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def close(self, sock: socket.socket) -> None:
        """Half-close ``sock`` now (the client sees the end of the response) and close it
        fully later, in the lingering thread."""
        try:
            sock.shutdown(socket.SHUT_WR)
            sock.setblocking(False)
        except OSError:
            sock.close()
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="serving-linger", daemon=True)
            self._thread.start()
        self._incoming.put((sock, time.monotonic() + self.linger_s))

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        lingering: dict[socket.socket, list[float]] = {}  # sock -> [deadline, bytes drained]

        def done(sock: socket.socket) -> None:
            del lingering[sock]
            selector.unregister(sock)
            sock.close()

        while True:
            try:
                block = not lingering
                while True:
                    sock, deadline = self._incoming.get(block=block)
                    block = False
                    lingering[sock] = [deadline, 0]
                    selector.register(sock, selectors.EVENT_READ)
            except queue.Empty:
                pass
            for key, _ in selector.select(timeout=0.05):
                readable: Any = key.fileobj
                try:
                    data = readable.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                lingering[readable][1] += len(data)
                if not data or lingering[readable][1] >= self.max_drain_bytes:
                    done(readable)
            now = time.monotonic()
            for sock in [s for s, (deadline, _) in lingering.items() if deadline <= now]:
                done(sock)


def close_gracefully_off_the_main_loop(linger_s: float = 2.0) -> bool:
    """Make Gunicorn's gthread connections (in this worker process, after fork) linger in
    a ``_Lingerer`` thread when closed gracefully. False, changing nothing, when this
    Gunicorn's ``TConn.close`` has no graceful close to move."""
    from gunicorn import util  # type: ignore[import-untyped]
    from gunicorn.workers import gthread

    if not hasattr(util, "close_graceful"):
        return False
    close = gthread.TConn.close
    lingerer = _Lingerer(linger_s)

    def close_later(conn: Any, graceful: bool = False) -> None:
        if not graceful:
            close(conn)
            return
        lingerer.close(conn.sock)

    gthread.TConn.close = close_later
    return True
