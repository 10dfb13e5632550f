"""Load once, fork many: the master loads a model before it forks and every worker shares it.

Under ``SERVING_SHARE_MODEL=auto`` the Gunicorn master reads, checks (owner, mode,
SHA-256) and loads each pickle, joblib and skops model (``serving.loading``) before the
first fork (``when_ready``) and again on each ``SIGHUP`` (``on_reload``), then freezes the
garbage collector (``gc.freeze()``: its header writes would otherwise copy every page of
the model's Python objects into each worker). Workers forked afterwards, the first ones,
respawns, ``max_requests`` recycles, ``SIGTTIN`` forks, inherit the loaded objects:
``ModelRuntime`` pins BLAS, warms up and starts its batcher on them, reading no file.
Pages written before fork stay shared while no process writes them; a forest's node arrays
and a linear model's weights are numpy or C buffers that predict only reads.

What the master never does: call predict. BLAS and OpenMP start their thread pools on
first use, and a child forked from a parent with a live pool can hang on a lock held by a
thread it does not have. The master also limits BLAS/OpenMP to one thread
(threadpoolctl) after loading.

What stays per worker (``choose``): ONNX models (an ONNX Runtime session's thread pools
and a CUDA context do not survive fork), your own classes (``SERVING_MODEL_CLASS``: their
contract is ``load(path)`` once per worker after fork, and a class may open what cannot be
forked) and everything under ``SERVING_SHARE_MODEL=off``.

A reload keeps the master's object of a model whose entry and file are as they were (the
same name, version, path, format and SHA-256, and a file of the same device, inode, size,
mtime and ctime: a file renamed over it, or written in place, is another), so it is not
read again and the old and new workers share the one copy. It drops the other old
objects before it loads their new files (the old workers keep their copy until they
exit: at most two copies). A load that fails leaves the master with
nothing to hand out: the new workers load for themselves, as with ``off``, fail and retry
while the old ones serve the old model (``serving.server.rollover``).

Every load in the master is bounded by ``SERVING_LOAD_TIMEOUT_S``: it runs on a thread
while the master's own thread waits for it (``_bounded``), so dead workers are still
reaped, and a ``SIGTERM``, ``SIGINT`` or ``SIGQUIT`` ends the wait at once (the master then
acts on it as usual). A load past its time is abandoned: at start the server stops with a
line naming the model; on a reload nothing is shared, the new workers load for themselves
(each bounded by the same timeout) and the old ones serve on. A pickle that hung for 90 s
with a 5 s timeout left the server without workers or probes for 90 s, and a SIGTERM sent
at 17 s was acted on at 90 s.

Imports no prometheus-client (the master imports this module before it sets
``PROMETHEUS_MULTIPROC_DIR``) and no model library until it loads one.
"""

from __future__ import annotations

import gc
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeVar

from serving.model.artifacts import file_identity
from serving.model.handle import ModelHandle
from serving.model_settings import ModelSettings
from serving.server.trial import stop_trials, trial_load
from serving.settings import Settings

__all__ = [
    "SHARED_FORMATS",
    "Choice",
    "Outcome",
    "choose",
    "describe",
    "inherited",
    "is_shared",
    "load_in_master",
    "models_of",
    "tried",
]

#: How a load in the master ended: nothing to share, loaded, failed (logged), past
#: ``SERVING_LOAD_TIMEOUT_S`` or cut short by a signal to stop.
Outcome = Literal["none", "loaded", "failed", "timed_out", "interrupted"]
#: The signals that end the master's wait for a load (it acts on them afterwards).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)

#: Formats whose loaded objects a forked worker can use as they are.
SHARED_FORMATS = frozenset({"pickle", "joblib", "skops"})

#: Why a format is loaded in each worker instead.
PER_WORKER = {
    "onnx": "an ONNX Runtime session is built in each worker (its thread pools and a CUDA "
    "context do not survive fork)",
    "python": "your class loads in each worker after fork (its contract)",
}

Key = tuple[str, str, str, str, str | None]
Done = TypeVar("Done")


@dataclass(frozen=True)
class Choice:
    """Whether one model (one of ``Settings.model_settings()``) is shared, and why."""

    model: ModelSettings
    shared: bool
    why: str

    @property
    def label(self) -> str:
        return f"{self.model.name!r} version {self.model.version!r}"


def _key(model: ModelSettings) -> Key:
    """What a worker's model must match to take the master's copy: name, version, path,
    format and pinned SHA-256."""
    return (model.name, model.version, str(model.path), model.format, model.sha256)


#: The settings object ``models_of`` last built the model list of, and that list.
_built: tuple[Settings, tuple[ModelSettings, ...]] | None = None


