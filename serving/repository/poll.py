"""Following a model repository (``SERVING_MODEL_CONTROL=poll``): look at it every
``SERVING_REPOSITORY_POLL_S`` seconds and ask for a reload when it has changed and
stayed so.

Each look takes a fingerprint of the repository: per model folder its ``config.json`` and
per version folder every file and folder in it (name, size, mtime, mode, owner), not
their contents. A reload is
asked for (``on_change``: the master sends itself ``SIGHUP``, the reload every change
goes through) only when two looks in a row agree on a state other than the one the last
reload read (``reading``: whoever asked for it; the one last asked for is not enough: a
reload another asked for may have read something else since). So:

- a version still being copied (its sizes or times move between looks) is not read
  until the copy has stood still for one interval (TF Serving #1086, #631);
- a model folder, or a version, gone for one look and back at the next unloads nothing;
  gone at two looks in a row, it is unloaded;
- a look that cannot list the repository, or finds it holding no model folder, changes
  nothing whatever it lasts (a storage outage or an ``aws s3 sync`` that empties it
  first: Triton #3733, TF Serving #1480), and is said once until it ends.

Boundary: files and a callback; no gunicorn, no settings.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final

__all__ = ["Fingerprint", "Poller", "fingerprint", "folder_state"]

#: Most files looked at in one version folder (an MLflow folder holds a few).
MAX_FILES: Final = 1000

#: Per model folder: its config.json's ``(size, mtime_ns)`` (or None), and per version
#: folder the sorted ``(relative path, size, hash of mtime, mode and owner)`` of what it
#: holds.
Fingerprint = dict[str, tuple[object, dict[str, tuple[tuple[str, int, int], ...]]]]


def fingerprint(root: Path) -> Fingerprint:
    """The repository's state as ``Poller`` compares it.

    :raises OSError: when ``root`` cannot be listed.
    """
    state: Fingerprint = {}
    for model in os.scandir(root):
        if model.name.startswith(".") or not model.is_dir():
            continue
        config = None
        versions: dict[str, tuple[tuple[str, int, int], ...]] = {}
        try:
            for entry in os.scandir(model.path):
                if entry.name == "config.json":
                    info = entry.stat()
                    config = (info.st_size, info.st_mtime_ns)
                elif not entry.name.startswith(".") and entry.is_dir():
                    versions[entry.name] = folder_state(Path(entry.path))
        except OSError:  # gone between the listing and the look: as if gone
            continue
        state[model.name] = (config, versions)
    return state


def folder_state(folder: Path) -> tuple[tuple[str, int, int], ...]:
    """Each file and folder under ``folder`` (itself too): its path, and a number of its
    size, mtime, mode and owner (a permission fixed changes what the scan refuses)."""
    found = []
    for directory, folders, names in os.walk(folder):
        for name in [".", *folders, *names]:
            path = Path(directory, name)
            try:
                info = path.stat()
            except OSError:
                continue
            state = hash((info.st_mtime_ns, info.st_mode, info.st_uid))
            found.append((str(path.relative_to(folder)), info.st_size, state))
            if len(found) >= MAX_FILES:
                return tuple(sorted(found))
    return tuple(sorted(found))


class Poller:
    """Looks at ``root`` and calls ``on_change`` once per settled change (see the module).

    Usage::

        poller = Poller(Path("models"), 5.0, on_change=ask_reload, say=log.warning)
        poller.start()             # a daemon thread, one look every 5 s
    """

    def __init__(
        self,
        root: Path,
        interval_s: float,
        on_change: Callable[[], None],
        say: Callable[[str], None],
    ) -> None:
        self.root, self.interval_s = root, interval_s
        self._on_change, self._say = on_change, say
        self._acted: Fingerprint | None = None
        self._last: Fingerprint | None = None
        self._problem = ""
        self._stop = threading.Event()
        try:
            self._acted = fingerprint(root)  # what was read at start
        except OSError:
            self._acted = None

    def look(self) -> bool:
        """One look; True when it asked for a reload."""
        try:
            state = fingerprint(self.root)
        except OSError as exc:
            self._glitch(f"cannot list {self.root}: {exc.strerror or exc}")
            return False
        if not state:
            self._glitch(f"{self.root} holds no model folder")
            return False
        if self._problem:
            self._say(f"model repository: {self.root} can be read again")
            self._problem = ""
        settled = state == self._last
        self._last = state
        if state == self._acted or not settled:
            return False
        self._acted = state
        self._on_change()
        return True

    def reading(self) -> None:
        """The master reads the repository now, for a reload (whoever asked for it): what
        is there is what the next looks compare with. Taken before the master's own read,
        so a change made while it reads is seen by the next looks, not missed."""
        with contextlib.suppress(OSError):
            self._acted = fingerprint(self.root)

    def _glitch(self, problem: str) -> None:
        """A look that sees no repository: nothing changes, said once while it lasts."""
        self._last = None  # two looks must agree on something seen
        if problem != self._problem:
            self._say(f"model repository: {problem}; nothing unloaded, serving on")
            self._problem = problem

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="serving-repository-poll", daemon=True)
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.look()
            except Exception as exc:  # a poller that dies would stop following silently
                self._say(f"model repository: a look failed: {exc!r}")
