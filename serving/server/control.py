"""Explicit model control (``SERVING_MODEL_CONTROL=explicit``): which models of the
repository the server serves, changed only by ``POST /v2/repository/models/{name}/load``
and ``/unload`` (Triton's model control mode of that name).

What is wanted is one file on the board (``Wanted``: each model to serve, with the
``config.json`` fields a load gave, and a number counting the changes). A call goes:

    worker   checks the call (``load`` and ``unload``), writes the new wanted set under a
             lock (several workers may take calls at once) and sends the master SIGHUP:
             the reload every change goes through
    master   at the reload: serves what is wanted (``Settings.selecting``) and notes the
             change number it read and the generation it forks (``note_applied``)
    worker   waits on the board (``outcome``): over when every worker not leaving is of
             that generation or newer and ready; failed when the master refused the
             reload or a worker of it could not load, and then its change is undone
             (the old workers served on throughout) and the reason answered

At start every model of the repository is served (as Triton's ``--load-model=*``) and
wanted (``begin``); a model folder added later is served once a load names it. The board
goes when the master exits, so a restart serves every model again.

Imports only the standard library and ``serving.repository``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.errors import (
    ControlRefused,
    ControlTimeout,
    LoadFailed,
    ModelNotFound,
    NotReady,
)
from serving.repository import scan
from serving.server.board import GOING, Board, installed_board
from serving.settings import Settings

__all__ = ["Wanted", "changes", "deadline_s", "load", "note_applied", "outcome", "unload", "wanted"]

_WANTED = "explicit.json"
_APPLIED = "explicit-applied.json"
_LOCK = "explicit.lock"
#: Seconds between two looks at the board while a call waits.
_LOOK_S = 0.05


@dataclass(frozen=True)
class Wanted:
    """The models to serve (name -> the ``config.json`` fields a load gave, or None for
    the file's) and the number of changes made so far."""

    models: dict[str, dict[str, Any] | None]
    changes: int = 0


def wanted(board: Board) -> Wanted | None:
    """What is wanted (``begin``, then each call), or None without explicit control."""
    try:
        data = json.loads((board.path / _WANTED).read_text())
        return Wanted(dict(data["models"]), int(data["changes"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def begin(board: Board, served: list[str]) -> None:
    """Master, once before the first fork: the models it serves at start are what is
    wanted (a model folder added later is served once a load names it)."""
    _replace(board.path / _WANTED, {"models": dict.fromkeys(served), "changes": 0})


def changes(board: Board) -> int:
    """The number of load and unload calls made so far (master, at each reload, before it
    re-reads the settings: they apply at least these)."""
    current = wanted(board)
    return current.changes if current is not None else 0


def note_applied(board: Board, changes: int, generation: int, problem: str | None) -> None:
    """Master, at each reload: it applies ``changes`` calls (at least) to the workers of
    ``generation`` it will fork, or refused the reload for ``problem``."""
    note = {"changes": changes, "generation": generation, "error": problem}
    _replace(board.path / _APPLIED, note)


def load(settings: Settings, name: str, config: Mapping[str, Any] | None) -> None:
    """Serve model ``name`` of the repository (again, picking up its versions now), with
    ``config`` in place of its ``config.json`` when given; returns once every worker
    serves it.

    :raises ModelNotFound: no such model folder. :raises LoadFailed: it has no version
        to serve (each reason), or a worker could not load it. :raises ControlTimeout:
        past ``deadline_s(settings)``. :raises NotReady: outside the server's Gunicorn
        master, or when the repository cannot be read.
    """
    root, board = _root(settings, name), _board()
    _folder(root, name)
    try:
        found = scan(
            root, loaded={name: config}, max_models=settings.max_models,
            allow_world_writable=settings.allow_world_writable_model,
        )  # fmt: skip
    except OSError as exc:
        raise NotReady(f"model control: cannot read {root}: {exc.strerror or exc}") from None
    if not found.specs:
        reasons = [f"{r.version}: {r.reason}" if r.version else r.reason for r in found.refused]
        raise LoadFailed(name, "nothing to serve (" + "; ".join(reasons or ["no version"]) + ")")
    _change(board, root, name, dict(config) if config is not None else None, settings)


def unload(settings: Settings, name: str) -> None:
    """Stop serving model ``name``; returns once no worker serves it. Unloading a model
    not served changes nothing.

    :raises ModelNotFound: no such model folder. :raises ControlRefused: it is the last
        model served. :raises LoadFailed, ControlTimeout, NotReady: as ``load``.
    """
    root, board = _root(settings, name), _board()
    current = _current(board)
    if name not in current.models:
        _folder(root, name)
        return
    if set(current.models) == {name}:
        raise ControlRefused(name, "the last model served cannot be unloaded")
    _change(board, root, name, _GONE, settings)


def deadline_s(settings: Settings) -> float:
    """Longest a call waits for its outcome: a load's time and a drain's."""
    return settings.load_timeout_s + settings.drain_timeout_s


def outcome(board: Board, changes: int, deadline_s: float) -> str | None:
    """Wait until the reload that applies change ``changes`` is over: None when every
    worker not leaving is of its generation or newer and ready, else why it failed.

    :raises TimeoutError: past ``deadline_s`` seconds.
    """
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        note = _applied(board)
        if note is not None and note["changes"] >= changes:
            if note["error"]:
                return str(note["error"])
            fleet = board.read()
            staying = [pid for pid, state in fleet.states.items() if state not in GOING]
            newer = [p for p in staying if fleet.generations.get(p, -1) >= note["generation"]]
            for pid in newer:
                if pid in fleet.errors:
                    return f"worker {pid}: {fleet.errors[pid]}"
            over = newer and len(newer) == len(staying)
            if over and all(fleet.states[p] == "ready" for p in newer):
                return None
        time.sleep(_LOOK_S)
    raise TimeoutError


#: ``_change``'s entry for a model no longer wanted.
_GONE: Any = object()


def _change(board: Board, root: Path, name: str, entry: Any, settings: Settings) -> None:
    """Make ``name``'s entry ``entry`` (``_GONE``: not wanted), have the master apply it
    and wait for the outcome; a failed one is undone."""
    with _locked(board):
        current = _current(board)
        before = current.models.get(name, _GONE)
        changes = _write(board, current, name, entry)
    os.kill(os.getppid(), signal.SIGHUP)
    try:
        problem = outcome(board, changes, deadline_s(settings))
    except TimeoutError:
        raise ControlTimeout(name, deadline_s(settings)) from None
    if problem is None:
        return
    with _locked(board):  # undone unless a later call changed it again
        current = _current(board)
        undo = current.models.get(name, _GONE) == entry
        if undo:
            changes = _write(board, current, name, before)
    if undo:  # answered once the workers serve as before (so does the index)
        os.kill(os.getppid(), signal.SIGHUP)
        with contextlib.suppress(TimeoutError):
            outcome(board, changes, deadline_s(settings))
    raise LoadFailed(name, f"{problem}; serving on as before")


def _write(board: Board, current: Wanted, name: str, entry: Any) -> int:
    models = dict(current.models)
    if entry is _GONE:
        models.pop(name, None)
    else:
        models[name] = entry
    changes = current.changes + 1
    _replace(board.path / _WANTED, {"models": models, "changes": changes})
    return changes


def _current(board: Board) -> Wanted:
    """What is wanted now (``begin`` wrote it first)."""
    found = wanted(board)
    if found is None:
        raise NotReady("model control: what the server serves cannot be read from its board")
    return found


def _folders(root: Path) -> list[str]:
    """The model folders of ``root``, by name (hidden ones are not models).

    :raises NotReady: when ``root`` cannot be listed (a storage outage: nothing changes).
    """
    try:
        return sorted(
            entry.name
            for entry in os.scandir(root)
            if not entry.name.startswith(".") and entry.is_dir()
        )  # fmt: skip
    except OSError as exc:
        raise NotReady(
            f"model control: cannot list the repository {root}: {exc.strerror or exc}; "
            "nothing changed"
        ) from None


def _folder(root: Path, name: str) -> None:
    """:raises ModelNotFound: when ``root`` has no model folder ``name``."""
    if name not in _folders(root):
        raise ModelNotFound.in_repository(name, _folders(root))


def _root(settings: Settings, name: str) -> Path:
    if not settings.controls_explicitly() or settings.model_repository is None:
        raise ControlRefused(
            name, "models are loaded and unloaded by API only under "
            "SERVING_MODEL_CONTROL=explicit with a SERVING_MODEL_REPOSITORY"
        )  # fmt: skip
    return settings.model_repository


def _board() -> Board:
    board = installed_board()
    if board is None:
        raise NotReady(
            "model control needs the server's Gunicorn master (gunicorn wsgi:app -c "
            "gunicorn.conf.py)"
        )
    return board


@contextlib.contextmanager
def _locked(board: Board) -> Iterator[None]:
    with open(board.path / _LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _applied(board: Board) -> dict[str, Any] | None:
    try:
        note = json.loads((board.path / _APPLIED).read_text())
        return {
            "changes": int(note["changes"]),
            "generation": int(note["generation"]),
            "error": note.get("error"),
        }
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _replace(path: Path, data: dict[str, Any]) -> None:
    temporary = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    temporary.write_text(json.dumps(data))
    os.replace(temporary, path)
