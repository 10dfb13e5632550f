"""Saying in the log that a side channel drops what its sink cannot take: once when it
starts, then at most once a minute with the count, and once when the sink works again;
never a line or a traceback per drop (a dead sink under load would fill the log).

Boundary: standard library only (the access log uses it, with orjson alone).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Final

__all__ = ["EVERY_S", "Complaint"]

#: Seconds between two lines about one kind of drop (the first is said at once).
EVERY_S: Final = 60.0


class Complaint:
    """One kind of drop of one side channel, said in ``log`` at WARNING.

    :param what: the side channel and what it drops, e.g. ``"payload log records"``.
    :param counted_in: the metric that counts the drops, named in the first line.

    Usage::

        said = Complaint(log, "payload log records", "payload_log_dropped_total")
        said.drop("the sink failed: OSError: [Errno 28] No space left on device")
        said.ok()                                  # the sink took one again
    """

    def __init__(self, log: logging.Logger, what: str, counted_in: str) -> None:
        self.log, self.what, self.counted_in = log, what, counted_in
        self._lock = threading.Lock()
        self._failing = False
        self._next = 0.0  # time.monotonic() before which nothing more is said
        self._since = 0  # drops not yet said

    def drop(self, why: str) -> None:
        """One more dropped; ``why`` (one line) is said when this drop is."""
        with self._lock:
            self._since += 1
            now = time.monotonic()
            if now < self._next:
                return
            count, self._since, self._next = self._since, 0, now + EVERY_S
            first, self._failing = not self._failing, True
        if first:
            self.log.warning(
                "%s dropped: %s; counted in %s (said again at most once a minute)",
                self.what, why, self.counted_in,
            )  # fmt: skip
        else:
            self.log.warning("%d more %s dropped: %s", count, self.what, why)

    def ok(self) -> None:
        """The sink took one again: say so, when drops were said (one attribute read
        otherwise)."""
        if not self._failing:
            return
        with self._lock:
            count, self._since, self._failing, self._next = self._since, 0, False, 0.0
        self.log.warning("%s are taken again (%d more dropped before)", self.what, count)
