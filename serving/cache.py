"""``ModelCache``: every model version one worker keeps warm, each with its own batcher.

``SERVING_MODELS`` lists them (the single-model settings are the one-entry case). Each
entry becomes a ``ModelRuntime`` of its own ``ModelSettings``
(``Settings.model_settings()``): its own handle, batcher, batching settings and metric labels,
so two versions served side by side are never mixed in one predict call. Requests pick
one by name and version (``resolve``); the first entry is the default model, and the
first entry of a name is that name's default version.

Readiness is all-or-nothing: the worker is ready when every model is, so a load balancer
never sends a replica traffic for a version it cannot answer yet.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from serving.errors import ModelNotFound, VersionConflict
from serving.model.handle import ModelHandle
from serving.model_settings import ModelSettings
from serving.observe.metrics import ServingMetrics
from serving.runtime import ModelRuntime, State

__all__ = [
    "ModelCache",
    "current_cache",
    "install_cache",
    "installed_cache",
    "labels_of",
    "load_runtime",
]


class ModelCache:
    """The model runtimes of one worker, one per ``ModelSettings`` in order (the first is
    the default model); ``inherit(model)`` gives a model the master loaded before fork,
    if any (``serving.server.sharing.inherited``).

    Usage::

        cache = ModelCache.of(settings.model_settings(), metrics)
        cache.start_loading().join()
        runtime = cache.resolve("breast_cancer", "2")   # 404 / 409 when not served
    """

    def __init__(
        self,
        runtimes: Sequence[ModelRuntime],
        refused: Sequence[Any] = (),
        labels: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        """:param runtimes: built already, loaded or not (``of`` builds them from settings).
        :param refused: the repository entries the settings that chose these models could
            not serve (``Settings.refused_models()``), for the index and a 409's reason.
        :param labels: each model's TF Serving version labels (``labels_of``); default:
            those of the runtimes' settings."""
        if not runtimes:
            raise ValueError("a ModelCache serves at least one model")
        self.runtimes = list(runtimes)
        self._labels = labels_of(r.settings for r in runtimes) if labels is None else labels
        self.default = self.runtimes[0]
        self.refused = tuple(refused)
        self._retired = threading.Event()

    @classmethod
    def of(
        cls,
        models: Sequence[ModelSettings],
        metrics: ServingMetrics,
        worker_slot: int = 0,
        inherit: Callable[[ModelSettings], ModelHandle | None] = lambda model: None,
        refused: Sequence[Any] = (),
    ) -> ModelCache:
        """A runtime per model, not loaded yet; ``worker_slot`` picks each one's GPU."""
        runtimes = [
            ModelRuntime(model, metrics, worker_slot, inherited=inherit(model)) for model in models
        ]
        return cls(runtimes, refused)

    def report_stages(self, report: Callable[[str], None]) -> None:
        """Call ``report`` with each stage every model's load enters (``model 'churn':
        warming up``): the worker publishes it for ``/healthz``."""
        for runtime in self.runtimes:
            runtime.on_stage = report

    @property
    def model_name(self) -> str:
        return self.default.model_name

    @property
    def model_version(self) -> str:
        return self.default.model_version

    @property
    def state(self) -> State:
        """``ready`` when every model is; otherwise the first model's state that is not."""
        states = [runtime.state for runtime in self.runtimes]
        for state in ("stopping", "failed", "loading"):
            if state in states:
                return state
        return "ready"

    def problem(self) -> str | None:
        for runtime in self.runtimes:
            reason = runtime.problem()
            if reason is not None:
                return f"model {runtime.model_name!r} version {runtime.model_version!r}: {reason}"
        return None

    @property
    def queue_depth(self) -> int:
        """Instances queued in all of this worker's batchers."""
        return sum(runtime.queue_depth for runtime in self.runtimes)

    def names(self) -> list[str]:
        """The model names served, each once, in configuration order."""
        return list(dict.fromkeys(runtime.model_name for runtime in self.runtimes))

    def versions(self, name: str) -> list[str]:
        return [r.model_version for r in self.runtimes if r.model_name == name]

    def version_labels(self, name: str) -> dict[str, str]:
        """Model ``name``'s TF Serving version labels (label -> version)."""
        return dict(self._labels.get(name, {}))

    def resolve(self, name: str | None = None, version: str | None = None) -> ModelRuntime:
        """The runtime of model ``name`` (default: the first model) at ``version`` (default:
        the first version listed for that name).

        :raises ModelNotFound: (404) when no model is called ``name``.
        :raises VersionConflict: (409) when ``name`` is served but not at ``version``.
        """
        name = self.default.model_name if name is None else name
        candidates = [r for r in self.runtimes if r.model_name == name]
        if not candidates:
            raise ModelNotFound(name, self.names())
        if version is None:
            return candidates[0]
        for runtime in candidates:
            if runtime.model_version == version:
                return runtime
        served = ", ".join(r.model_version for r in candidates)
        raise VersionConflict(version, served, name if len(self.names()) > 1 else None)

    def start_loading(
        self,
        on_failure: Callable[[BaseException], None] | None = None,
        on_ready: Callable[[], None] | None = None,
    ) -> threading.Thread:
        """Load the models one after another in a daemon thread (returned, started), each
        under its own ``load_timeout_s``; ``on_ready()`` after the last, or
        ``on_failure(exc)`` at the first failure (the others are not loaded)."""

        def target() -> None:
            for runtime in self.runtimes:
                error = load_runtime(runtime)
                if error is not None:
                    if on_failure is not None:
                        on_failure(error)
                    return
            if on_ready is not None:
                on_ready()

        thread = threading.Thread(target=target, name="serving-model-cache", daemon=True)
        thread.start()
        return thread

    def start_watchdog(self, on_problem: Callable[[str], None], interval_s: float = 0.5) -> None:
        """Check ``problem()`` every ``interval_s`` seconds; ``on_problem(reason)`` once,
        unless ``retire()`` came first."""

        def watch() -> None:
            while not self._retired.wait(interval_s):
                reason = self.problem()
                if reason is not None:
                    on_problem(reason)
                    return

        threading.Thread(target=watch, name="serving-watchdog", daemon=True).start()

    def retire(self) -> None:
        """No longer this process's models (a change in place installed others): the
        watchdog stops looking (a version it drops stops, and is no problem)."""
        self._retired.set()

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop every batcher, answering what is queued (``timeout_s`` for all together)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for runtime in self.runtimes:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            runtime.stop(left)


