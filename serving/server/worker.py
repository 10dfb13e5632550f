"""``ServingWorker``: our Gunicorn worker, a subclass of Gunicorn's gthread ``ThreadWorker``.

Every protection a connection gets is a method here, each overriding one of
``ThreadWorker``'s (or ``base.Worker``'s), and what wraps what is this one list, from the
socket inwards:

1. ``accept``, ``murder_pending``, ``finish_request`` (in ``HeadReadingWorker``, the class
   it derives from: ``serving.server.heads``): **whole requests before threads.** The
   main loop reads a request's head, and its body when it has a Content-Length, itself,
   non-blocking (``serving.server.connection``), and hands the connection to a thread
   only then; it closes one whose head is not complete ``SERVING_HEADER_TIMEOUT_S``
   after its accept (or its first byte after a keep-alive answer), or that stays idle
   past Gunicorn's ``keepalive``. Idle and trickling connections hold no thread (gthread
   hands a connection to a thread at its first byte: 70 idle connections took ``/livez``
   to 5 s). Out of file descriptors, it pauses accepting for half a second (as nginx
   does) instead of ending the worker.
2. ``enqueue_req``, ``handle``: each request counted on its way to a batcher
   (``serving.batching.arrivals``) from its hand-over to the thread pool; the connection's
   ``Reader`` uncounts it while its body waits for the client.
3. ``handle_request``: Gunicorn's, with each body read bounded by
   ``SERVING_REQUEST_TIMEOUT_MS`` after the headers (408 from the app) and the drain of an
   unread body by the same deadline, each write by ``SERVING_HEADER_TIMEOUT_S`` of a
   client not reading (then the connection is closed), and the response a
   ``ServingResponse`` (``serving.server.response``: headers and body in one write,
   ``Connection: close`` when the body is left undrained, when the application asked
   for it (``serving.context.CLOSE_CONNECTION``), or when the worker was told to stop
   while it answered: its next request on that connection would meet a worker on its
   way out, serving what it served).
4. ``handle_error``: a response Gunicorn writes itself (a malformed request line, 431, a
   500 for an exception outside the app) counted in ``http_requests_total`` and the access
   log like the app's own answers, route ``(gunicorn)``.
5. ``ServingConn.close``: a graceful close (``Connection: close``: half-close, then read
   until the client closes, up to 2 s) lingers in one thread (``lingering.Lingerer``),
   not on the main loop, which accepts nothing meanwhile.
6. ``set_accept_enabled``, ``is_parent_alive``: a stopping worker closes its listening
   sockets as it stops accepting, so new clients are refused, not reset at its exit (when
   the whole server stops, the connections already in the kernel's backlog are accepted
   and answered first); a
   worker whose master is gone (SIGKILL) stops as if told to: no accepting, every answer
   ``Connection: close``, out within the graceful timeout.
7. ``notify``: the heartbeat file written at most once a second (``heartbeat``), not on
   every wake of the main loop.

``check_config`` (the master, at start) refuses what this worker does not serve (TLS and
HTTP/2 inside Gunicorn, the uWSGI protocol) and a Gunicorn lacking a method or argument the
list above overrides, with one line naming it. ``post_fork`` gives the worker its limits
(``guard``) before ``init_process``.

Imports only the standard library, ``serving.batching.arrivals``, this folder and Gunicorn
(``serving.observe``, for the count of Gunicorn's own answers, when one is written).
"""

from __future__ import annotations

import contextlib
import errno
import socket
import sys
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from gunicorn import util  # type: ignore[import-untyped]
from gunicorn.http import wsgi  # type: ignore[import-untyped]

from serving.batching.arrivals import Arrivals
from serving.context import BODY_OVER_LIMIT, CLOSE_CONNECTION
from serving.server.arrivals import ready_in_poller
from serving.server.connection import ServingConn
from serving.server.heads import ConnectionLimits, HeadReadingWorker
from serving.server.heartbeat import Heartbeat
from serving.server.response import GunicornAnswer, ServingResponse, json_answer
from serving.server.seams import (
    missing_seam,
    raise_open_files_limit,
    refuse_new_connections,
    unserved,
)

__all__ = ["ConnectionLimits", "ServingWorker"]

#: Most connections a worker takes from its listening socket's backlog as it closes it.
BACKLOG_DRAIN_MAX = 4096


