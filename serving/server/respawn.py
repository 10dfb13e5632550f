"""Master: how soon a worker is forked again after workers die while loading.

A model version whose load kills the process (native code: a segfault, ``abort``) kills
every worker forked to load it, and Gunicorn forks the next one at once: the attack saw
28 forks a second, 1,408 in 55 s, without end. A worker that fails to load with an error
stays alive and retries with backoff (``serving.server.worker_boot``); ``Backoff`` gives a
worker that *dies* loading the same: after each such death the master forks no worker
for 1 s, then 2, 4, ... up to 60 s, until every worker serves again. The workers serving
already serve on meanwhile (``serving.server.rollover`` stops an old worker only for a
ready new one), and a reload still forks its new workers at once.

Imports only the standard library.

Usage::

    backoff = Backoff()
    backoff.died_loading()     # child_exit: 1.0 (seconds before the next fork)
    backoff.holding()          # manage_workers: True for that second
    backoff.settle()           # every worker serves: back to 1 s
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

__all__ = ["FIRST_S", "MAX_S", "Backoff"]

#: Seconds without a fork after the first death while loading; doubling, at most ``MAX_S``.
FIRST_S = 1.0
MAX_S = 60.0


class Backoff:
    """The master's pause in forking workers after workers died while loading."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # Re-entrant: ``died_loading`` runs in the master's SIGCHLD handling, which may
        # interrupt ``holding`` on the same thread.
        self._lock = threading.RLock()
        self._next_s = FIRST_S
        self._until = 0.0

    def died_loading(self) -> float:
        """A worker died while it loaded: no fork for the seconds returned (doubling)."""
        with self._lock:
            pause, self._next_s = self._next_s, min(self._next_s * 2, MAX_S)
            self._until = self._clock() + pause
            return pause

    def holding(self) -> bool:
        """Whether the master should fork no worker now."""
        with self._lock:
            return self._clock() < self._until

    def settle(self) -> None:
        """The newest workers all serve: the pause ends, and the next death pauses
        ``FIRST_S`` again (a pause that outlived the crash loop kept a healthy worker's
        replacement waiting 58 s: the second attack)."""
        with self._lock:
            self._next_s, self._until = FIRST_S, 0.0
