"""Count a gthread worker's requests on their way to a batcher (``serving.batching.arrivals``).

``count_arrivals`` wraps the worker's ``handle`` so that a request counts from the moment
one of its threads takes the connection up with bytes to read, before Gunicorn parses the
request line, and patches Gunicorn's ``SocketUnreader.chunk`` so that a read waiting for
the client uncounts it until bytes come. The app's hooks and the data plane do the rest
(``serving.app``, ``DataPlane.infer``).

Imports only the standard library, ``serving.batching.arrivals`` and, when called,
Gunicorn's HTTP reader.
"""

from __future__ import annotations

import functools
import os
import select
import selectors
import threading
from collections.abc import Callable
from typing import Any

from serving.batching.arrivals import Arrivals

__all__ = ["count_arrivals"]


def count_arrivals(worker: Any, arrivals: Arrivals) -> None:
    """Count each request of ``worker`` (a gthread worker) in ``arrivals`` from the moment
    one of its threads takes the connection up, before Gunicorn parses the request line:
    the batcher's gate then sees requests still waiting for the GIL in the parser, not only
    those the app has routed. The data plane uncounts a request when it queues it; the
    thread's end uncounts the rest (probes, errors).

    A thread waiting for its client's bytes is not counted: not when it takes up a
    connection with nothing to read yet (Gunicorn waits up to 5 s for a new connection's
    first bytes), nor during a read of the request line, headers or body that has to wait
    for the network; it is again once they come. A batch cannot know when a slow client
    will be done, and it waited for one: an idle connection, a request line without its
    headers or a trickling upload made every batch of the worker wait
    ``SERVING_MAX_BATCH_LATENCY_MS`` (found by the attack on this branch)."""
    handle = worker.handle

    enqueue = getattr(worker, "enqueue_req", None)  # gthread's main loop -> thread pool

    def counted(conn: Any) -> Any:
        if enqueue is not None:
            arrivals.taken()
        _reading.arrivals = arrivals
        # A keep-alive connection comes from the poller, readable; a new one may not be.
        ready = getattr(conn, "initialized", False) or _buffered(conn) or _has_bytes(conn.sock)
        _reading.ready = ready  # then the first read returns at once: no need to look
        if ready:
            arrivals.enter()
        try:
            return handle(conn)
        finally:
            arrivals.leave()
            _reading.arrivals = None

    worker.handle = counted
    if enqueue is not None:

        def handed(conn: Any) -> Any:  # on the main loop, before a thread takes it up
            arrivals.hand()
            return enqueue(conn)

        worker.enqueue_req = handed
    arrivals.waiting = ready_in_poller(worker)
    _count_only_while_bytes_come()


def ready_in_poller(worker: Any) -> Callable[[], bool]:
    """Whether ``worker``'s poller holds a connection ready to be taken up (a keep-alive
    client's next request, a new connection): one ``epoll_wait`` with no timeout on a
    duplicate of the poller's descriptor, which takes nothing from the main loop (level
    triggered). Under load the main loop may not have run yet to hand such requests to
    threads, and a request finding none counted ran alone on its thread, one after the
    other: batches of 1.4 in one round of three at 64 connections on a quiet host."""
    lock = threading.Lock()
    epoll: list[Any] = []  # [the duplicate], or [None] where there is no epoll poller

    def ready() -> bool:
        if not epoll:
            poller = getattr(worker, "poller", None)
            if poller is None:
                return False  # before init_process
            with lock:
                if not epoll:
                    epoll.append(_duplicate(poller))
        return epoll[0] is not None and bool(epoll[0].poll(0, 1))

    return ready


#: ``.arrivals``: the count of the request this thread carries in a counted ``handle``;
#: ``.ready``: its next read returns at once (one poll per request at most, none for a
#: keep-alive connection the poller handed over: with a poll per read, one run at load
#: average 13 was slower in 4 rounds of 4, by 5 % of requests/s at the median).
_reading = threading.local()


@functools.cache
def _count_only_while_bytes_come() -> None:
    """Make each read of a request from its socket (Gunicorn's ``SocketUnreader.chunk``:
    request line, headers, body), inside a counted ``handle``, uncount its request while
    it waits for the client and count it again once bytes come. Once per process."""
    from gunicorn.http import unreader  # type: ignore[import-untyped]

    chunk = unreader.SocketUnreader.chunk

    def counted_chunk(self: Any, *args: Any, **kwargs: Any) -> Any:
        arrivals: Arrivals | None = getattr(_reading, "arrivals", None)
        if arrivals is None:
            return chunk(self, *args, **kwargs)
        if _reading.ready:  # the read the poller woke the thread for: bytes are there
            _reading.ready = False
            return chunk(self, *args, **kwargs)
        if not _has_bytes(self.sock):
            arrivals.leave()  # waiting for the client
        data = chunk(self, *args, **kwargs)
        if data:
            arrivals.enter()
        return data

    unreader.SocketUnreader.chunk = counted_chunk


def _duplicate(poller: Any) -> Any:
    """An epoll object on a duplicate of ``poller``'s descriptor; None where the poller is
    not epoll (macOS's kqueue, a select fallback): the gate then sees the count alone."""
    epoll_selector: Any = getattr(selectors, "EpollSelector", None)
    if epoll_selector is None or not isinstance(poller, epoll_selector):
        return None
    return select.epoll.fromfd(os.dup(poller.fileno()))


def _buffered(conn: Any) -> bool:
    """Whether Gunicorn's parser of ``conn`` holds bytes it read ahead (a pipelined
    request): a connection it hands to a thread for them, with none on the socket."""
    buffer = getattr(getattr(getattr(conn, "parser", None), "unreader", None), "buf", None)
    return buffer is not None and bool(buffer.getvalue())


def _has_bytes(sock: Any) -> bool:
    """Whether a read of ``sock`` would return at once: bytes (or the end of the stream)
    are there, or TLS holds some decrypted. True when it cannot tell (a closed socket,
    whose read fails at once)."""
    try:
        pending = getattr(sock, "pending", None)  # ssl.SSLSocket
        if pending is not None and pending():
            return True
        poll = select.poll()
        poll.register(sock, select.POLLIN)
        return bool(poll.poll(0))
    except (OSError, ValueError):
        return True
