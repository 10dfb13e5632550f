"""What the master does with a model repository (``SERVING_MODEL_REPOSITORY``): say once
what it cannot serve, follow it (``SERVING_MODEL_CONTROL=poll``), and leave out a version
that a reload brought and its workers could not load (``Quarantine``, under ``poll`` and
``none``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from serving.repository import PASSED_OVER
from serving.repository.poll import Poller, folder_state
from serving.server.board import Board
from serving.server.in_place import ask_reload
from serving.settings import Settings

__all__ = ["LOOK_S", "Quarantine", "follow", "reading", "say_refused", "served_keys"]

#: Longest load error kept in a left-out version's reason.
_REASON_CHARS = 300
#: No folder's state (a version never proven).
_NEVER = object()
#: Seconds between two looks at the board for workers that could not load.
LOOK_S = 1.0

Key = tuple[str, str]


def say_refused(warn: Callable[..., None], settings: Settings) -> None:
    """One line per repository entry the settings read and could not serve, and why (at
    start and at each reload); a version its policy passed over is no fault, not said."""
    for refusal in settings.refused_models():
        if refusal.reason.startswith(PASSED_OVER):  # no fault: an older version
            continue
        where = f"{refusal.model}/{refusal.version}" if refusal.version else refusal.model
        warn("model repository: %s not served: %s", where, refusal.reason)


class Quarantine:
    """Master: the repository versions a reload brought that a worker of that reload could
    not load (a truncated file, a class that raises), left out of every reload after it
    until their files change; then they are tried again.

    Only versions no generation that was all ready served with the same files count: a
    version that served before and fails now (the machine short of memory) is not left
    out (said once), while one republished with other files (a truncated copy under a
    number that served) is; nor is one whose
    leaving out would leave its model no version (a roll back onto a version that fails):
    a glitch unloads nothing; the old workers serve on, as before. Each finding asks the
    master for a reload (``on_found``), whose settings leave the version out
    (``excluded``): the policy picks among the others, so the version it would replace
    serves on, and the rest of the change goes through.

    Usage::

        quarantine = Quarantine(Path("models"), board, on_found=ask_reload, say=log.warning)
        quarantine.look(generation=3, served={("churn", "2"), ("cancer", "1")})  # each second
        settings.selecting(None, quarantine.excluded())                        # at a reload
    """

    def __init__(
        self,
        root: Path,
        board: Board,
        on_found: Callable[[], None],
        say: Callable[[str], None],
        served: set[Key],
        *,
        keeps_model: Callable[[Key, dict[Key, str]], bool] = lambda key, excluded: True,
    ) -> None:
        self.root, self.board, self._on_found, self._say = root, board, on_found, say
        self._keeps_model = keeps_model
        # Re-entrant: ``died`` runs in the master's SIGCHLD handling, which may interrupt
        # its own ``excluded`` (a reload) on the same thread.
        self._lock = threading.RLock()
        self._failed: dict[Key, tuple[object, str]] = {}
        #: Every version a generation that was all ready served (at start: what it serves),
        #: and its files then.
        self._proven: dict[Key, object] = {k: self._state(k) for k in served}
        #: Versions not left out, as the last of their model, until the next reload.
        self._kept: set[Key] = set()
        #: Versions a worker died loading: the generation and why.
        self._deaths: dict[Key, tuple[int, str]] = {}
        #: Each version's files as the last reload read them (``loading``).
        self._read: dict[Key, object] = {}

    def loading(self, served: set[Key]) -> None:
        """Master, at each reload: the versions its new workers load; their files as they
        are now are what a failure is about (a file completed after the workers failed on
        it, before a look, is then tried again)."""
        states: dict[Key, object] = {k: folder_state(self.root / k[0] / k[1]) for k in served}
        with self._lock:
            self._read = states

    def look(self, generation: int, served: set[Key]) -> bool:
        """One look at the board; True when it found a version to leave out."""
        fleet = self.board.read()
        if fleet.alone(generation):
            with self._lock:
                self._proven |= {key: self._read.get(key) or self._state(key) for key in served}
        with self._lock:
            deaths, self._deaths = self._deaths, {}
        failures = [
            (key, f"a worker could not load it: {fleet.errors.get(pid, '')}")
            for pid, key in fleet.failed_models.items()
            if fleet.failed(pid) and fleet.generations.get(pid) == generation
        ] + [(key, why) for key, (born, why) in deaths.items() if born == generation]
        found = []
        for key, why in failures:
            if key not in served:
                continue
            reason = " ".join(why.split())
            reason = reason if len(reason) <= _REASON_CHARS else reason[:297] + "..."
            with self._lock:
                if key in self._failed or key in self._kept:
                    continue
                if self._proven.get(key, _NEVER) == (self._read.get(key) or self._state(key)):
                    self._kept.add(key)
                    self._say(
                        f"model repository: {key[0]}/{key[1]} not left out: it served "
                        f"before, with the same files; the old workers serve on ({reason})"
                    )
                    continue
                if not self._keeps_model(key, self.excluded_now() | {key: reason}):
                    self._kept.add(key)
                    self._say(
                        f"model repository: {key[0]}/{key[1]} not left out: it is the last "
                        f"version of its model; the old workers serve on ({reason})"
                    )
                    continue
                state = self._read.get(key) or folder_state(self.root / key[0] / key[1])
                self._failed[key] = (state, reason)
            found.append(key)
            self._say(
                f"model repository: {key[0]}/{key[1]} left out until its files change: {reason}"
            )
        if found:
            self._on_found()
        return bool(found)

    def _state(self, key: Key) -> object:
        return folder_state(self.root / key[0] / key[1])

    def died(self, pid: int, key: Key, generation: int) -> None:
        """Master, in ``child_exit``: worker ``pid`` of ``generation`` died while loading
        version ``key``; noted as a failure for the next ``look`` (which the master's
        signal handler must not wait for)."""
        with self._lock:
            if generation >= self._deaths.get(key, (-1, ""))[0]:
                self._deaths[key] = (generation, f"worker {pid} died while loading it")

    def excluded(self) -> dict[Key, str]:
        """The versions left out, and why; one whose files changed since is tried again."""
        with self._lock:
            for key, (state, _) in list(self._failed.items()):
                if folder_state(self.root / key[0] / key[1]) != state:
                    del self._failed[key]
            self._kept.clear()  # a reload: each is looked at again
            return self.excluded_now()

    def excluded_now(self) -> dict[Key, str]:
        """The versions left out now, and why (the caller holds the lock)."""
        return {key: reason for key, (_, reason) in self._failed.items()}

    def start(self, generation: Callable[[], int], served: Callable[[], set[Key]]) -> None:
        """A daemon thread looking every ``LOOK_S`` seconds (it lists a few small files)."""

        def run() -> None:
            while True:
                time.sleep(LOOK_S)
                try:
                    self.look(generation(), served())
                except Exception as exc:  # a thread that dies would stop leaving out silently
                    self._say(f"model repository: a look at the workers failed: {exc!r}")

        threading.Thread(target=run, name="serving-repository-quarantine", daemon=True).start()


#: This master's poller (under ``poll``), told of each reload's read (``reading``).
_pollers: list[Poller] = []


def reading() -> None:
    """Master, at each reload, before it reads the repository: the poller compares its
    next looks with what this read finds (``Poller.reading``), whoever asked for it."""
    for poller in _pollers:
        poller.reading()


def served_keys(settings: Settings | None) -> set[Key]:
    """The ``(model, version)`` of every repository version ``settings`` serve."""
    if settings is None or settings.model_repository is None:
        return set()
    return {(spec.name, spec.version) for spec in settings.entries() or ()}


def follow(
    log: Any,
    settings: Settings,
    board: Board | None,
    generation: Callable[[], int],
    current: Callable[[], Settings | None],
) -> Quarantine | None:
    """Master, once, before the first fork: under ``poll``, a thread that looks at the
    repository and, when it has changed and stood still, sends the master ``SIGHUP``: the
    reload every change goes through (settings read again, the repository with them, the
    workers rolled over one by one). Under ``poll`` and ``none``, the ``Quarantine`` and
    its thread (returned). Threads that hold no lock a forked worker needs (they list
    and stat files, and log)."""
    if settings.model_repository is None or settings.controls_explicitly():
        return None
    reload = ask_reload  # SIGHUP, marked as the master's own: it may be taken in place
    quarantine = None
    if board is not None:

        def keeps_model(key: Key, excluded: dict[Key, str]) -> bool:
            running = current()
            try:
                chosen = running.selecting(None, excluded) if running else None
            except ValueError:  # nothing to serve at all
                return False
            return chosen is not None and any(s.name == key[0] for s in chosen.entries() or ())

        quarantine = Quarantine(
            settings.model_repository, board, reload, log.warning, served_keys(settings),
            keeps_model=keeps_model,
        )  # fmt: skip
        quarantine.start(generation, lambda: served_keys(current()))
    if settings.polls_repository():

        def changed() -> None:
            log.info("model repository: changed; reloading")
            reload()

        poller = Poller(settings.model_repository, settings.repository_poll_s, changed, log.warning)
        poller.start()
        _pollers[:] = [poller]
        log.info(
            "model repository: looking at %s every %g s", settings.model_repository,
            settings.repository_poll_s,
        )  # fmt: skip
    return quarantine