def models_of(settings: Settings) -> tuple[ModelSettings, ...]:
    """``settings.model_settings()``, built once per settings object (in the master,
    before fork, by ``choose``): a worker forked later (a respawn, after a model file was
    removed and the reload refused) takes the list its master built, and the model the
    master loaded, instead of finding the file gone.

    :raises ValueError: as ``Settings.model_settings``.
    """
    global _built
    if _built is None or _built[0] is not settings:
        _built = (settings, settings.model_settings())
    return _built[1]


def is_shared(model: ModelSettings) -> bool:
    """Whether the master loads ``model`` for every worker (``choose``)."""
    return model.share != "off" and model.format in SHARED_FORMATS


def choose(settings: Settings) -> list[Choice]:
    """Per model of ``settings``, whether the master
    loads it for every worker: formats in ``SHARED_FORMATS`` under ``share_model=auto``."""
    choices = []
    for model in models_of(settings):
        fmt = model.format
        if model.share == "off":
            why = "SERVING_SHARE_MODEL=off" if settings.share_model == "off" else "share: off"
            choices.append(Choice(model, False, why))
        elif fmt in SHARED_FORMATS:
            choices.append(Choice(model, True, f"{fmt}: loaded once in the master"))
        else:
            why = PER_WORKER.get(fmt, "only pickle, joblib and skops models are shared")
            choices.append(Choice(model, False, f"{fmt}: {why}"))
    return choices


def describe(choices: list[Choice]) -> str:
    """The start-up log line: ``model sharing: 'churn' version '2' shared (joblib: ...);
    'x' version '1' per worker (onnx: ...)``."""
    parts = [f"{c.label} {'shared' if c.shared else 'per worker'} ({c.why})" for c in choices]
    return "model sharing: " + "; ".join(parts)


_handles: dict[Key, ModelHandle] = {}
#: The file each of ``_handles`` was loaded from, as ``file_identity`` saw it before reading.
_files: dict[Key, tuple[int, ...] | None] = {}


def inherited(model: ModelSettings) -> ModelHandle | None:
    """Worker: the ``ModelHandle`` the master loaded for this model, or None: load it
    yourself."""
    return _handles.get(_key(model))


def load_in_master(
    settings: Settings,
    log: Callable[..., None],
    error: Callable[..., None],
    *,
    trial: bool = False,
    meanwhile: Callable[[], None] = lambda: None,
) -> Outcome:
    """Master, before forking workers (start-up, each reload): drop the models loaded
    before, log which models are shared (``describe``) and load those, within
    ``SERVING_LOAD_TIMEOUT_S``. A failure, a timeout or a stop signal is logged (path and
    cause) and leaves nothing shared: the workers load for themselves.

    :param trial: first load what changed in a separate process
        (``serving.server.trial``; on a reload, while old workers serve): a load that would
        crash the master leaves it out instead.
    :param meanwhile: called about every 50 ms while a load or trial runs, on the
        master's thread (reaping dead workers: Gunicorn 27 only queues ``SIGCHLD``)."""
    global _handles, _files
    before, files, _handles, _files = _handles, _files, {}, {}
    try:
        choices = choose(settings)
    except Exception as exc:  # a path gone since the settings were read: not the master's end
        error("model sharing: none (%s); each worker loads its own", exc)
        before = {}
        choices = []
    kept: dict[Key, ModelHandle] = {}
    identities: dict[Key, tuple[int, ...] | None] = {}
    for choice in choices:
        key, identity = _key(choice.model), file_identity(choice.model.path)
        identities[key] = identity
        if choice.shared and key in before and identity is not None and files[key] == identity:
            kept[key] = before[key]
            log("model sharing: %s unchanged; the master's copy kept (not read again)",
                choice.label)  # fmt: skip
    before = {}  # the old workers keep their copy; the master only what it kept (two at most)
    gc.unfreeze()
    gc.collect()
    if not choices:
        return "failed"
    log(describe(choices))
    wanted = [c for c in choices if c.shared and _key(c.model) not in kept]
    if not wanted and not kept:
        return "none"
    started = time.perf_counter()
    handles = _loaded(wanted, settings, error, trial=trial, meanwhile=meanwhile)
    if not isinstance(handles, dict):
        return handles
    gc.freeze()  # the collector no longer writes to the pages of these objects
    _handles = {**kept, **handles}
    _files = {key: identities[key] for key in _handles}
    log(
        "model sharing: loaded %d model(s) in the master in %.2f s; workers inherit them at fork",
        len(handles),
        time.perf_counter() - started,
    )
    return "loaded"