class ServingWorker(HeadReadingWorker):
    """The worker ``gunicorn.conf.py`` names (``worker_class``); see the module docstring.

    Usage (``serving.server.hooks.post_fork`` does this)::

        worker.guard(ConnectionLimits(header_timeout_s=10, body_timeout_s=30),
                     process_arrivals())
    """

    max_requests: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._server_stopping: Callable[[], bool] = lambda: False
        self._socket_shared: Callable[[], bool] = lambda: True
        self._orphaned = False  # its master is gone: it is the last to hold the socket
        self._heartbeat = Heartbeat(float(self.cfg.timeout))

    @classmethod
    def check_config(cls, cfg: Any, log: Any) -> None:
        super().check_config(cfg, log)
        problem = unserved(cfg) or missing_seam()
        if problem:
            log.error("serving: %s", problem)
            print(f"serving: {problem}", file=sys.stderr)
            raise SystemExit(1)

    def guard(
        self,
        limits: ConnectionLimits,
        arrivals: Arrivals,
        server_stopping: Callable[[], bool] = lambda: False,
        socket_shared: Callable[[], bool] = lambda: True,
    ) -> None:
        """Before ``init_process``: the limits this worker's connections get, the count
        of requests on their way to a batcher it keeps, whether the whole server is
        stopping (the master's ``SIGTERM``/``SIGINT``, not a reload or recycle of this
        worker alone: then the other workers keep the listening socket open) and whether
        another server may listen on the same socket (an upgrade's other generation)."""
        self.limits, self.arrivals, self._server_stopping = limits, arrivals, server_stopping
        self._socket_shared = socket_shared

    def recycle_by_hand(self) -> int | None:
        """Turn off Gunicorn's own exit after ``max_requests`` (each worker on its own, so
        two could leave in the same second) and return the limit, for
        ``serving.server.recycling`` to apply one worker at a time; None without one."""
        limit = int(self.max_requests)
        if limit >= sys.maxsize:
            return None
        self.max_requests = sys.maxsize
        return limit

    def init_process(self) -> None:
        if self.limits is None or self.arrivals is None:
            raise RuntimeError(
                "ServingWorker.guard() was not called (gunicorn.conf.py's post_fork)"
            )
        self.arrivals.waiting = ready_in_poller(self)
        raise_open_files_limit(self.worker_connections + 64)
        super().init_process()

    # 2. Requests counted on their way to a batcher ----------------------------------

    def enqueue_req(self, conn: ServingConn) -> None:
        assert self.arrivals is not None
        self.arrivals.hand()
        super().enqueue_req(conn)

    def handle(self, conn: ServingConn) -> Any:
        assert self.arrivals is not None
        self.arrivals.taken()
        self.arrivals.enter()  # its head is read: it is on its way
        try:
            return super().handle(conn)
        finally:
            self.arrivals.leave()

    # 3. One request, its body and its answer bounded --------------------------------

    def handle_request(self, req: Any, conn: ServingConn) -> bool:
        """Gunicorn's gthread ``handle_request``, with the body deadline, the send limit
        and ``ServingResponse`` (see the module docstring)."""
        assert self.limits is not None and conn.reader is not None
        reader, sock = conn.reader, conn.sock
        # The body's deadline: set when the main loop began reading it, else from now.
        deadline = conn.body_deadline or time.monotonic() + self.limits.body_timeout_s
        conn.body_deadline = None
        reader.deadline, reader.in_head = deadline, False
        sock.settimeout(self.limits.header_timeout_s)  # a client not reading its answer
        environ: dict[str, Any] = {}
        resp = None
        try:
            self.cfg.pre_request(self, req)
            resp, environ = wsgi.create(
                req, sock, conn.client, conn.server, self.cfg,
                response_class=ServingResponse, response_args=(reader,),
            )  # fmt: skip
            environ["wsgi.multithread"] = True
            if conn.body_over_limit:  # its chunks declared more: 413 without waiting
                environ[BODY_OVER_LIMIT], conn.body_over_limit = True, False
            self._count_request(resp)
            self._run_app(req, resp, environ)
            if resp.should_close():
                return False
            # A body the app left unread is drained by the same deadline (Gunicorn's own
            # drain waits 5 s per call, so a trickling client held the thread on).
            return bool(conn.parser.finish_body(deadline=deadline))
        except TimeoutError:  # a body's own deadline is answered 408 inside the app
            self.log.info(
                "closing a connection whose client has not read its response for %g s "
                "(SERVING_HEADER_TIMEOUT_S)", self.limits.header_timeout_s,
            )  # fmt: skip
            # Gunicorn closes a reset connection quietly; a timeout got a traceback.
            raise ConnectionResetError(errno.ECONNRESET, "client not reading") from None
        except OSError:
            raise
        except (Exception, SystemExit):
            if resp is not None and resp.headers_sent:
                # Writing a 500 on a started response would corrupt it: close instead.
                self.log.exception("Error handling request")
                util.close_graceful(sock)
                raise StopIteration() from None
            raise
        finally:
            reader.deadline = None
            try:
                self.cfg.post_request(self, req, environ, resp)
            except Exception:
                self.log.exception("Exception in post_request hook")

    def _count_request(self, resp: Any) -> None:
        """Count the request against ``max_requests``; decide whether its answer closes."""
        self.nr += 1
        if self.nr >= self.max_requests:
            if self.alive:
                self.log.info("Autorestarting worker after current request.")
                self.alive = False
            resp.force_close()
        if not self.alive or not self.cfg.keepalive or len(self.heads) >= self.max_keepalived:
            resp.force_close()

    def _run_app(self, req: Any, resp: Any, environ: dict[str, Any]) -> None:
        """Call the app and write its answer, logged in Gunicorn's access log."""
        request_start = datetime.now()
        respiter = self.wsgi(environ, resp.start_response)
        if environ.get(CLOSE_CONNECTION) or not self.alive:  # before the headers are written
            resp.force_close()  # asked for, or told to stop while it answered
        try:
            if isinstance(respiter, environ["wsgi.file_wrapper"]):
                resp.write_file(respiter)
            else:
                for item in respiter:
                    resp.write(item)
            resp.close()
        finally:
            self.log.access(resp, req, environ, datetime.now() - request_start)
            if hasattr(respiter, "close"):
                respiter.close()

    # 4. Gunicorn's own answers counted ----------------------------------------------

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        answer = GunicornAnswer(client)
        started = time.perf_counter()
        super().handle_error(req, answer, addr, exc)
        if answer.status:
            from serving.context import new_request_id

            request_id = new_request_id()
            with contextlib.suppress(OSError):
                util.write_nonblock(
                    client, json_answer(answer.status, answer.reason, exc, request_id)
                )
            method = getattr(req, "method", None) or "other"
            _count_gunicorn_answer(method, answer.status, time.perf_counter() - started, request_id)

    # 6. Stopping ---------------------------------------------------------------------

    def set_accept_enabled(self, enabled: bool) -> None:
        super().set_accept_enabled(enabled)
        if not enabled and not self.alive:
            for listener in self.sockets:
                self._stop_listening(listener)

    def _stop_listening(self, listener: socket.socket) -> None:
        """Close this worker's copy of ``listener``. When the whole server stops, the
        last copy's close resets every connection the kernel completed into its backlog
        (their clients have sent their requests): 1 to 6 of 16 keep-alive clients
        reconnecting after ``Connection: close`` were reset. So first no handshake
        completes any more (``refuse_new_connections``: a client's SYN goes unanswered
        until the socket is closed, then it is refused), then the backlog is accepted
        and answered (``Connection: close``), then the socket closed. An orphaned worker
        (its master killed) does the same, but filters only when no other server may
        listen on the socket (during a ``SIGUSR2`` upgrade the other generation does):
        unfiltered, a client reconnecting between its last accept and its close was
        reset (1 run in 3 beside a CPU hog)."""
        last = self._server_stopping()
        if last or (self._orphaned and not self._socket_shared()):
            refuse_new_connections(listener)
        if last or self._orphaned:
            with contextlib.suppress(OSError):
                listener.setblocking(False)
                for _ in range(BACKLOG_DRAIN_MAX):
                    if not self._accept_one(listener):
                        break
        with contextlib.suppress(OSError):
            listener.close()

    def is_parent_alive(self) -> bool:
        if super().is_parent_alive():
            return True
        self.alive = False  # as if told to stop: Connection: close, listeners closed
        self._orphaned = True
        return False

    # 7. Heartbeat --------------------------------------------------------------------

    def notify(self) -> None:
        if self._heartbeat.due():
            super().notify()


def _count_gunicorn_answer(method: str, status: int, duration_s: float, request_id: str) -> None:
    """Count an answer Gunicorn wrote itself in the request metrics and the access log."""
    from serving.observe import access_log
    from serving.observe.metrics import default_metrics

    default_metrics().observe_request(method, "(gunicorn)", status, duration_s)
    access_log.record(
        {
            "request_id": request_id,
            "method": method[:16],
            "route": "(gunicorn)",
            "status": status,
            "latency_ms": round(duration_s * 1000, 3),
        }
    )
