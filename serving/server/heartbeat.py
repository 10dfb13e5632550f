"""A worker's heartbeat written at most once a second, not once per event: ``Heartbeat``.

Gunicorn's master kills a worker whose heartbeat file is older than ``--timeout``
(``SERVING_TIMEOUT_S``, 30 s by default). The gthread worker's main loop writes it
(``WorkerTmp.notify``: an ``os.utime`` system call) each time it wakes, which at one
keep-alive client is once per request: 11 % of that loop's samples under py-spy.
``ServingWorker.notify`` writes it only when ``Heartbeat.due()``: at least
``min(1 s, timeout / 4)`` after the last write, so the master still sees a heartbeat
several times per timeout.

Imports only the standard library.
"""

from __future__ import annotations

import time

__all__ = ["MAX_INTERVAL_S", "Heartbeat"]

#: Longest time between two heartbeat writes of a busy worker, in seconds.
MAX_INTERVAL_S = 1.0


class Heartbeat:
    """When a worker whose Gunicorn ``--timeout`` is ``timeout_s`` seconds writes its
    heartbeat: every time for a timeout of 0 or less (as Gunicorn does), else at most once
    per ``min(MAX_INTERVAL_S, timeout_s / 4)`` seconds.

    Usage::

        heartbeat = Heartbeat(timeout_s=30)
        heartbeat.due()  # True: write now
        heartbeat.due()  # False until a second has passed
    """

    __slots__ = ("_last", "interval_s")

    def __init__(self, timeout_s: float) -> None:
        self.interval_s = min(MAX_INTERVAL_S, timeout_s / 4) if timeout_s > 0 else 0.0
        self._last = float("-inf")

    def due(self) -> bool:
        """Whether to write the heartbeat now (if so, counted as written)."""
        now = time.monotonic()
        if now - self._last < self.interval_s:
            return False
        self._last = now
        return True