def load_runtime(runtime: ModelRuntime) -> BaseException | None:
    """Load one runtime (under its own load timeout); its error, or None once ready."""
    done = threading.Event()
    failures: list[BaseException] = []

    def failed(exc: BaseException) -> None:
        failures.append(exc)
        done.set()

    runtime.start_loading(failed, done.set)
    done.wait()
    return failures[0] if failures else None


def labels_of(models: Iterable[ModelSettings]) -> dict[str, dict[str, str]]:
    """Each model name's TF Serving version labels, from its versions' settings (a
    repository gives a model's labels with one of its versions)."""
    labels: dict[str, dict[str, str]] = {}
    for model in models:
        labels.setdefault(model.name, {}).update(model.labels)
    return labels


_current: ModelCache | None = None
_current_lock = threading.Lock()


def install_cache(cache: ModelCache) -> None:
    """Make ``cache`` this process's models (``post_fork`` does it in each worker)."""
    global _current
    with _current_lock:
        _current = cache


def installed_cache() -> ModelCache | None:
    """This process's models, or None (the Gunicorn master, which also runs worker hooks)."""
    return _current


def current_cache(factory: Callable[[], ModelCache]) -> ModelCache:
    """This process's models; the first call without them builds them with ``factory`` and
    starts loading in the background (any WSGI server without our Gunicorn hooks)."""
    global _current
    with _current_lock:
        if _current is None:
            _current = factory()
            _current.start_loading()
        return _current
