"""A change of the model repository that the running workers take in place.

A reload rolls every worker over: new workers are forked, load every model and replace
the old ones (``serving.server.rollover``). The pickle, joblib and skops models they
inherit from the master cost them nothing, but each of them loaded an ONNX model, your
own class's model or a compiled tree model again at every change of any other model.
So a change the poller, the quarantine or a load or unload call asked for, that leaves
every server setting as it was and that adds, replaces or drops only models loaded in
each worker, is not a rollover:

- the master writes a ``Plan`` on the board (``publish``): its next generation, its
  settings and the model versions they serve;
- each worker (``serving.server.worker_change``) loads the versions it does not hold
  beside those it serves, warms them up, then serves the new set, keeps serving every
  other version as it was (not read again), and stops the versions the plan drops once
  the requests they hold are answered.

A change that adds, replaces or drops a model the master shares still rolls the
workers over: a worker forked before the master loaded a new version cannot get that
copy, and a worker dropping its inherited copy would write to every page of it. So does
a ``SIGHUP`` someone sends (it may be for ``gunicorn.conf.py``) and any change of a
server setting (``why_rolled``), and any change while a rollover is not over
(``why_unsettled``).

Imports the standard library and ``serving`` settings only; the plan travels as a
pickle in the board's own directory (its mode 0700: only this server's user reads it).
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from serving.model.artifacts import file_identity
from serving.model_settings import ModelSettings
from serving.server import sharing
from serving.server.board import GOING, Board, Fleet
from serving.server.sharing import is_shared, models_of
from serving.settings import Settings

__all__ = [
    "ASK_EXPIRES_S",
    "Asks",
    "Plan",
    "ask_reload",
    "identities",
    "loaded_as",
    "plan_path",
    "publish",
    "read_plan",
    "tried",
    "asks",
    "changes",
    "why_rolled",
    "why_unsettled",
]

_PLAN = "plan.pickle"
#: Seconds an ask waits for its reload: one whose SIGHUP merged with another's (the
#: kernel keeps one pending signal of a kind) is then no longer taken.
ASK_EXPIRES_S = 30.0


class Asks:
    """The reloads the server asked for itself and the master has not taken yet: each
    ask (the poller's, the quarantine's, a load or unload call's) is one ``SIGHUP``, and
    each reload takes one. A reload with none to take was sent by someone else."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._when: list[float] = []

    def add(self, count: int = 1) -> None:
        with self._lock:
            self._when.extend([time.monotonic()] * count)

    def take(self) -> bool:
        """Whether this reload is one the server asked for (taken: one fewer pending)."""
        with self._lock:
            now = time.monotonic()
            self._when = [at for at in self._when if now - at <= ASK_EXPIRES_S]
            return bool(self._when and self._when.pop(0))


#: The master's asks (``ask_reload``, and the calls hooks counts at each reload).
asks = Asks()

#: What the master read of each model version it serves: its settings (as JSON) -> the
#: file's identity then.
Identities = Mapping[str, tuple[int, ...] | None]


@dataclass(frozen=True)
class Plan:
    """What the workers serve from ``generation`` on: ``models`` (``models_of(settings)``),
    in order, and ``settings`` (the repository's refusals and labels with them)."""

    generation: int
    settings: Settings
    models: tuple[ModelSettings, ...]


def ask_reload() -> None:
    """Master, from a thread of its own (the repository's poller, the quarantine): ask
    for a reload, which may be taken in place (``asks``)."""
    asks.add()
    os.kill(os.getpid(), signal.SIGHUP)


def loaded_as(model: ModelSettings) -> str:
    """What makes ``model`` the version it is, as JSON: its settings but its TF Serving
    labels (a label moved changes no version: the workers move it in place)."""
    return model.model_dump_json(exclude={"labels"})


def identities(models: Sequence[ModelSettings]) -> dict[str, tuple[int, ...] | None]:
    """Each model's settings (``loaded_as``) and its file's identity now
    (``file_identity``)."""
    return {loaded_as(model): file_identity(model.path) for model in models}


def why_rolled(
    old: Settings,
    new: Settings,
    old_models: Sequence[ModelSettings],
    new_models: Sequence[ModelSettings],
    read: Identities,
) -> str | None:
    """Why the change from ``old`` to ``new`` settings cannot be taken in place, or None
    when it can. ``read``: the identities of ``old_models``' files when they were
    loaded (``identities``), so a file replaced under the same settings counts as a
    change."""
    if old.model_repository is None:
        return "no model repository"
    if old.model_dump() != new.model_dump():
        return "a server setting changed"
    changed, dropped = changes(old_models, new_models, read)
    served = {f"{m.name}/{m.version}" for m in old_models}
    loads = dict.fromkeys(f"{m.name}/{m.version}" for m in changed if is_shared(m))
    drops = list(dict.fromkeys(f"{m.name}/{m.version}" for m in dropped if is_shared(m)))
    parts = [
        f"{verb} {', '.join(names)}"
        for verb, names in (
            ("reloads", [n for n in loads if n in served]),  # another file, or settings
            ("loads", [n for n in loads if n not in served]),
            ("drops", [n for n in drops if n not in loads]),
        )
        if names
    ]
    if parts:
        return f"{', '.join(parts)}: loaded once in the master and shared"
    return None


def why_unsettled(fleet: Fleet, workers: Iterable[int], rolled_at: int) -> str | None:
    """Why the master's ``workers`` cannot take a change in place now, or None: each one
    not on its way out must be ``ready`` and of the last rollover (generation
    ``rolled_at``) or a later change in place (one that has not read the last plan yet
    takes the newest when it does). A rollover still going on (its new workers loading,
    or failing) is left to the rollover: its old workers serve what an older rollover
    chose."""
    for pid in workers:
        state = fleet.states.get(pid)
        if state in GOING:
            continue
        born = fleet.generations.get(pid)
        if state != "ready" or born is None or born < rolled_at:
            return f"worker {pid} is {state or 'starting'}, of generation {born}"
    return None


def changes(
    old_models: Sequence[ModelSettings], new_models: Sequence[ModelSettings], read: Identities
) -> tuple[list[ModelSettings], list[ModelSettings]]:
    """The versions of ``new_models`` to load (not in ``old_models``, or from another
    file than ``read`` says) and those of ``old_models`` to drop."""
    now = identities(new_models)
    served = {loaded_as(model) for model in old_models}
    changed = [
        model for model, key in zip(new_models, now, strict=True)
        if key not in served or read.get(key) != now[key]
    ]  # fmt: skip
    dropped = [model for model in old_models if loaded_as(model) not in now]
    return changed, dropped


def tried(
    old: Settings,
    new: Settings,
    read: Identities,
    meanwhile: Callable[[], None],
    say: Callable[[str], None],
) -> tuple[str | None, bool]:
    """Master: the versions the workers would load for ``new``, loaded first in a
    separate process (``sharing.tried``): why the running workers must not load them (a
    load that crashes or hangs its process: new workers take it in a rollover, where a
    death takes no serving worker down), or None; and whether a stop signal came."""
    fresh, _ = changes(models_of(old), models_of(new), read)
    if not fresh:
        return None, False
    labels = ", ".join(f"{model.name}/{model.version}" for model in fresh)
    say(f"model repository: loading {labels} in a separate process first (a trial)")
    why, stopped_by = sharing.tried(fresh, new, meanwhile)
    if why is None:
        return None, stopped_by is not None
    return f"a trial load of {labels} in a separate process {why}", False


def publish(board: Board, plan: Plan) -> None:
    """Master: make ``plan`` the one the workers follow (written whole, then renamed)."""
    path = plan_path(board)
    temporary = path.with_name(f".{_PLAN}.tmp")
    with temporary.open("wb") as out:
        pickle.dump(plan, out, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(temporary, path)


def plan_path(board: Board) -> Path:
    """Where ``publish`` writes the plan (a worker looks at its mtime)."""
    return board.path / _PLAN


def read_plan(board: Board, newer_than: int) -> Plan | None:
    """Worker: the plan on the board when it is of a generation after ``newer_than``,
    else None (none yet, or one this worker follows already)."""
    path = plan_path(board)
    try:
        with path.open("rb") as source:
            plan = pickle.load(source)
    except (OSError, EOFError, pickle.UnpicklingError):
        return None
    return plan if isinstance(plan, Plan) and plan.generation > newer_than else None
