"""Explicit model control (``SERVING_MODEL_CONTROL=explicit``): which models of the
repository the server serves, changed only by ``POST /v2/repository/models/{name}/load``
and ``/unload`` (Triton's model control mode of that name).

What is wanted is one file on the board (``Wanted``): each model to serve with the
``config.json`` fields its load gave and the versions its load picked, and a number
counting the changes. A call goes:

    worker   checks the call (``load``, ``unload``), works out what the master will serve
             with it (the versions a load picks; nothing past ``SERVING_MAX_MODELS``),
             writes it under a lock (several workers may take calls at once) and sends
             the master SIGHUP: the reload every change goes through
    master   at the reload: serves what is wanted (``Settings.selecting``), and notes the
             change number it read and the generation it forks
             (``serving.server.applied.note_applied``)
    worker   waits on the board (``serving.server.applied.outcome``): over when every
             worker is of that generation or newer and ready (or, for an older one,
             gone; the answering worker excepted); failed when the master refused the
             reload or a worker of it could not load this model: its change is then
             undone (the old workers served throughout) and the reason answered. A
             failure of another model (a call at the same time) is that call's to undo:
             this one waits on.

A model's versions are those its last load picked: a version added to the repository is
served once a load names the model (a ``SIGHUP`` changes nothing), so a broken new version
of one model cannot fail the calls about another. At start every model of the repository
is served (as Triton's ``--load-model=*``) and wanted (``begin``). The board goes when
the master exits, so a restart serves every model again.

Imports only the standard library, ``serving.errors``, ``serving.repository`` and the
settings.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serving.errors import (
    ControlRefused,
    ControlTimeout,
    LoadFailed,
    ModelNotFound,
    NotReady,
)
from serving.model_settings import ModelSpec
from serving.repository import OVER_LIMIT, UNLOADED, Loaded, Refusal, scan
from serving.server.applied import outcome
from serving.server.board import Board, installed_board, write_json
from serving.settings import Settings

__all__ = [
    "Wanted",
    "begin",
    "changes",
    "deadline_s",
    "explain",
    "load",
    "unload",
    "wanted",
]

_WANTED = "explicit.json"
_LOCK = "explicit.lock"


@dataclass(frozen=True)
class Wanted:
    """The models to serve (name -> its load's config and versions), the number of
    changes made so far, and why the last load of each model not served failed."""

    models: dict[str, Loaded]
    changes: int = 0
    failed: dict[str, str] = field(default_factory=dict)


def wanted(board: Board) -> Wanted | None:
    """What is wanted (``begin``, then each call), or None without explicit control."""
    try:
        data = json.loads((board.path / _WANTED).read_text())
        models = {
            name: Loaded(entry["config"], tuple(entry["versions"]))
            for name, entry in data["models"].items()
        }
        failed = {str(k): str(v) for k, v in data.get("failed", {}).items()}
        return Wanted(models, int(data["changes"]), failed)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def explain(board: Board | None, refused: Sequence[Refusal]) -> list[Refusal]:
    """``refused`` (the repository's entries not served), where a model's last load failed
    saying why: a model not served in its ``unloaded`` entry, one that serves on as
    before in an entry of its own (version ``""``)."""
    current = wanted(board) if board is not None else None
    if current is None or not current.failed:
        return list(refused)
    failed = current.failed
    explained = [
        Refusal(r.model, r.version, f"{r.reason} (its last load failed: {failed[r.model]})")
        if r.reason == UNLOADED and not r.version and r.model in failed
        else r
        for r in refused
    ]
    served = [name for name in failed if name in current.models]  # serving on as before
    return explained + [Refusal(n, "", f"its last load failed: {failed[n]}") for n in served]


def begin(board: Board, served: Sequence[ModelSpec]) -> None:
    """Master, once before the first fork: the model versions it serves at start are what
    is wanted (a model folder added later is served once a load names it)."""
    models: dict[str, Loaded] = {}
    for spec in served:
        before = models.get(spec.name, Loaded(None, ()))
        models[spec.name] = Loaded(None, (*(before.versions or ()), spec.version))
    _put(board, Wanted(models, 0))


def changes(board: Board) -> int:
    """The number of load and unload calls made so far (master, at each reload, before it
    re-reads the settings: they apply at least these)."""
    current = wanted(board)
    return current.changes if current is not None else 0


def load(settings: Settings, name: str, config: Mapping[str, Any] | None) -> None:
    """Serve model ``name`` of the repository with the versions its policy picks now (a
    model served already: again, picking up its new versions and ``config.json``), with
    ``config``'s fields in place of its file's when given; returns once every worker
    serves it.

    :raises ModelNotFound: no such model folder. :raises LoadFailed: it has no version
        to serve (each reason), or a worker could not load it. :raises ControlRefused:
        it would pass ``SERVING_MAX_MODELS``. :raises ControlTimeout: past
        ``deadline_s(settings)``. :raises NotReady: outside the server's Gunicorn
        master, when the repository cannot be read, or when the server stops meanwhile.
    """
    root, board = _root(settings, name), _board()
    _folder(root, name)
    with _locked(board):
        current = _current(board)
        models = current.models | {name: Loaded(config, None)}
        found = _scan(settings, root, models)
        over = [f"{r.model}/{r.version}" for r in found.refused if r.reason.startswith(OVER_LIMIT)]
        if over:
            raise ControlRefused(
                name, f"serving it would pass SERVING_MAX_MODELS={settings.max_models} model "
                f"versions ({', '.join(over[:5])} left out): unload a model first"
            )  # fmt: skip
        mine = [spec.version for spec in found.specs if spec.name == name]
        if not mine:
            reasons = [
                f"{r.version}: {r.reason}" if r.version else r.reason
                for r in found.refused
                if r.model == name
            ]
            raise LoadFailed(
                name, "nothing to serve (" + "; ".join(reasons or ["no version"]) + ")"
            )
        before = current.models.get(name)
        entry = Loaded(dict(config) if config is not None else None, tuple(mine))
        number = _write(board, current, name, entry)
    _apply(board, name, number, before=before, entry=entry, settings=settings)


def unload(settings: Settings, name: str) -> None:
    """Stop serving model ``name``; returns once no worker serves it. Unloading a model
    not served changes nothing.

    :raises ModelNotFound: no such model folder. :raises ControlRefused: it is the last
        model served. :raises LoadFailed, ControlTimeout, NotReady: as ``load``.
    """
    root, board = _root(settings, name), _board()
    with _locked(board):
        current = _current(board)
        before = current.models.get(name)
        if before is None:
            _folder(root, name)
            return
        if set(current.models) == {name}:
            raise ControlRefused(name, "the last model served cannot be unloaded")
        number = _write(board, current, name, None)
    _apply(board, name, number, before=before, entry=None, settings=settings)


def deadline_s(settings: Settings) -> float:
    """Longest a call waits for its outcome: a load's time and a drain's."""
    return settings.load_timeout_s + settings.drain_timeout_s


def _apply(
    board: Board,
    name: str,
    number: int,
    *,
    before: Loaded | None,
    entry: Loaded | None,
    settings: Settings,
) -> None:
    """Have the master apply change ``number`` and wait for its outcome; a failed one is
    undone (``name`` back to ``before``) unless a later call changed it again."""
    os.kill(os.getppid(), signal.SIGHUP)
    try:
        failed = outcome(board, number, deadline_s(settings), name)
    except TimeoutError:
        raise ControlTimeout(name, deadline_s(settings)) from None
    with _locked(board):
        current = _current(board)
        mine = current.models.get(name) == entry  # not changed by a later call
        if failed is not None and mine:
            number = _write(board, current, name, before, failed=failed.why[:300])
    if failed is None:
        if not mine:  # a later call on this model, applied by the same reload
            raise ControlRefused(name, "a later call on this model was applied with this one")
        return
    if mine:  # undone; answered once the workers serve as before (so does the index)
        os.kill(os.getppid(), signal.SIGHUP)
        with contextlib.suppress(TimeoutError, NotReady):
            outcome(board, number, deadline_s(settings))
    if failed.other:
        raise NotReady(f"model {name!r}: the reload failed on another model: {failed.why}; "
                       "serving on as before")  # fmt: skip
    raise LoadFailed(name, f"{failed.why}; serving on as before")


def _scan(settings: Settings, root: Path, models: Mapping[str, Loaded]) -> Any:
    """What the master would serve of ``models``.

    :raises NotReady: when the repository cannot be read.
    """
    try:
        return scan(
            root, loaded=models, max_models=settings.max_models,
            allow_world_writable=settings.allow_world_writable_model,
        )  # fmt: skip
    except OSError as exc:
        raise NotReady(f"model control: cannot read {root}: {exc.strerror or exc}") from None


def _write(
    board: Board, current: Wanted, name: str, entry: Loaded | None, failed: str | None = None
) -> int:
    """``current`` with ``name``'s entry ``entry`` (None: not wanted) and why its last
    load failed (``failed``; None: it did not), written; its number."""
    models = dict(current.models)
    reasons = {k: v for k, v in current.failed.items() if k != name}
    if failed is not None:
        reasons[name] = failed
    if entry is None:
        models.pop(name, None)
    else:
        models[name] = entry
    _put(board, Wanted(models, current.changes + 1, reasons))
    return current.changes + 1


def _put(board: Board, wanted: Wanted) -> None:
    models = {
        name: {"config": entry.config, "versions": list(entry.versions or ())}
        for name, entry in wanted.models.items()
    }
    data = {"models": models, "changes": wanted.changes, "failed": wanted.failed}
    write_json(board.path / _WANTED, data)


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
