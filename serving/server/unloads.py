"""Master: count each model version that stops being served, as
``serving_model_unloads_total{model,version}`` (Triton's unload; here the old workers'
exit once the new ones serve: ``serving.server.rollover``).

A version is counted when a generation of workers that no longer serves it is all ready
and alone (every older worker gone, or stopping: taking no new request), not when a
reload's settings leave it out: a change undone (an explicit load that failed), a
version left out after its workers could not load it, or a reload overtaken by the next
one counts nothing, and the version that served throughout is not counted either (the
attack found all three counted).

The master counts, in its own file of the multiprocess metrics directory: it alone knows
what each generation serves. prometheus-client is imported on the first count, long
after the master set ``PROMETHEUS_MULTIPROC_DIR`` (``serving.server.hooks``), never at
module level.

Usage::

    unloads = Unloads(board)
    unloads.note(generation=0, served={("churn", "1")})   # when_ready, and each on_reload
    unloads.start(lambda: generation)                     # looks every second
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from serving.server.board import Board
from serving.settings import Settings

__all__ = ["LOOK_S", "Unloads", "versions"]

#: Seconds between two looks at the board.
LOOK_S = 1.0

Key = tuple[str, str]


def versions(settings: Settings | None) -> set[Key] | None:
    """Every ``(model, version)`` ``settings`` serve, or None when the one model's folder
    no longer says (``Settings.single_spec``)."""
    if settings is None:
        return None
    try:
        specs = settings.entries() or [settings.single_spec()]
    except ValueError:
        return None
    return {(spec.name, spec.version) for spec in specs}


class Unloads:
    """The versions the last generation that served alone served, and the counter of
    those a later one no longer serves (``counter``: a prometheus-client ``Counter``
    labelled model and version; default: ``serving_model_unloads``, made at first use)."""

    def __init__(self, board: Board, counter: Any = None) -> None:
        self.board, self._counter = board, counter
        self._lock = threading.Lock()
        #: What each generation serves, as the master noted it at its reload.
        self._served_by: dict[int, set[Key]] = {}
        #: What the last generation that served alone served (at first: the first boot's,
        #: whose window alone may close before a look); None before the first note.
        self.serving: set[Key] | None = None

    def note(self, generation: int, served: set[Key] | None) -> None:
        """Master, at start and at each reload: the versions ``generation`` serves. A
        last look at the generation before it comes first: one that served alone for
        less than ``LOOK_S`` (an unload call, then a load call at once) is counted."""
        if generation - 1 in self._served_by:
            self.look(generation - 1)
        if served is not None:
            with self._lock:
                self._served_by[generation] = set(served)
                if self.serving is None:  # the first boot's: served unless it halts
                    self.serving = set(served)

    def look(self, generation: int) -> set[Key]:
        """One look at the board: when every worker on it that takes requests (not one
        stopping or leaving: it only finishes what it holds) is of ``generation`` and
        ready, count (and return) the versions served before that it does not serve."""
        alone = self.board.read().alone(generation)
        with self._lock:
            served = self._served_by.get(generation)
            if not alone or served is None:
                return set()
            gone = (self.serving or set()) - served
            self.serving = served
            for older in [g for g in self._served_by if g < generation]:
                del self._served_by[older]
        for model, version in sorted(gone):
            self.counter().labels(model, version).inc()
        return gone

    def start(self, generation: Callable[[], int], say: Callable[[str], None]) -> None:
        """A daemon thread looking every ``LOOK_S`` seconds (it lists a few small files)."""

        def run() -> None:
            while True:
                time.sleep(LOOK_S)
                try:
                    self.look(generation())
                except Exception as exc:  # a thread that dies would stop counting silently
                    say(f"model unloads: a look at the workers failed: {exc!r}")

        threading.Thread(target=run, name="serving-unloads", daemon=True).start()

    def counter(self) -> Any:
        if self._counter is None:
            from prometheus_client import Counter

            self._counter = Counter(
                "serving_model_unloads",
                "Model versions no longer served: counted once the workers of the change "
                "that left them out serve alone (a changed repository, an unload call).",
                ["model", "version"],
                registry=None,
            )
        return self._counter
