"""One worker's model and batcher, and the readiness they imply.

Under Gunicorn, ``serving.server.hooks.post_fork`` builds the process's ``ModelCache`` (one
``ModelRuntime`` per model version, ``serving.cache``), hands each runtime the model the
master loaded before fork where there is one (``serving.server.sharing``: pickle, joblib
and skops models under ``SERVING_SHARE_MODEL=auto``), and starts loading in a background
thread, so the worker answers ``/livez`` (200) and
``/healthz`` (503, ``loading``) while the model loads, then ``ready`` once it is loaded,
warmed up and its batcher runs. ``worker_exit`` stops it, draining the batcher.

Load order matters: the model is loaded (``serving.loading``) or inherited first (importing
the libraries it needs), then
BLAS/OpenMP pools are pinned with threadpoolctl (pinning only reaches libraries already
loaded), then warmup batches of 1 and ``max_batch_size`` rows run (``serving.warmup``: the
model's own examples, else invented rows, whose failure is logged and not fatal; the first
also decides whether a classifier's labels come from ``predict_proba`` alone:
``serving.model.labels``), then the batcher starts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Literal

from serving.batching.arrivals import process_arrivals
from serving.batching.batcher import ThreadedBatcher
from serving.errors import ModelLoadError, NotReady
from serving.loading import (
    Stage,
    compiled,
    describe_features,
    load_artifact,
    may_compile,
    model_loaders,
)
from serving.model.artifacts import file_identity
from serving.model.handle import ModelHandle, ModelLoader, TensorSpec
from serving.model_settings import ModelSettings
from serving.observe.memory import Look
from serving.observe.metrics import ServingMetrics
from serving.warmup import warm_up

__all__ = ["ModelRuntime", "State"]

log = logging.getLogger(__name__)

State = Literal["loading", "ready", "failed", "stopping"]


class ModelRuntime:
    """The model handle and batcher of one process.

    Usage::

        runtime = ModelRuntime(settings.model_settings()[0], metrics)
        runtime.load()                       # or start_loading() for a background thread
        handle, batcher = runtime.require_ready()
    """

    def __init__(
        self,
        settings: ModelSettings,
        metrics: ServingMetrics,
        worker_slot: int = 0,
        loaders: Mapping[str, ModelLoader] | None = None,
        inherited: ModelHandle | None = None,
    ) -> None:
        self.settings = settings
        #: The model file as it was before this runtime read it (``file_identity``): a
        #: change in place reloads it when it differs now.
        self.file_identity = file_identity(settings.path)
        self.metrics = metrics
        #: This worker's index among the live workers (0, 1, ...): picks its CUDA device.
        self.worker_slot = worker_slot
        #: Format -> loader, configured from this model's settings (``model_loaders``).
        self.loaders = model_loaders(settings, worker_slot) if loaders is None else loaders
        #: The model as the Gunicorn master loaded it before fork
        #: (``serving.server.sharing``): ``load()`` warms it up instead of loading the file.
        self.inherited = inherited
        self.handle: ModelHandle | None = None
        #: The model's outputs (name, dtype, shape), from one instance at load time.
        self.outputs: tuple[TensorSpec, ...] = ()
        self.batcher: ThreadedBatcher | None = None
        self.error: BaseException | None = None
        #: What a load is doing now: ``reading`` (and checking) the artifact, ``loading``
        #: it, ``warming up``; None before a load and once ready.
        self.stage: Stage | None = None
        #: Called with each stage a load enters (``model 'churn': warming up``).
        self.on_stage: Callable[[str], None] | None = None
        #: When it became ready to serve (``time.time()``), or None.
        self.loaded_at: float | None = None
        #: The PSS this process added loading it (reading its file when it loads its own
        #: copy, compiling, warming up), in bytes; None until ready or where not measured.
        self.memory_bytes: int | None = None
        #: The PSS the process that handed it over added loading it (the master's one copy
        #: every worker shares), in bytes; None when this process loaded it.
        self.shared_memory_bytes: int | None = None
        #: The libraries this process, and the one that handed it over, first imported
        #: loading it (their memory is in ``memory_bytes``, ``shared_memory_bytes``).
        self.memory_imports: tuple[str, ...] = ()
        self.shared_memory_imports: tuple[str, ...] = ()
        self._stopping = False

    @property
    def model_name(self) -> str:
        return self.handle.name if self.handle else self.settings.name

    @property
    def model_version(self) -> str:
        return self.handle.version if self.handle else self.settings.version

    @property
    def state(self) -> State:
        """``ready`` only while the model is loaded, the batcher thread runs and no predict
        call has run longer than ``inference_timeout_ms``."""
        if self._stopping:
            return "stopping"
        if self.error is not None or self.problem() is not None:
            return "failed"
        return "ready" if self.batcher is not None else "loading"

    def problem(self) -> str | None:
        """Why a started batcher cannot serve (dead thread, stuck predict call), or None."""
        batcher = self.batcher
        if batcher is None or self._stopping:
            return None
        if not batcher.running:
            return "the batcher thread is not running"
        limit_s = self.settings.inference_timeout_ms / 1000
        if batcher.busy_for_s > limit_s:
            return f"a predict call has run {batcher.busy_for_s:.1f} s (limit {limit_s:g} s)"
        return None

    @property
    def queue_depth(self) -> int:
        return self.batcher.queue_depth if self.batcher else 0

    def load(self, handle: ModelHandle | None = None) -> None:
        """Load the configured model (or take ``handle``, else the ``inherited`` one), pin
        BLAS/OpenMP threads to ``blas_threads``, warm up, start batching.

        :raises ModelLoadError: when the artifact cannot be loaded.
        :raises ModelLoadError: when the model fails on its own warm-up examples.
        """
        settings = self.settings
        started, before = time.perf_counter(), Look.now()
        shared = handle or self.inherited
        try:
            if handle is None and self.inherited is not None:
                handle = self.inherited
                log.info(
                    "model %r: inherited from the master (loaded once before fork, not read "
                    "again)", handle.name,
                )  # fmt: skip
            if handle is None:
                handle = load_artifact(settings, self.loaders, self._enter)
            from threadpoolctl import threadpool_limits

            threadpool_limits(limits=settings.blas_threads)
            if may_compile(handle, settings):
                self._enter("compiling")
                handle = compiled(handle, settings, self.worker_slot)
            self._enter("warming up")
            warm_started = time.perf_counter()
            self.outputs = self._warm_up(handle)
            log.info(
                "model %r: warmed up (%.2f s)", handle.name, time.perf_counter() - warm_started
            )
            if self.error is not None or self._stopping:  # past its time, or stopped: given up
                raise ModelLoadError(settings.path, "loaded after it was given up; not served")
            batcher = ThreadedBatcher(
                handle.predict_batch,
                max_batch_size=settings.max_batch_size,
                max_batch_latency_ms=settings.max_batch_latency_ms,
                policy=settings.batch_policy,
                max_queue_depth=settings.max_queue_depth,
                on_flush=self.metrics.flush_observer(handle.name, handle.version, handle.engine),
                on_queue=self.metrics.queue_observer(handle.name, handle.version),
                arrivals=process_arrivals(),
            )
            self.handle = handle
            self.batcher = batcher.start()
            self.stage = None
            self.loaded_at = time.time()
            self.memory_bytes, self.memory_imports = before.added()
            if shared is not None:
                self.shared_memory_bytes = shared.loaded_bytes
                self.shared_memory_imports = shared.loaded_imports
            self.metrics.model_loaded(
                handle, time.perf_counter() - started, self.memory_bytes,
                self.shared_memory_bytes,
            )  # fmt: skip
        except BaseException as exc:
            self.error = self.error or exc  # a load given up keeps the reason it was
            raise
        log.info(
            "model %r version %r ready to serve (%s on %s, %s, %.2f s to load and warm up)",
            handle.name,
            handle.version,
            handle.format,
            handle.execution_provider,
            describe_features(handle),
            time.perf_counter() - started,
        )

    def _enter(self, stage: Stage) -> None:
        self.stage = stage
        if self.on_stage is not None:
            self.on_stage(f"model {self.model_name!r}: {stage}")

    def _warm_up(self, handle: ModelHandle) -> tuple[TensorSpec, ...]:
        """Batches of 1 and ``max_batch_size`` instances, the model's own examples or
        invented rows (``serving.warmup``); its output specs.

        :raises ModelLoadError: when the model fails on its own examples.
        """
        what = (
            f"class {self.settings.model_class}"
            if handle.format == "python" and self.settings.model_class
            else f"{handle.format} model {handle.name!r}"
        )
        return warm_up(handle, (1, self.settings.max_batch_size), what)

    def start_loading(
        self,
        on_failure: Callable[[BaseException], None] | None = None,
        on_ready: Callable[[], None] | None = None,
    ) -> threading.Thread:
        """Run ``load()`` in a daemon thread (returned, started); then ``on_ready()``, or if
        it fails or takes longer than ``load_timeout_s`` ``on_failure(exc)`` (default: log
        the error; the state stays ``failed``)."""

        settings = self.settings
        done = threading.Event()

        def fail(exc: BaseException) -> None:
            if on_failure is None:
                log.error("model load failed: %s", exc)
            else:
                on_failure(exc)

        def target() -> None:
            try:
                self.load()
            except BaseException as exc:
                timer.cancel()
                if not done.is_set():
                    done.set()
                    fail(exc)
            else:
                timer.cancel()  # it held this runtime load_timeout_s long (300 s)
                if not done.is_set():
                    done.set()
                    if on_ready is not None:
                        on_ready()

        def overdue() -> None:  # a load that hangs (a stuck network mount) must not hang boot
            if not done.is_set():
                done.set()
                limit = settings.load_timeout_s
                compiling = (
                    "; it was still compiling to ONNX Runtime (SERVING_COMPILE=off serves it "
                    "without)" if self.stage == "compiling" else ""
                )  # fmt: skip
                self.error = ModelLoadError(
                    settings.path,
                    f"not loaded and warmed up within {limit:g} s (SERVING_LOAD_TIMEOUT_S)"
                    f"{compiling}",
                )
                fail(self.error)

        timer = threading.Timer(settings.load_timeout_s, overdue)
        timer.daemon = True
        thread = threading.Thread(target=target, name="serving-model-load", daemon=True)
        timer.start()
        thread.start()
        return thread

    def require_ready(self) -> tuple[ModelHandle, ThreadedBatcher]:
        """The handle and batcher.

        :raises NotReady: (503) unless the state is ``ready``, saying which state it is in.
        """
        state = self.state
        if state != "ready" or self.handle is None or self.batcher is None:
            raise NotReady(f"model {self.model_name!r} is not ready ({state})")
        return self.handle, self.batcher

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop taking instances and answer every queued one (at most ``timeout_s`` seconds;
        not at all when the batcher is stuck or dead: waiting for it would only delay exit)."""
        broken = self.problem() is not None
        self._stopping = True
        if self.batcher is not None:
            self.batcher.stop(0 if broken else timeout_s)
