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

A reload drops the master's old objects before it loads the new file (the old workers keep
their copy until they exit: at most two copies). A load that fails leaves the master with
nothing to hand out: the new workers load for themselves, as with ``off``, fail and retry
while the old ones serve the old model (``serving.server.rollover``). The master is busy
(signals and dead workers wait) while it loads: the load time of the file.

Imports no prometheus-client (the master imports this module before it sets
``PROMETHEUS_MULTIPROC_DIR``) and no model library until it loads one.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

from serving.model.handle import ModelHandle
from serving.settings import Settings

__all__ = ["SHARED_FORMATS", "Choice", "choose", "describe", "inherited", "load_in_master"]

#: Formats whose loaded objects a forked worker can use as they are.
SHARED_FORMATS = frozenset({"pickle", "joblib", "skops"})

#: Why a format is loaded in each worker instead.
PER_WORKER = {
    "onnx": "an ONNX Runtime session is built in each worker (its thread pools and a CUDA "
    "context do not survive fork)",
    "python": "your class loads in each worker after fork (its contract)",
}

Key = tuple[str, str, str, str, str | None]


@dataclass(frozen=True)
class Choice:
    """Whether one model (one entry of ``model_specs``) is shared, and why."""

    settings: Settings  # narrowed to the model (for_model)
    shared: bool
    why: str

    @property
    def label(self) -> str:
        return f"{self.settings.resolved_model_name!r} version {self.settings.model_version!r}"


def _key(settings: Settings) -> Key:
    """What a worker's model must match to take the master's copy: name, version, path,
    format and pinned SHA-256."""
    return (
        settings.resolved_model_name,
        settings.model_version,
        str(settings.resolved_model_path),
        settings.resolved_model_format,
        settings.model_sha256,
    )


def choose(settings: Settings) -> list[Choice]:
    """Per model of ``settings``, whether the master
    loads it for every worker: formats in ``SHARED_FORMATS`` under ``share_model=auto``."""
    choices = []
    for spec in settings.model_specs:
        narrowed = settings.for_model(spec)
        fmt = narrowed.resolved_model_format
        if settings.share_model == "off":
            choices.append(Choice(narrowed, False, "SERVING_SHARE_MODEL=off"))
        elif fmt in SHARED_FORMATS:
            choices.append(Choice(narrowed, True, f"{fmt}: loaded once in the master"))
        else:
            why = PER_WORKER.get(fmt, "only pickle, joblib and skops models are shared")
            choices.append(Choice(narrowed, False, f"{fmt}: {why}"))
    return choices


def describe(choices: list[Choice]) -> str:
    """The start-up log line: ``model sharing: 'churn' version '2' shared (joblib: ...);
    'x' version '1' per worker (onnx: ...)``."""
    parts = [f"{c.label} {'shared' if c.shared else 'per worker'} ({c.why})" for c in choices]
    return "model sharing: " + "; ".join(parts)


_handles: dict[Key, ModelHandle] = {}


def inherited(settings: Settings) -> ModelHandle | None:
    """Worker: the ``ModelHandle`` the master loaded for this model (``settings`` narrowed
    by ``for_model``), or None: load it yourself."""
    return _handles.get(_key(settings))


def load_in_master(
    settings: Settings, log: Callable[..., None], error: Callable[..., None]
) -> None:
    """Master, before forking workers (start-up, each reload): drop the models loaded
    before, log which models are shared (``describe``) and load those. A failure is logged
    (path and cause) and leaves nothing shared: the workers load for themselves."""
    global _handles
    _handles = {}  # the old workers keep their copy; the master keeps none (two at most)
    gc.unfreeze()
    gc.collect()
    try:
        choices = choose(settings)
    except Exception as exc:  # a path gone since the settings were read: not the master's end
        error("model sharing: none (%s); each worker loads its own", exc)
        return
    log(describe(choices))
    wanted = [c for c in choices if c.shared]
    if not wanted:
        return
    from threadpoolctl import threadpool_limits

    from serving.loading import load_artifact, model_loaders

    threadpool_limits(limits=1)  # the libraries loaded already (numpy's BLAS)
    started = time.perf_counter()
    handles: dict[Key, ModelHandle] = {}
    try:
        for choice in wanted:
            handles[_key(choice.settings)] = load_artifact(
                choice.settings, model_loaders(choice.settings)
            )
    except Exception as exc:  # ModelLoadError, or a loader's own failure
        error(
            "model sharing: the master cannot load %s: %s; each worker loads its own "
            "(and the old workers, if any, serve on)",
            choice.label,
            exc,
        )
        return
    finally:
        threadpool_limits(limits=1)  # reaches the libraries the load imported
    gc.freeze()  # the collector no longer writes to the pages of these objects
    _handles = handles
    log(
        "model sharing: loaded %d model(s) in the master in %.2f s (it handled no signal "
        "meanwhile); workers inherit them at fork",
        len(handles),
        time.perf_counter() - started,
    )
