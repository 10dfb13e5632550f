"""Worker: take a change of the model repository in place (``serving.server.in_place``).

``follow`` starts a thread that looks at the board's plan every ``LOOK_S`` seconds. When
the master publishes a newer generation, the worker, once it serves, applies it
(``apply``), one worker at a time (a lock on the board): a load that kills its process
(a crash in native code) takes one worker down, not every worker at once, and the
others keep their CPUs for requests meanwhile. A worker whose turn comes after another
failed the plan, or died loading it, does not try: it says that worker's error and
serves on.

1. every version of the plan this worker serves already, from the same settings and the
   same file (``ModelRuntime.file_identity``), is kept as it is: not read again, its
   batcher and its queue untouched;
2. the others are loaded and warmed up one after another, beside the versions served,
   while the worker is ``ready`` on the board with the stage it is at and the version it
   loads (a crash names it, as in a worker's boot);
3. once all have loaded, the new set serves (``install_cache``) and the worker says the
   new generation; the versions the plan drops stop ``DROP_AFTER_S`` later (a request
   that found one just before answers), answering what they hold;
4. when one fails, the new ones are stopped and the worker serves on what it served,
   ``ready`` of the new generation with the error and the version it failed on: the
   quarantine leaves the version out, a load call answers 400 and undoes it.

Imports the standard library at module level; ``serving.cache`` (and with it
prometheus-client) only in the worker, when a plan comes.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from serving.server import sharing
from serving.server.board import GOING, Board
from serving.server.in_place import Plan, loaded_as, plan_path, read_plan
from serving.server.worker_boot import load_error_line

__all__ = ["DROP_AFTER_S", "LOOK_S", "apply", "follow", "leave"]

_LOCK = "change.lock"
#: Seconds between two looks at the plan's file (a ``stat``).
LOOK_S = 0.25
#: Seconds a dropped version keeps its batcher after the new set serves: a request that
#: resolved it just before the swap still gets its answer.
DROP_AFTER_S = 2.0


def follow(
    board: Board, change: Callable[[Plan], object], say: Callable[[str], None]
) -> threading.Thread:
    """Worker: a daemon thread calling ``change(plan)`` for each plan newer than the
    worker's generation, once its models serve (returned, started); what it raises is
    said with ``say`` (the thread goes on: one that died would take no change again)."""

    def run() -> None:
        from serving.cache import installed_cache

        seen: int | None = None
        while True:
            time.sleep(LOOK_S)
            try:
                mtime = plan_path(board).stat().st_mtime_ns
            except OSError:
                continue
            cache = installed_cache()
            if mtime == seen or cache is None or cache.state != "ready":
                continue  # a worker still loading applies it once it serves
            if _leaving or board.state_of(os.getpid()) in GOING:
                continue  # stopped by a rollover (or leaving): the newer workers take it
            plan = read_plan(board, board.generation if board.generation is not None else -1)
            seen = mtime
            if plan is None:
                continue
            try:
                change(plan)
            except Exception as exc:
                say(f"worker {os.getpid()}: generation {plan.generation} not taken: {exc!r}")

    thread = threading.Thread(target=run, name="serving-worker-change", daemon=True)
    thread.start()
    return thread


def apply(
    plan: Plan,
    board: Board,
    *,
    slot: int,
    on_problem: Callable[[str], None],
    log: Any,
) -> bool:
    """Serve ``plan`` in place of the installed models (see the module docstring); True
    when it serves, False when a version failed (logged, and said on the board)."""
    global _held
    with _Turn(board) as turn:
        _held = turn
        try:
            return _apply(plan, board, turn, slot=slot, on_problem=on_problem, log=log)
        finally:
            _held = None


#: The turn this process holds while it loads a change, and whether it is leaving.
_held: _Turn | None = None
_leaving = False


def leave(board: Board) -> None:
    """Worker, as it exits on its own (``worker_exit``: a recycle, a ``SIGTERM``): a
    change it is loading is not taken, and not said as a death: its note in the turn
    is cleared (the next worker takes the change) and the board says it is leaving,
    not loading, when the master reads it at its exit."""
    global _leaving
    _leaving = True
    turn = _held
    if turn is not None:
        turn.clear()
        board.write(os.getpid(), "leaving")


class _Turn:
    """The board's change lock, held by the one worker loading a change (the kernel
    releases it should that process die; a process it forks does not hold it), and its
    note of the version it loads: a note the next holder finds is a worker that died
    loading (the master learns of the death only after the lock is free)."""

    def __init__(self, board: Board) -> None:
        self._lock = board.locked(_LOCK)
        self.fd = -1
        #: The note found on taking the lock: ``{"pid", "generation", "model"}``, or None.
        self.left: dict[str, Any] | None = None

    def __enter__(self) -> _Turn:
        self.fd = self._lock.__enter__()
        with contextlib.suppress(ValueError):
            note = json.loads(os.pread(self.fd, 4096, 0) or b"null")
            self.left = note if isinstance(note, dict) else None
        return self

    def note(self, generation: int, model: tuple[str, str]) -> None:
        if _leaving:  # the process exits on its own: no death to note
            return
        os.ftruncate(self.fd, 0)
        entry = {"pid": os.getpid(), "generation": generation, "model": list(model)}
        os.pwrite(self.fd, json.dumps(entry).encode(), 0)

    def clear(self) -> None:
        with contextlib.suppress(OSError):
            os.ftruncate(self.fd, 0)

    def __exit__(self, *exc: object) -> None:
        self.clear()
        self._lock.__exit__(None, None, None)

    def died(self, generation: int) -> tuple[str, tuple[str, str]] | None:
        """The worker that died loading ``generation`` (or a later one) while it held the
        lock, as ``(why, version)``, or None."""
        note = self.left
        try:
            if note is None or int(note["generation"]) < generation:
                return None
            name, version = (str(part) for part in note["model"])
            return f"worker {note['pid']} died while loading {name}/{version}", (name, version)
        except (KeyError, TypeError, ValueError):
            return None


def _failed_before(
    board: Board, turn: _Turn, generation: int
) -> tuple[str, tuple[str, str]] | None:
    """Why another worker could not take ``generation`` (or a later one) and the version
    it failed on, or None."""
    if (died := turn.died(generation)) is not None:
        return died
    fleet, me = board.read(), os.getpid()
    for pid in sorted(fleet.errors):
        model = fleet.failed_models.get(pid)
        newer = fleet.generations.get(pid, -1) >= generation
        if pid != me and fleet.failed(pid) and newer and model is not None:
            return fleet.errors[pid], model
    for death in board.deaths():
        if death.generation is not None and death.generation >= generation:
            why = f"worker {death.pid} died while loading {death.name}/{death.version}"
            return why, (death.name, death.version)
    return None


def _apply(
    plan: Plan,
    board: Board,
    turn: _Turn,
    *,
    slot: int,
    on_problem: Callable[[str], None],
    log: Any,
) -> bool:
    from serving.cache import ModelCache, install_cache, installed_cache, labels_of, load_runtime
    from serving.observe.metrics import default_metrics
    from serving.runtime import ModelRuntime

    pid, metrics = os.getpid(), default_metrics()
    cache = installed_cache()
    assert cache is not None
    runtimes, fresh = [], []
    for model in plan.models:
        runtime = _served(cache.runtimes, model)
        if runtime is None:
            runtime = ModelRuntime(model, metrics, slot, inherited=sharing.inherited(model))
            fresh.append(runtime)
        runtimes.append(runtime)
    dropped = [runtime for runtime in cache.runtimes if runtime not in runtimes]
    board.generation = plan.generation
    if fresh and (before := _failed_before(board, turn, plan.generation)) is not None:
        why, failed_on = before
        log.error("worker %s: not taking generation %s in place (%s); serving on what it "
                  "served", pid, plan.generation, why)  # fmt: skip
        _write(board, why, model=failed_on)
        return False
    if fresh or dropped:
        log.info(
            "worker %s: changing in place (generation %s): loading %s, dropping %s; %d "
            "other version(s) serve on", pid, plan.generation, _labels(fresh) or "nothing",
            _labels(dropped) or "nothing", len(runtimes) - len(fresh),
        )  # fmt: skip
    for runtime in fresh:
        loading = (runtime.model_name, runtime.model_version)

        def report(stage: str, loading: tuple[str, str] = loading) -> None:
            _write(board, None, stage, model=loading)

        runtime.on_stage = report
        turn.note(plan.generation, loading)
        error = load_runtime(runtime)
        if error is not None:
            why = load_error_line(error)
            metrics.model_load_failed(*loading)
            log.error(
                "worker %s: %s/%s could not be loaded (%s); serving on what it served",
                pid, *loading, why,
            )  # fmt: skip
            _write(board, why, model=loading)
            for each in fresh:  # one given up past its time ends unserved (ModelRuntime)
                each.on_stage = None
            _stop_later(fresh, 0.0, metrics)
            return False
    labels = labels_of(plan.models)  # moved with the new set, not before it serves
    replacement = ModelCache(runtimes, plan.settings.refused_models(), labels)
    install_cache(replacement)
    cache.retire()
    replacement.start_watchdog(on_problem)
    _write(board)
    _stop_later(dropped, DROP_AFTER_S, metrics, plan.settings.drain_timeout_s)
    return True


def _write(board: Board, error: str | None = None, stage: str | None = None, **model: Any) -> None:
    """Say on the board that this worker serves (with ``error``, or the ``stage`` it is
    at), unless it is on its way out: leaving or stopping (its state stays that), or
    exiting (``leave``)."""
    pid = os.getpid()
    if not _leaving and board.state_of(pid) not in GOING:
        board.write(pid, "ready", error, stage, **model)


def _served(runtimes: list[Any], model: Any) -> Any:
    """The runtime of ``runtimes`` serving ``model`` from the same settings (but its
    labels) and the same file as now, or None."""
    from serving.model.artifacts import file_identity

    now = file_identity(model.path)  # None: gone since the master read it, kept as served
    for runtime in runtimes:
        if (
            loaded_as(runtime.settings) == loaded_as(model)
            and runtime.state == "ready"
            and now in (runtime.file_identity, None)
        ):
            return runtime
    return None


def _stop_each(runtimes: list[Any], drain_s: float, metrics: Any) -> None:
    """Stop each of ``runtimes`` (answering what it holds, ``drain_s`` seconds for all)
    and take it out of the list."""
    deadline = time.monotonic() + drain_s
    while runtimes:
        runtime = runtimes.pop(0)
        runtime.stop(max(0.0, deadline - time.monotonic()))
        if runtime.handle is not None and runtime.loaded_at is not None:
            metrics.model_unloaded(runtime.handle)


def _give_back_memory() -> None:
    """Collect what the dropped versions left in the young generations and hand the freed
    heap back to the system (glibc's ``malloc_trim``: an ONNX Runtime session freed
    leaves its pages in the allocator's arenas, which grew the worker by each version
    dropped). Their models are freed by their references alone (no reference cycle holds
    one); a full collection held the GIL 78 ms in a worker with pandas, scikit-learn and
    ONNX Runtime imported (a 2-vCPU EPYC), every request waiting, at each change."""
    gc.collect(1)
    with contextlib.suppress(OSError, AttributeError):
        _libc().malloc_trim(0)


@functools.cache
def _libc() -> Any:
    return ctypes.CDLL("libc.so.6")  # once: each CDLL made is a reference cycle


def _labels(runtimes: list[Any]) -> str:
    return ", ".join(f"{r.model_name}/{r.model_version}" for r in runtimes)


def _stop_later(runtimes: list[Any], after_s: float, metrics: Any, drain_s: float = 0) -> None:
    """Stop ``runtimes`` in a daemon thread ``after_s`` seconds from now, each answering
    what it holds (``drain_s`` seconds for all), and zero the gauges of those that served
    (``ServingMetrics.model_unloaded``)."""
    if not runtimes:
        return

    def run() -> None:
        time.sleep(after_s)
        _stop_each(runtimes, drain_s, metrics)
        _give_back_memory()  # none of them referenced here any more: freed already

    threading.Thread(target=run, name="serving-drop-versions", daemon=True).start()
