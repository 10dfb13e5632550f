"""Prediction requests on their way to a batcher: read by this worker, not yet queued.

The ``adaptive`` batcher's gate (``serving.batching.batcher``) reads the count: a request
that finds the model idle and nothing queued runs its rows on its own thread only when no
other request is on its way; with others coming it goes to the batcher thread, so that
they merge. The decision rests on what is in flight now, not on what past calls merged,
so it cannot lock itself into either mode.

A request enters when the app has routed it to a prediction view (``serving.app``) and
leaves when it is handed to a batcher (``DataPlane.infer``) or, failing earlier, when it
ends; leaving twice counts once. The count is per worker process, over all its models.

Boundary: standard library only.
"""

from __future__ import annotations

import functools
import threading

__all__ = ["Arrival", "Arrivals", "process_arrivals"]


class Arrivals:
    """How many requests of this worker are between their routing and a batcher.

    Usage::

        arrivals = Arrivals()
        arrival = arrivals.enter()   # arrivals.count == 1
        arrival.leave()              # 0; a second leave() changes nothing
    """

    __slots__ = ("_lock", "count")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Requests entered and not left; read without the lock (an int read is atomic).
        self.count = 0

    def enter(self) -> Arrival:
        """Count one more request on its way; its ``leave()`` uncounts it."""
        with self._lock:
            self.count += 1
        return Arrival(self)

    def _leave(self) -> None:
        with self._lock:
            self.count -= 1


class Arrival:
    """One counted request of ``Arrivals``."""

    __slots__ = ("_arrivals",)

    def __init__(self, arrivals: Arrivals) -> None:
        self._arrivals: Arrivals | None = arrivals

    def leave(self) -> None:
        """Uncount this request, once (later calls do nothing)."""
        arrivals, self._arrivals = self._arrivals, None
        if arrivals is not None:
            arrivals._leave()


@functools.cache
def process_arrivals() -> Arrivals:
    """This process's count, shared by its app and its models' batchers."""
    return Arrivals()
