"""``HeadReadingWorker``: Gunicorn's gthread worker with requests read on its main loop.

gthread hands a connection to a request thread as soon as it is accepted or readable, and
the thread then waits for the request line and headers with blocking reads: idle and
trickling connections hold threads (70 idle connections took ``/livez`` to 5 s on a worker
of 64 threads). Here the main loop reads a connection's head itself, non-blocking
(``serving.server.connection``), and hands the connection to the thread pool only once the
head is complete; it closes one whose head is not complete ``header_timeout_s`` after its
accept (or after the first byte of a kept-alive connection's next request), or that sends
nothing for Gunicorn's ``keepalive`` after an answer.

A body with one ``Content-Length`` (at most ``body_buffer_bytes``, and
``BODY_BUFFER_BUDGET`` for all of a worker's), or chunked (its chunks followed as they
come, ``serving.server.connection.ChunkedBody``, within the same limits), is read on the
main loop too, by the body deadline: a trickling body holds no thread either; one late,
or cut short by the client, goes to a thread, which answers it (408, 400), and so does
one malformed or over the limit (400, 413). One sent after ``Expect: 100-continue`` is
read on the main loop too, which answers the ``100 Continue`` itself.

A stopping worker keeps idle connections ``STOP_LINGER_S`` at most, for a request a
client may already be sending, and waits as long for a body the main loop is reading
(then 408). Out of file descriptors, it pauses accepting for
``ACCEPT_PAUSE_S`` (as nginx does) instead of ending the worker.
``serving.server.worker.ServingWorker`` derives from it.

Imports only the standard library, this folder and Gunicorn.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import time
from dataclasses import dataclass
from functools import partial
from typing import Any

from gunicorn.workers import gthread  # type: ignore[import-untyped]

from serving.batching.arrivals import Arrivals
from serving.server.connection import (
    CONTINUE,
    HEAD_READ_BYTES,
    INCOMPLETE,
    ChunkedBody,
    ServingConn,
    body_end,
    chunked_start,
    head_complete,
    without_expect_continue,
)
from serving.server.lingering import Lingerer

__all__ = ["ConnectionLimits", "HeadReadingWorker"]

#: How long a stopping worker keeps a connection that has sent nothing since its last
#: answer, for a request its client may already be sending (answered ``Connection: close``).
STOP_LINGER_S = 2.0
#: How often the main loop looks for connections past their deadline, in seconds.
SWEEP_INTERVAL_S = 0.1
#: How long accepting pauses when the process is out of file descriptors, in seconds.
ACCEPT_PAUSE_S = 0.5
#: Most bytes of bodies a worker's main loop holds at once; a body that would pass it
#: goes to a thread with its head, read there (by the same deadline).
BODY_BUFFER_BUDGET = 64 * 1024 * 1024
#: Most bytes of a body read from a socket at once on the main loop.
BODY_READ_BYTES = 1024 * 1024
#: Most bytes of chunked framing (size lines, CRLFs, trailers) the main loop reads beside
#: a chunked body's data; a body framed in more goes to a thread.
CHUNK_FRAMING_BYTES = 64 * 1024


@dataclass(frozen=True)
class ConnectionLimits:
    """What ``ServingWorker`` bounds, in seconds: ``header_timeout_s`` for a request line
    and headers (``SERVING_HEADER_TIMEOUT_S``) and for a client not reading its answer;
    ``body_timeout_s`` for a body, from its headers (``SERVING_REQUEST_TIMEOUT_MS``)."""

    header_timeout_s: float
    body_timeout_s: float
    #: Largest body the main loop reads before a thread takes the request
    #: (``SERVING_MAX_BODY_BYTES``); 0: none.
    body_buffer_bytes: int = 0


class HeadReadingWorker(gthread.ThreadWorker):  # type: ignore[misc]
    """Gunicorn's ``ThreadWorker`` whose main loop reads request heads (see the module
    docstring); ``limits`` and ``arrivals`` are set before ``init_process``."""

    alive: bool
    nr_conns: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits: ConnectionLimits | None = None
        self.arrivals: Arrivals | None = None
        #: Connections on the main loop (reading a head, or idle; each has its deadline).
        self.heads: set[ServingConn] = set()
        self._swept_at = 0.0
        self._stop_capped = False
        self._accept_paused_until = 0.0
        self._lingerer = Lingerer()
        self._body_bytes = 0  # reserved for bodies the main loop is reading

    def idle_connections(self) -> int:
        """Connections on the main loop (no request of theirs on a thread)."""
        return len(self.heads)

    def set_accept_enabled(self, enabled: bool) -> None:
        if enabled and time.monotonic() < self._accept_paused_until:
            return
        super().set_accept_enabled(enabled)

    def accept(self, listener: socket.socket) -> None:
        self._accept_one(listener)

    def _accept_one(self, listener: socket.socket) -> bool:
        """Accept one connection from ``listener`` (non-blocking) and start reading its
        head; False when none was waiting (or none could be accepted)."""
        assert self.limits is not None
        try:
            client, address = listener.accept()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                self._pause_accepting(exc)
            elif exc.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return exc.errno == errno.ECONNABORTED  # that one is gone; others may wait
        self.nr_conns += 1
        conn = ServingConn(self.cfg, client, address, listener.getsockname())
        conn.arrivals, conn.lingerer = self.arrivals, self._lingerer
        conn.deadline = time.monotonic() + self.limits.header_timeout_s
        self._read_head(conn, registered=False)
        return True

    def _pause_accepting(self, exc: OSError) -> None:
        self.log.warning(
            "serving: cannot accept a connection (%s); pausing accepting for %g s",
            exc.strerror, ACCEPT_PAUSE_S,
        )  # fmt: skip
        self._accept_paused_until = time.monotonic() + ACCEPT_PAUSE_S
        self.set_accept_enabled(False)

    def _read_head(self, conn: ServingConn, registered: bool = True) -> None:
        """Read what the client sent of its head; hand the connection to a thread once it
        is complete, close it at the end of its stream, else wait in the poller."""
        assert self.limits is not None
        size = HEAD_READ_BYTES
        if conn.body_end is not None:
            size = min(BODY_READ_BYTES, conn.body_end - len(conn.head))
        try:
            data = conn.sock.recv(size)
        except (BlockingIOError, InterruptedError):
            if not registered:
                self._watch(conn)
            return
        except OSError:
            data = b""
        if not data and conn.body_end is not None:
            # The client half-closed before its whole body (or reset): a thread answers
            # what it sent (400 unreadable_body, as its read meets the end too).
            self._forget(conn, registered)
            conn.data_ready = True
            self.enqueue_req(conn)
            return
        if not data:  # the client closed (or reset) it
            self._forget(conn, registered)
            self.nr_conns -= 1
            conn.close()
            return
        if not conn.head and conn.initialized:  # a kept-alive one's next request begins
            conn.deadline = time.monotonic() + self.limits.header_timeout_s
        if conn.body_end is not None and time.monotonic() >= conn.deadline:
            # The rest of its body came after its deadline: a thread answers it 408 (its
            # read of the body, past the deadline, fails at once); these bytes are
            # dropped with the connection, which closes after the 408.
            self._forget(conn, registered)
            conn.data_ready = True
            self.enqueue_req(conn)
            return
        searched = len(conn.head)
        conn.head += data
        if self._complete(conn, searched):
            self._forget(conn, registered)
            conn.data_ready = True
            self.enqueue_req(conn)
        elif not registered:
            self._watch(conn)

    def _complete(self, conn: ServingConn, searched: int = 0) -> bool:
        """Whether ``conn``'s request is read as far as the main loop reads it: its head,
        and its body too when it has a ``Content-Length`` within the limit and the budget
        (``body_end``), or is chunked (``chunked_start``: read while its chunks stay
        within the limit and the budget), so that a client trickling its body holds no
        thread either. A body still to come gets the body deadline
        (``SERVING_REQUEST_TIMEOUT_MS``)."""
        assert self.limits is not None
        if conn.chunked is not None:
            return self._chunked_complete(conn)
        if conn.body_end is not None:
            return len(conn.head) >= conn.body_end
        if not head_complete(conn.head, searched):
            return False
        return self._start_body(conn)

    def _start_body(self, conn: ServingConn) -> bool:
        """With ``conn``'s head complete: whether the thread takes it now, or (False) the
        main loop reads its body first, by the body deadline."""
        assert self.limits is not None
        most = self.limits.body_buffer_bytes
        self._answer_expectation(conn, most)
        end = body_end(conn.head, most)
        start = chunked_start(conn.head) if end is None and most else None
        if start is not None:
            conn.chunked = ChunkedBody(start, most)
            # the most it reads: the data allowed, with its framing (a size line a chunk)
            conn.body_end = start + most + CHUNK_FRAMING_BYTES
            conn.body_deadline = conn.deadline = time.monotonic() + self.limits.body_timeout_s
            done = self._chunked_complete(conn)
            if done:  # all here already: nothing read on (a pipelined one's state stays)
                self._release(conn)
            return done
        if end is None or len(conn.head) >= end or self._body_bytes + end > BODY_BUFFER_BUDGET:
            return True  # no body, all of it here, or over the budget: read on the thread
        self._body_bytes += end
        conn.reserved = end
        conn.body_end = end
        conn.body_deadline = conn.deadline = time.monotonic() + self.limits.body_timeout_s
        return False

    def _answer_expectation(self, conn: ServingConn, most: int) -> None:
        """A body sent only once answered (``Expect: 100-continue``) that the main loop
        may read: answer ``100 Continue`` here and drop the expectation from the head (the
        thread's parser sends no second one), so the body is read here like any other.
        The attack held every thread with such requests and no body (``/livez`` 9.5 s)."""
        stripped = without_expect_continue(conn.head)
        if stripped is None or body_end(stripped, most) is None:
            return
        if len(stripped) == stripped.find(b"\r\n\r\n") + 4:  # the client waits for it
            try:
                conn.sock.send(CONTINUE)  # 25 bytes: a new connection's send buffer is empty
            except OSError:
                return  # the thread answers it, as Gunicorn does
        conn.head = stripped

    def _chunked_complete(self, conn: ServingConn) -> bool:
        """Whether the main loop is done with ``conn``'s chunked body: it ended, cannot be
        read here (malformed, over the limit: the thread answers 400, 413), or would pass
        the budget or the bytes it may read (the thread reads on)."""
        assert conn.chunked is not None and conn.body_end is not None
        grown = len(conn.head) - conn.reserved
        if self._body_bytes + grown > BODY_BUFFER_BUDGET:
            return True
        self._body_bytes += grown
        conn.reserved = len(conn.head)
        if conn.chunked.end(conn.head) != INCOMPLETE:
            return True
        return len(conn.head) >= conn.body_end

    def _watch(self, conn: ServingConn) -> None:
        self.heads.add(conn)
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._readable, conn))

    def _readable(self, conn: ServingConn, _sock: Any) -> None:
        self._read_head(conn)

    def _release(self, conn: ServingConn) -> None:
        """The main loop is done with ``conn``'s body: its budget back (its
        ``body_deadline`` stays, for the thread)."""
        if conn.body_end is not None:
            self._body_bytes -= conn.reserved
            conn.reserved = 0
            conn.body_over_limit = conn.chunked is not None and conn.chunked.over_limit
            conn.body_end = conn.chunked = None

    def _forget(self, conn: ServingConn, registered: bool) -> None:
        self._release(conn)
        if registered:
            self.heads.discard(conn)
            with contextlib.suppress(KeyError, ValueError, OSError):
                self.poller.unregister(conn.sock)

    def murder_pending(self) -> None:
        super().murder_pending()
        now = time.monotonic()
        if not self.alive and not self._stop_capped:
            # idle connections: a short linger for a request; bodies still arriving: as
            # long, then their 408 (they held the exit for the whole request deadline)
            self._stop_capped = True
            for conn in self.heads:
                if not conn.head or conn.body_end is not None:
                    conn.deadline = min(conn.deadline, now + STOP_LINGER_S)
                if conn.body_deadline is not None:
                    conn.body_deadline = min(conn.body_deadline, now + STOP_LINGER_S)
        if now - self._swept_at < SWEEP_INTERVAL_S:
            return
        self._swept_at = now
        for conn in [c for c in self.heads if c.deadline <= now]:
            reading_body = conn.body_end is not None
            self._forget(conn, registered=True)
            if reading_body:  # its body is late: a thread answers it 408
                conn.data_ready = True
                self.enqueue_req(conn)
                continue
            self.nr_conns -= 1
            conn.close()

    def finish_request(self, conn: ServingConn, fs: Any) -> None:
        assert self.limits is not None
        try:
            keepalive = fs.result() if not fs.cancelled() else False
            if not keepalive:
                self.nr_conns -= 1
                conn.close(graceful=True)
                return
            conn.take_read_ahead()
            conn.sock.setblocking(False)
            now = time.monotonic()
            if conn.head:  # the next request began with the last one's body
                conn.deadline = now + self.limits.header_timeout_s
                if self._complete(conn):
                    conn.data_ready = True
                    self.enqueue_req(conn)
                    return
            else:
                linger = (
                    self.cfg.keepalive if self.alive else min(self.cfg.keepalive, STOP_LINGER_S)
                )
                conn.deadline = now + linger
            self._read_head(conn, registered=False)
        except Exception:
            self.nr_conns -= 1
            conn.close()
