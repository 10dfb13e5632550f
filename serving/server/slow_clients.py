"""Bound the header phase of a request in a Gunicorn gthread worker.

A gthread worker hands a connection to one of its threads as soon as bytes arrive, and the
thread then reads the request line and headers with blocking reads and no time limit: a
client that sends ``GET / HTTP/1.1\\r\\n`` and stops holds that thread forever. Measured
here: 400 such sockets against 2 workers and ``/livez`` stopped answering (Gunicorn 27 has
no header timeout setting). ``limit_header_phase`` wraps the worker's ``handle`` (one
request on a connection, from its first byte) and ``handle_request`` (headers parsed): a
reaper thread shuts down the socket of a connection still in between after
``header_timeout_s`` seconds, so the blocked read returns end-of-file and the thread is
free (Gunicorn logs it at debug level as a premature disconnection). The time counts from
the accept, so connections queued for a thread behind slow ones expire too. The body
phase is not covered here: the request path reads the body against ``SERVING_REQUEST_TIMEOUT_MS``.

Imports only the standard library and, when called, Gunicorn's gthread worker module.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any

__all__ = ["limit_header_phase"]


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
        if deadline < time.monotonic():  # waited for a thread past its time: close now
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