def _loaded(
    wanted: list[Choice],
    settings: Settings,
    error: Callable[..., None],
    *,
    trial: bool,
    meanwhile: Callable[[], None],
) -> dict[Key, ModelHandle] | Outcome:
    """``wanted`` loaded (after a trial in a separate process, with ``trial``), or why
    not, logged: ``failed``, ``timed_out`` or ``interrupted``."""
    labels = ", ".join(c.label for c in wanted)
    refused = _tried(wanted, settings, error, meanwhile) if trial and wanted else None
    if refused is not None:
        return refused
    done, handles, stopped_by = _bounded(
        lambda: _load(wanted, error), settings.load_timeout_s, meanwhile
    )  # fmt: skip
    if stopped_by is not None:
        error("model sharing: the master stopped loading %s (%s)", labels, stopped_by.name)
        return "interrupted"
    if not done:
        error(
            "model sharing: the master's load of %s took longer than %g s "
            "(SERVING_LOAD_TIMEOUT_S); each worker loads its own",
            labels, settings.load_timeout_s,
        )  # fmt: skip
        return "timed_out"
    return "failed" if handles is None else handles


def _tried(
    wanted: list[Choice],
    settings: Settings,
    error: Callable[..., None],
    meanwhile: Callable[[], None],
) -> Outcome | None:
    """None when ``wanted`` loads in a separate process (``serving.server.trial``), else
    the outcome for the master, logged: ``failed`` (the trial died, failed or ran too
    long) or ``interrupted`` (a stop signal came)."""
    labels = ", ".join(c.label for c in wanted)
    why, stopped_by = tried([c.model for c in wanted], settings, meanwhile)
    if stopped_by is not None:
        error("model sharing: the master stopped loading %s (%s)", labels, stopped_by.name)
        return "interrupted"
    if why is None:
        return None
    error(
        "model sharing: a trial load of %s in a separate process %s; the master does not "
        "load it: each worker loads its own (the old workers serve on)",
        labels, why,
    )  # fmt: skip
    return "failed"


def tried(
    models: list[ModelSettings], settings: Settings, meanwhile: Callable[[], None]
) -> tuple[str | None, signal.Signals | None]:
    """Master: load ``models`` in a separate process first (``serving.server.trial``),
    within ``SERVING_LOAD_TIMEOUT_S``: why this process must not load them (``died of
    SIGSEGV``), or None; and the stop signal that ended the wait, if one came."""
    ended, why, stopped_by = _bounded(
        lambda: trial_load(models, settings.load_timeout_s), settings.load_timeout_s + 5,
        meanwhile,
    )  # fmt: skip
    if stopped_by is not None or (why is None and ended):
        return None, stopped_by
    return why or "did not end", None


def _bounded(
    work: Callable[[], Done], timeout_s: float, meanwhile: Callable[[], None] = lambda: None
) -> tuple[bool, Done | None, signal.Signals | None]:
    """Run ``work`` on a daemon thread and wait for it at most ``timeout_s`` seconds, or
    until a stop signal (``STOP_SIGNALS``) comes: (whether it finished, its result, the
    signal), calling ``meanwhile()`` between looks. The master's handlers for those
    signals are put back afterwards, a trial running is ended (``stop_trials``), and a
    signal that came is raised again for them, so the master acts on it as usual; other
    signals reach its handlers meanwhile."""
    result: list[Done] = []
    came: list[signal.Signals] = []

    def run() -> None:
        result.append(work())

    previous = {
        sig: signal.signal(sig, lambda s, _f: came.append(signal.Signals(s)))
        for sig in STOP_SIGNALS
    }
    try:
        thread = threading.Thread(target=run, name="serving-master-load", daemon=True)
        thread.start()
        deadline = time.monotonic() + timeout_s
        while thread.is_alive() and not came and time.monotonic() < deadline:
            thread.join(0.05)
            meanwhile()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if came:
        stop_trials()  # a trial child would outlive a master that stops
        signal.raise_signal(came[0])
        return False, None, came[0]
    return bool(result), result[0] if result else None, None


def _load(wanted: list[Choice], error: Callable[..., None]) -> dict[Key, ModelHandle] | None:
    """Load every model of ``wanted`` (on the master's loading thread); None, logged,
    when one fails."""
    from threadpoolctl import threadpool_limits

    from serving.loading import load_artifact, model_loaders

    threadpool_limits(limits=1)  # the libraries loaded already (numpy's BLAS)
    handles: dict[Key, ModelHandle] = {}
    try:
        for choice in wanted:
            handles[_key(choice.model)] = load_artifact(choice.model, model_loaders(choice.model))
    except Exception as exc:  # ModelLoadError, or a loader's own failure
        error(
            "model sharing: the master cannot load %s: %s; each worker loads its own "
            "(and the old workers, if any, serve on)",
            choice.label,
            exc,
        )
        return None
    finally:
        threadpool_limits(limits=1)  # reaches the libraries the load imported
    return handles
