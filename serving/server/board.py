"""What the workers of one server know about each other: a board of state files.

Gunicorn workers share nothing but the listening socket, so each one publishes its state in
a small JSON file named after its pid in a directory the master creates before the first
fork (``Board``). The master removes a dead worker's file in ``child_exit`` and the whole
directory when it exits. States::

    starting  first boot: loads while accepting (probes answer, predicts get 503)  counted
    warming   after first boot: loads before accepting                         not counted
    failed    after first boot: its load failed; retried with backoff, not accepting
    ready     every model loaded and batching, accepting                            counted
              (with a stage and a model: loading a change in place beside them; with
              an error: a change in place failed, it serves what it served before)
    leaving   stopped accepting (recycling), answering what it accepted       not counted
    stopping  stopped by the master (a reload, SIGTTOU), answering what it accepted

Each file also says the worker's generation: the number of reloads (``SIGHUP``) the master
had done when it forked the worker, so a fleet serving two model generations at once shows
in ``/healthz`` (``generations``, ``"rollout": "in_progress"``) until the rollover is over.

The server is ready (``Fleet.ready``) when at least one worker is counted and every counted
worker is ready. A worker that is ``warming`` or ``failed`` takes no connections, so it
cannot make a request fail; it only shows up in ``/healthz``. The master reads the board to
roll workers over (``serving.server.rollover``), the workers to recycle one at a time
(``serving.server.recycling``), the probes through ``readiness``.

Imports only the standard library.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

__all__ = [
    "GOING",
    "Board",
    "Death",
    "Fleet",
    "WorkerState",
    "alive",
    "install_board",
    "installed_board",
    "server_stopping",
    "write_json",
    "readiness",
]

WorkerState = Literal["starting", "warming", "failed", "ready", "leaving", "stopping"]
_COUNTED = ("starting", "ready")
#: The states of a worker on its way out: it accepts nothing new.
GOING = ("leaving", "stopping")
#: The master's note of a reload it refused (not a pid: skipped as a worker's file).
_RELOAD = "reload"
#: ``Board.locked``'s lock per name among this process's threads (record locks are not).
_THREAD_LOCKS: dict[str, threading.Lock] = {}
#: The master's note of the last workers that died while loading (``Board.deaths``).
_DEATHS = "deaths"
_DEATHS_KEPT = 16


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a signal 0 reaches it, or it is another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Death(NamedTuple):
    """A worker that died while it loaded model ``name`` at ``version`` (a crash in
    native code: it left no error), and its generation (None: unknown)."""

    pid: int
    generation: int | None
    name: str
    version: str


@dataclass(frozen=True)
class Fleet:
    """The workers of this server as their state files say: ``ready`` and ``total`` count
    the workers that accept connections (``starting`` or ``ready``)."""

    states: dict[int, WorkerState]
    errors: dict[int, str] = field(default_factory=dict)
    #: What each loading worker is doing (``model 'churn': warming up``).
    stages: dict[int, str] = field(default_factory=dict)
    #: Each worker's generation (reloads before its fork), where its file says.
    generations: dict[int, int] = field(default_factory=dict)
    #: The last reload the master refused, ``(its pid, why)``, until the next reload.
    refused: tuple[int, str] | None = None
    #: The model version each failed worker could not load, ``(name, version)``.
    failed_models: dict[int, tuple[str, str]] = field(default_factory=dict)

    @property
    def ready_count(self) -> int:
        return sum(state == "ready" for state in self.states.values())

    @property
    def total(self) -> int:
        return sum(state in _COUNTED for state in self.states.values())

    @property
    def ready(self) -> bool:
        return self.total > 0 and self.ready_count == self.total

    def count(self, state: WorkerState) -> int:
        return sum(s == state for s in self.states.values())

    def failed(self, pid: int) -> bool:
        """Whether worker ``pid`` could not load what its generation serves: ``failed``,
        or ``ready`` with an error (a change in place that failed: it serves on what it
        served before, ``serving.server.worker_change``)."""
        state = self.states.get(pid)
        return state == "failed" or (state == "ready" and pid in self.errors)

    def alone(self, generation: int) -> bool:
        """Whether every worker taking requests (not ``leaving`` or ``stopping``) is of
        ``generation``, ready, and loaded all it serves."""
        staying = [pid for pid, state in self.states.items() if state not in GOING]
        return bool(staying) and all(
            self.states[p] == "ready" and p not in self.errors and p not in self.stages
            and self.generations.get(p) == generation
            for p in staying
        )  # fmt: skip

    def summary(self) -> dict[str, Any]:
        """``{"ready": N, "total": M}``, plus ``loading``/``failed`` counts, the stage each
        loading worker is at and the last load error of each failed worker when there are
        any (for ``/healthz``). With a
        failed worker (or one retrying after a failure), ``"rollout": "failed"``: a worker
        forked after the first boot (a reload, respawn or recycle) cannot load the model,
        and the others serve on; so too after a reload the master refused (an invalid
        setting), its error first, under the master's pid. With workers of more than one
        generation (a reload not yet over), ``"rollout": "in_progress"`` unless failed,
        and ``generations``: how many workers of each serve (``ready``) or load."""
        body: dict[str, Any] = {"ready": self.ready_count, "total": self.total}
        loading = self.count("warming") + self.count("starting")
        if loading:
            body["loading"] = loading
        stages = [
            {"pid": pid, "stage": stage}
            for pid, stage in sorted(self.stages.items())
            if self.states.get(pid) in ("warming", "starting", "ready")  # ready: in place
        ]
        if stages:
            body["stages"] = stages
        retrying = [
            p for p in self.errors if self.states.get(p) in ("failed", "warming", "starting")
            or self.failed(p)
        ]  # fmt: skip
        if self.count("failed"):
            body["failed"] = self.count("failed")
        errors = [{"pid": pid, "error": self.errors[pid]} for pid in sorted(retrying)]
        if self.refused is not None:
            errors.insert(0, {"pid": self.refused[0], "error": self.refused[1]})
        if errors:
            body["rollout"] = "failed"
            body["errors"] = errors
        generations = self._generations()
        if len(generations) > 1:
            body.setdefault("rollout", "in_progress")
            body["generations"] = generations
        return body

    def _generations(self) -> list[dict[str, int]]:
        """Per generation of the workers not on their way out: how many serve, and how
        many there are (loading and failed ones too), oldest first."""
        counts: dict[int, list[int]] = {}
        for pid, state in self.states.items():
            if state in GOING or pid not in self.generations:
                continue
            ready_total = counts.setdefault(self.generations[pid], [0, 0])
            ready_total[0] += state == "ready"
            ready_total[1] += 1
        return [
            {"generation": g, "ready": ready, "workers": total}
            for g, (ready, total) in sorted(counts.items())
        ]


class Board:
    """One directory of ``<pid>`` JSON files: each worker's state, readable by all.

    Usage::

        board = Board.create()                  # master, before the first fork
        board.write(os.getpid(), "ready")       # worker
        board.read().ready                      # any process
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        #: This process's generation, written with each state (a worker sets it after
        #: fork); None in the master, whose writes keep the worker's own.
        self.generation: int | None = None

    @classmethod
    def create(cls) -> Board:
        """A new empty directory under the system temporary directory."""
        return cls(Path(tempfile.mkdtemp(prefix="serving-workers-")))

    def write(
        self,
        pid: int,
        state: WorkerState,
        error: str | None = None,
        stage: str | None = None,
        *,
        model: tuple[str, str] | None = None,
    ) -> None:
        """Publish ``pid``'s state atomically (write, then rename over the old file), with
        its load error and the model version ``(name, version)`` it failed on or, while it
        loads, the stage it is at."""
        generation = self.generation if self.generation is not None else self._generation(pid)
        entry = {
            "state": state, "error": error, "stage": stage, "generation": generation,
            "model": list(model) if model is not None else None,
        }  # fmt: skip
        write_json(self.path / str(pid), entry)

    def _generation(self, pid: int) -> int | None:
        """The generation ``pid``'s file says (the master writing a worker's state)."""
        value = self._field(pid, "generation")
        return value if isinstance(value, int) else None

    def state_of(self, pid: int) -> str | None:
        """The state ``pid``'s file says (alive or not), or None."""
        state = self._field(pid, "state")
        return state if isinstance(state, str) else None

    def _field(self, pid: int, name: str) -> Any:
        try:
            return json.loads((self.path / str(pid)).read_text()).get(name)
        except (OSError, ValueError, AttributeError):
            return None

    def loading(self, pid: int) -> tuple[str, str] | None:
        """The model version ``(name, version)`` worker ``pid`` (live or dead) was loading
        when it last wrote, or None: it was not loading, or says no model."""
        try:
            data = json.loads((self.path / str(pid)).read_text())
        except (OSError, ValueError):
            return None
        model = data.get("model") if isinstance(data, dict) else None
        changing = data.get("state") == "ready" and data.get("stage") and not data.get("error")
        loading = data.get("state") in ("starting", "warming") or changing  # boot, in place
        if not loading or not isinstance(model, list):
            return None
        return (str(model[0]), str(model[1])) if len(model) == 2 else None

    def remove(self, pid: int) -> None:
        (self.path / str(pid)).unlink(missing_ok=True)

    def note_reload(self, problem: str | None) -> None:
        """Master, at each reload: why it refused it (``"invalid setting ..."``), shown in
        ``/healthz`` until the next reload, or None (the note removed)."""
        note = self.path / _RELOAD
        if problem is None:
            note.unlink(missing_ok=True)
            return
        write_json(note, {"pid": os.getpid(), "error": problem})

    def note_death(self, pid: int, model: tuple[str, str]) -> None:
        """Master: worker ``pid`` died while it loaded ``model`` ``(name, version)``; kept
        with its generation among the last ``_DEATHS_KEPT`` (``deaths``)."""
        death = {"pid": pid, "generation": self._generation(pid), "model": list(model)}
        write_json(self.path / _DEATHS, {"deaths": [*self._deaths()[-_DEATHS_KEPT + 1 :], death]})

    def deaths(self) -> list[Death]:
        """The last workers that died while loading, oldest first."""
        found = []
        for entry in self._deaths():
            try:
                name, version = entry["model"]
                generation = entry["generation"]
                found.append(Death(int(entry["pid"]), generation, str(name), str(version)))
            except (KeyError, TypeError, ValueError):
                continue
        return found

    def _deaths(self) -> list[Any]:
        try:
            deaths = json.loads((self.path / _DEATHS).read_text())["deaths"]
        except (OSError, ValueError, KeyError, TypeError):
            return []
        return deaths if isinstance(deaths, list) else []

    def read(self) -> Fleet:
        """The state of every live worker with a file (a file whose process is gone, or that
        cannot be parsed, is skipped)."""
        states: dict[int, WorkerState] = {}
        errors: dict[int, str] = {}
        stages: dict[int, str] = {}
        generations: dict[int, int] = {}
        failed: dict[int, tuple[str, str]] = {}
        try:
            entries = list(self.path.iterdir())
        except OSError:
            return Fleet(states)
        for entry in entries:
            if not entry.name.isdigit() or not alive(int(entry.name)):
                continue
            try:
                data = json.loads(entry.read_text())
            except (OSError, ValueError):
                continue
            states[int(entry.name)] = data["state"]
            if data.get("error"):
                errors[int(entry.name)] = data["error"]
            if data.get("stage"):
                stages[int(entry.name)] = data["stage"]
            if isinstance(data.get("generation"), int):
                generations[int(entry.name)] = data["generation"]
            if isinstance(model := data.get("model"), list) and len(model) == 2:
                failed[int(entry.name)] = (str(model[0]), str(model[1]))
        return Fleet(states, errors, stages, generations, self._refused(), failed)

    def _refused(self) -> tuple[int, str] | None:
        """The master's note of the last reload it refused: ``(pid, error)``, or None."""
        try:
            note = json.loads((self.path / _RELOAD).read_text())
            return int(note["pid"]), str(note["error"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    @contextlib.contextmanager
    def locked(self, name: str) -> Iterator[int]:
        """Hold the board's lock ``name`` (a file beside the states) against every other
        process and thread; yields the lock file's descriptor (its content is the
        holder's to read and write). A POSIX record lock: the kernel releases it when
        its process dies, and a process the holder forks does not hold it. (A
        ``multiprocessing.Lock`` stayed taken for good when its holder was killed.)"""
        with _THREAD_LOCKS.setdefault(name, threading.Lock()):  # record locks are per process
            fd = os.open(self.path / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX)
                yield fd
            finally:
                os.close(fd)  # releases the lock

    def destroy(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` as JSON atomically (a temporary file, then renamed over
    it): a reader in another process sees the old file or the new one, whole."""
    temporary = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    temporary.write_text(json.dumps(data))
    os.replace(temporary, path)


def _never() -> bool:
    return False


_installed: Board | None = None
_stopping: Callable[[], bool] = _never


def install_board(board: Board, stopping: Callable[[], bool] = _never) -> None:
    """Make ``board`` this server's (the master, before the first fork); ``stopping()``
    says whether the master is stopping the whole server (not a reload)."""
    global _installed, _stopping
    _installed, _stopping = board, stopping


def server_stopping() -> bool:
    """Whether the master is stopping the whole server (``install_board``'s)."""
    return _stopping()


def installed_board() -> Board | None:
    """This server's board (``install_board``), or None outside our Gunicorn hooks."""
    return _installed


def readiness(local_state: str) -> tuple[bool, dict[str, Any] | None]:
    """Whether this server is ready, given this worker's models' state, and the workers'
    summary for the probes (None outside our Gunicorn hooks: then this worker is all)."""
    board = _installed
    if board is None:
        return local_state == "ready", None
    fleet = board.read()
    return local_state == "ready" and fleet.ready, fleet.summary()
