"""Requests on their way to a batcher: taken up by a worker thread, not yet queued.

The ``adaptive`` batcher (``serving.batching.batcher``) reads the count: a request that
finds the model idle and nothing queued runs its rows on its own thread only when no other
request is on its way, and a batch waits a little for those that are. With others coming
it goes to the batcher thread, so that they merge. The decision rests on what is in flight
now, not on what past calls merged, so it cannot lock itself into either mode.

A request enters when a thread takes it up: under Gunicorn as soon as a gthread worker
thread starts on its connection with bytes to read, before the request line is parsed
(``serving.server.arrivals``), since a request waiting for the GIL in Gunicorn's parser
is as much on its way as one being decoded; else when the app routes it to a prediction
view (``serving.app``). Before that, under Gunicorn, it is ``handed`` (the main loop gave
it to the thread pool, no thread runs it yet) or ``waiting`` (ready in the worker's
poller, which the main loop has not handed on yet); ``coming()`` asks all three. It
leaves when the data plane queues it (``DataPlane.infer``) or when its thread is done
with it. Each thread carries one request at a time, so the state is per thread: entering
twice counts once, and so does leaving. The count is per worker process, over all its
models.

Boundary: standard library only.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable

__all__ = ["Arrivals", "process_arrivals"]


class Arrivals:
    """How many requests of this process are between a thread taking them up and a batcher.

    Usage::

        arrivals = Arrivals()
        arrivals.enter()   # this thread's request: arrivals.count == 1 (again: still 1)
        arrivals.leave()   # 0; a second leave() changes nothing
    """

    __slots__ = ("_lock", "_thread", "count", "handed", "waiting")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread = threading.local()  # .on_the_way: this thread's request is counted
        #: Requests entered and not left; read without the lock (an int read is atomic).
        self.count = 0
        #: Requests handed to a thread that has not taken them up yet (``hand``, ``taken``).
        self.handed = 0
        #: Whether requests wait where no thread has taken them up yet (under Gunicorn: a
        #: connection ready in the worker's poller), asked only when ``count`` is 0.
        self.waiting: Callable[[], bool] | None = None

    def coming(self) -> bool:
        """Whether another request is on its way: counted, handed to a thread, or waiting
        to be taken up."""
        return self.count > 0 or self.handed > 0 or (self.waiting is not None and self.waiting())

    def hand(self) -> None:
        """One more request handed to a thread (by the server's main loop)."""
        with self._lock:
            self.handed += 1

    def taken(self) -> None:
        """A thread took up a request handed to it."""
        with self._lock:
            self.handed -= 1

    def enter(self) -> None:
        """Count the request this thread carries, unless it is counted already."""
        state = self._thread
        if not getattr(state, "on_the_way", False):
            state.on_the_way = True
            with self._lock:
                self.count += 1

    def leave(self) -> None:
        """Uncount the request this thread carries, if it is counted."""
        state = self._thread
        if getattr(state, "on_the_way", False):
            state.on_the_way = False
            with self._lock:
                self.count -= 1


@functools.cache
def process_arrivals() -> Arrivals:
    """This process's count, shared by its server hooks, its app and its models' batchers."""
    return Arrivals()
