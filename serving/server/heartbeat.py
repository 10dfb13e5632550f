"""A worker's heartbeat written at most once a second, not once per event.

Gunicorn's master kills a worker whose heartbeat file is older than ``--timeout``
(``SERVING_TIMEOUT_S``, 30 s by default). The gthread worker's main loop writes it
(``WorkerTmp.notify``: an ``os.utime`` system call) each time it wakes, which at one
keep-alive client is once per request: 11 % of that loop's samples under py-spy.
``throttle_heartbeat`` writes it when at least ``min(1 s, timeout / 4)`` have passed since
the last write, so the master still sees a heartbeat several times per timeout.

Imports only the standard library.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["throttle_heartbeat"]

#: Longest time between two heartbeat writes of a busy worker, in seconds.
MAX_INTERVAL_S = 1.0


def throttle_heartbeat(worker: Any, timeout_s: float) -> None:
    """Make ``worker.notify`` write the heartbeat at most once per
    ``min(MAX_INTERVAL_S, timeout_s / 4)`` seconds (``timeout_s``: Gunicorn's ``--timeout``;
    0 or less writes every time, as Gunicorn does)."""
    if timeout_s <= 0:
        return
    interval_s = min(MAX_INTERVAL_S, timeout_s / 4)
    notify = worker.notify
    last = [float("-inf")]

    def throttled() -> None:
        now = time.monotonic()
        if now - last[0] >= interval_s:
            last[0] = now
            notify()

    worker.notify = throttled
