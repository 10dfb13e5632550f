"""``HeadReadingWorker``: Gunicorn's gthread worker with request heads read on its main loop.

gthread hands a connection to a request thread as soon as it is accepted or readable, and
the thread then waits for the request line and headers with blocking reads: idle and
trickling connections hold threads (70 idle connections took ``/livez`` to 5 s on a worker
of 64 threads). Here the main loop reads a connection's head itself, non-blocking
(``serving.server.connection``), and hands the connection to the thread pool only once the
head is complete; it closes one whose head is not complete ``header_timeout_s`` after its
accept (or after the first byte of a kept-alive connection's next request), or that sends
nothing for Gunicorn's ``keepalive`` after an answer. A stopping worker keeps idle
connections ``STOP_LINGER_S`` at most, for a request a client may already be sending.
Out of file descriptors, it pauses accepting for ``ACCEPT_PAUSE_S`` (as nginx does)
instead of ending the worker. ``serving.server.worker.ServingWorker`` derives from it.

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
from serving.server.connection import HEAD_READ_BYTES, ServingConn, head_complete
from serving.server.lingering import Lingerer

__all__ = ["ConnectionLimits", "HeadReadingWorker"]

#: How long a stopping worker keeps a connection that has sent nothing since its last
#: answer, for a request its client may already be sending (answered ``Connection: close``).
STOP_LINGER_S = 2.0
#: How often the main loop looks for connections past their deadline, in seconds.
SWEEP_INTERVAL_S = 0.1
#: How long accepting pauses when the process is out of file descriptors, in seconds.
ACCEPT_PAUSE_S = 0.5


@dataclass(frozen=True)
class ConnectionLimits:
    """What ``ServingWorker`` bounds, in seconds: ``header_timeout_s`` for a request line
    and headers (``SERVING_HEADER_TIMEOUT_S``) and for a client not reading its answer;
    ``body_timeout_s`` for a body, from its headers (``SERVING_REQUEST_TIMEOUT_MS``)."""

    header_timeout_s: float
    body_timeout_s: float


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
        try:
            data = conn.sock.recv(HEAD_READ_BYTES)
        except (BlockingIOError, InterruptedError):
            if not registered:
                self._watch(conn)
            return
        except OSError:
            data = b""
        if not data:  # the client closed (or reset) it
            self._forget(conn, registered)
            self.nr_conns -= 1
            conn.close()
            return
        if not conn.head and conn.initialized:  # a kept-alive one's next request begins
            conn.deadline = time.monotonic() + self.limits.header_timeout_s
        searched = len(conn.head)
        conn.head += data
        if head_complete(conn.head, searched):
            self._forget(conn, registered)
            conn.data_ready = True
            self.enqueue_req(conn)
        elif not registered:
            self._watch(conn)

    def _watch(self, conn: ServingConn) -> None:
        self.heads.add(conn)
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._readable, conn))

    def _readable(self, conn: ServingConn, _sock: Any) -> None:
        self._read_head(conn)

    def _forget(self, conn: ServingConn, registered: bool) -> None:
        if registered:
            self.heads.discard(conn)
            with contextlib.suppress(KeyError, ValueError, OSError):
                self.poller.unregister(conn.sock)

    def murder_pending(self) -> None:
        super().murder_pending()
        now = time.monotonic()
        if not self.alive and not self._stop_capped:
            self._stop_capped = True  # idle connections: a short linger for a request
            for conn in self.heads:
                if not conn.head:
                    conn.deadline = min(conn.deadline, now + STOP_LINGER_S)
        if now - self._swept_at < SWEEP_INTERVAL_S:
            return
        self._swept_at = now
        for conn in [c for c in self.heads if c.deadline <= now]:
            self._forget(conn, registered=True)
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
                if head_complete(conn.head):
                    conn.data_ready = True
                    self.enqueue_req(conn)
                    return
                conn.deadline = now + self.limits.header_timeout_s
            else:
                linger = (
                    self.cfg.keepalive if self.alive else min(self.cfg.keepalive, STOP_LINGER_S)
                )
                conn.deadline = now + linger
            self._read_head(conn, registered=False)
        except Exception:
            self.nr_conns -= 1
            conn.close()
