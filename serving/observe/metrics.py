"""Prometheus metrics, correct across Gunicorn workers (prometheus-client multiprocess mode).

Under Gunicorn, ``gunicorn.conf.py`` points ``PROMETHEUS_MULTIPROC_DIR`` at a directory
before any worker imports prometheus-client, wipes it at start and marks dead workers
(``serving.server.hooks``). Each worker writes its samples there; ``render()`` builds a fresh
registry with a ``WholeFilesCollector`` (prometheus-client's ``MultiProcessCollector``
over the files it can read) per scrape, so any worker answers ``/metrics``
with the sum over all of them (the recipe of prometheus/client_python's multiprocess
docs). Without that variable (tests, a single process) the given registry is rendered.

Units are in the names: durations in seconds, batch size in instances.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from http import HTTPMethod

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Summary,
    generate_latest,
    values,
)
from prometheus_client.metrics_core import Metric

from serving.batching.batcher import FlushStats
from serving.context import REQUEST_STAGES, Timing, stage_seconds
from serving.model.handle import ModelHandle
from serving.observe.metric_files import (
    MultiProcessValue,
    ReservedMmapedDict,
    WholeFilesCollector,
    made_again,
)
from serving.observe.writes import (
    DepthGauge,
    Write,
    WriteEach,
    counter_inc,
    counters_inc,
    gauge_set,
    histogram_observe,
    never_raises,
    summary_observe,
)

__all__ = ["CONTENT_TYPE_LATEST", "ServingMetrics", "default_metrics"]

# Multiprocess mode's value class, with a write cut to what it must do (about fifteen per
# request): serving.observe.metric_files.
if values.ValueClass.__name__ == "MmapedValue":  # PROMETHEUS_MULTIPROC_DIR was set at import
    values.ValueClass = MultiProcessValue
# Its files with their blocks reserved: a full directory is an OSError, not a SIGBUS that
# kills the worker (serving.observe.metric_files).
values.MmapedDict = ReservedMmapedDict  # type: ignore[attr-defined]

#: Request durations: 0.5 ms to 10 s (a model server's answers span that range).
DURATION_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip
#: Labels of every inference metric: which model version of the replica it is about.
MODEL_LABELS = ("model", "version")
#: The predict call's metrics also say what answered it (``ModelHandle.engine``:
#: ``onnxruntime``, ``sklearn``, ...).
ENGINE_LABELS = (*MODEL_LABELS, "engine")
#: Powers of two up to the largest max_batch_size worth running (see docs/batching.md).
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
LOAD_BUCKETS_S = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
#: The HTTP methods counted under their own name (any other is ``other``).
_METHODS = frozenset(method.value for method in HTTPMethod)

log = logging.getLogger(__name__)


class ServingMetrics:
    """The service's metrics, registered in ``registry``.

    Usage::

        metrics = ServingMetrics(CollectorRegistry())   # tests: an isolated registry
        metrics.observe_request("POST", "/predict", 200, 0.004)
        body = metrics.render()                         # Prometheus text format, bytes
    """

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.registry = registry
        self._children: dict[tuple[str, str, int], tuple[Write, Write]] = {}
        self._depth_children: dict[tuple[str, str], DepthGauge] = {}
        self.requests = Counter(
            "http_requests_total",
            "HTTP requests answered, by route template and status.",
            ["method", "route", "status"],
            registry=registry,
        )
        self.request_duration = Histogram(
            "http_request_duration_seconds",
            "Time from request received to response built, in seconds.",
            ["method", "route"],
            buckets=DURATION_BUCKETS_S,
            registry=registry,
        )
        self.batch_size = Histogram(
            "inference_batch_size",
            "Instances per predict call.",
            ENGINE_LABELS,
            buckets=BATCH_SIZE_BUCKETS,
            registry=registry,
        )
        self.inference_duration = Histogram(
            "inference_duration_seconds",
            "Wall time of one predict call on a batch, in seconds.",
            ENGINE_LABELS,
            buckets=DURATION_BUCKETS_S,
            registry=registry,
        )
        self.inference_errors = Counter(
            "inference_errors_total",
            "Predict calls that raised or returned the wrong number of rows.",
            MODEL_LABELS,
            registry=registry,
        )
        self.rejected = Counter(
            "inference_rejected_total",
            "Requests refused at once with 503 overloaded: the batcher queue was full.",
            MODEL_LABELS,
            registry=registry,
        )
        self.load_failures = Counter(
            "serving_model_load_failures_total",
            "Failed model loads of workers started after the first boot (each is retried "
            "with backoff while the other workers serve).",
            MODEL_LABELS,
            registry=registry,
        )
        self.load_duration = Histogram(
            "serving_model_load_seconds",
            "Seconds a worker took to load (or take from the master) and warm up a model "
            "version, one per load: its _count is the loads.",
            MODEL_LABELS,
            buckets=LOAD_BUCKETS_S,
            registry=registry,
        )
        self.memory = Gauge(
            "serving_model_memory_bytes",
            "Memory each worker added loading a model version (its own copy when it reads "
            "the file, compiling, warming up): PSS before and after, summed over live workers.",
            MODEL_LABELS,
            multiprocess_mode="livesum",
            registry=registry,
        )
        self.shared_memory = Gauge(
            "serving_model_shared_memory_bytes",
            "Memory the master added loading the one copy of a model version its workers "
            "share (PSS before and after), while a live worker serves it.",
            MODEL_LABELS,
            multiprocess_mode="livemax",
            registry=registry,
        )
        self.model_info = Gauge(
            "serving_model_info",
            "1 for each model a live worker serves, labelled with where it runs.",
            ["model", "version", "format", "execution_provider", "device", "engine"],
            multiprocess_mode="livemax",
            registry=registry,
        )
        self.queue_depth = Gauge(
            "inference_queue_depth",
            "Instances waiting in the batchers' queues, summed over live workers.",
            MODEL_LABELS,
            multiprocess_mode="livesum",
            registry=registry,
        )
        self.payload_log_dropped = Counter(
            "payload_log_dropped",
            "Payload log records dropped: queue_full (the sink is behind: the queue holds "
            "its records or bytes) or sink_error (every retry failed, or the file write).",
            ["reason"],
            registry=registry,
        )
        self.payload_log_dropped_bytes = Counter(
            "payload_log_dropped_bytes",
            "Bytes of rows and outputs in the payload log records dropped, by reason.",
            ["reason"],
            registry=registry,
        )
        self.access_log_dropped = Counter(
            "access_log_dropped",
            "Access log lines dropped: queue_full (stdout does not keep up), stdout_error "
            "(a write failed) or stopped (not written when the worker exited).",
            ["reason"],
            registry=registry,
        )
        self.tracing_spans_dropped = Counter(
            "tracing_spans_dropped",
            "Spans not exported: queue_full (the OpenTelemetry SDK's queue was full) or "
            "export_failed (the collector refused them or did not answer in time).",
            ["reason"],
            registry=registry,
        )
        self._stages: dict[tuple[str, str, bool], WriteEach] = {}
        #: Per request, as Triton counts them (nv_inference_request_success and _failure,
        #: nv_inference_queue_duration_us, ...), for its statistics extension
        #: (serving.protocols.v2.stats). Counters: one write per stage, and answered
        #: requests are counted once per predict call, not once each.
        self.request_outcomes = Counter(
            "inference_requests",
            "Requests that reached a model's inputs check, by outcome (success, fail).",
            [*MODEL_LABELS, "outcome"],
            registry=registry,
        )
        self.request_stage = Counter(
            "inference_request_stage_seconds",
            "Time requests spent per stage, in seconds, as Triton counts them: "
            "compute_input, queue, compute_infer and compute_output of the requests that "
            "succeeded (their sum is their whole time), fail the whole time of those that "
            "failed.",
            [*MODEL_LABELS, "stage"],
            registry=registry,
        )
        self.batch_compute = Summary(
            "inference_batch_compute_seconds",
            "Predict calls that succeeded and their time, by batch size, in seconds.",
            [*MODEL_LABELS, "batch_size"],
            registry=registry,
        )
        self.last_inference = Gauge(
            "inference_last_timestamp_seconds",
            "Unix time of the last request answered, in seconds.",
            MODEL_LABELS,
            multiprocess_mode="max",
            registry=registry,
        )

    @never_raises
    def observe_request(self, method: str, route: str, status: int, duration_s: float) -> None:
        """Count one answered request; ``route`` is the URL rule (``/predict``), never the path.

        Methods outside the HTTP standard set are counted as ``other``, so a client making
        up methods cannot grow the label set without bound.
        """
        if method not in _METHODS:
            method = "other"
        key = (method, route, status)
        children = self._children.get(key)
        if children is None:  # labels() takes a lock and builds keys: once per label set
            children = (
                counter_inc(self.requests.labels(method, route, str(status))),
                histogram_observe(self.request_duration.labels(method, route)),
            )
            self._children[key] = children
        children[0](1)
        children[1](duration_s)

    def _depth(self, model: str, version: str) -> DepthGauge:
        depth = self._depth_children.get((model, version))
        if depth is None:
            depth = DepthGauge(self.queue_depth.labels(model, version))
            self._depth_children[(model, version)] = depth
        return depth

    def queue_observer(self, model: str, version: str) -> Callable[[int], None]:
        """The ``ThreadedBatcher`` ``on_queue`` observer of one model version: the queue
        depth each time a request is queued (each flush sets it too), so the gauge rises
        while a slow predict call holds the batcher."""
        return never_raises(self._depth(model, version).set)

    def flush_observer(
        self, model: str, version: str, engine: str = "python"
    ) -> Callable[[FlushStats], None]:
        """The ``ThreadedBatcher`` ``on_flush`` observer of one model version: each predict
        call sets its batch size, duration, queue depth, the time of the last answer and
        (when it failed) the error count."""
        batch_size = histogram_observe(self.batch_size.labels(model, version, engine))
        duration = histogram_observe(self.inference_duration.labels(model, version, engine))
        depth = self._depth(model, version)
        errors = counter_inc(self.inference_errors.labels(model, version))
        last = gauge_set(self.last_inference.labels(model, version))
        by_size: dict[int, Write] = {}  # labels() takes a lock and builds keys: once per size
        answered = self._stage_children(model, version, True)
        self.rejected.labels(model, version)  # exposed at 0 from the start, so rate() works
        depth.set(0)

        @never_raises
        def observe(stats: FlushStats) -> None:
            batch_size(stats.batch_size)
            duration(stats.duration_s)
            depth.set(stats.queue_depth)
            if stats.error is not None:
                errors(1)
                return
            compute = by_size.get(stats.batch_size)
            if compute is None:
                compute = by_size[stats.batch_size] = summary_observe(
                    self.batch_compute.labels(model, version, str(stats.batch_size))
                )
            compute(stats.duration_s)
            last(time.time())
            self._count_answered(answered, stats)

        return observe

    def _count_answered(self, children: WriteEach, stats: FlushStats) -> None:
        """Count the requests a predict call answered, in six writes for the whole batch
        (a request's ``Timing`` is its ``submit`` tag, from the data plane): each one's
        queue wait and input check, the call's time, and ``compute_output`` from the call's
        return to now (splitting the outputs per request)."""
        now = time.perf_counter()
        answered = stats.called_at + stats.duration_s
        totals = [0.0, 0.0, 0.0, 0.0]
        requests = 0
        for timing in stats.tags:
            if not isinstance(timing, Timing) or timing.conformed is None:
                continue  # not submitted by the data plane (a test's, the warm-up's)
            seconds = stage_seconds(
                timing.started, timing.conformed, answered, stats.duration_s, now
            )
            for index, value in enumerate(seconds):
                totals[index] += value
            timing.counted = True
            requests += 1
        if requests:
            self._write_stages(children, requests, totals)

    @never_raises
    def model_load_failed(self, model: str, version: str) -> None:
        """Count one failed load of ``model`` at ``version`` (a worker retries it)."""
        self.load_failures.labels(model, version).inc()

    @never_raises
    def count_rejected(self, model: str, version: str) -> None:
        """Count one request refused at once with 503 overloaded (its queue was full)."""
        self.rejected.labels(model, version).inc()

    def _stage_children(self, model: str, version: str, ok: bool) -> WriteEach:
        """The write of the outcome's counter, then of the seconds of each of
        ``REQUEST_STAGES`` in its order (success) or of the whole request (fail)."""
        write = self._stages.get((model, version, ok))
        if write is None:  # labels() takes a lock and builds keys: once per model and outcome
            outcome = "success" if ok else "fail"
            stages = REQUEST_STAGES if ok else ("fail",)
            write = counters_inc([
                self.request_outcomes.labels(model, version, outcome),
                *(self.request_stage.labels(model, version, s) for s in stages),
            ])  # fmt: skip
            self._stages[(model, version, ok)] = write
        return write

    @never_raises
    def observe_stages(
        self,
        model: str,
        version: str,
        ok: bool,
        *,
        compute_input: float,
        queue: float,
        compute_infer: float,
        compute_output: float,
    ) -> None:
        """Count one request that reached the model's inputs check, with its seconds in
        each stage (``compute_input``, ``queue``, ``compute_infer``, ``compute_output``):
        per stage when it succeeded, as its whole time under ``fail`` when it failed (as
        Triton counts them). Requests a batcher answered are counted by its flush
        observer instead, per predict call."""
        seconds = (queue, compute_input, compute_infer, compute_output)
        self._write_stages(self._stage_children(model, version, ok), 1, seconds, ok=ok)

    @staticmethod
    def _write_stages(
        write: WriteEach, requests: int, seconds: Sequence[float], *, ok: bool = True
    ) -> None:
        """Count ``requests`` and their ``seconds`` per stage of ``REQUEST_STAGES`` (for
        failed ones, their sum): five writes, or two, for any number of requests."""
        write([requests, *seconds] if ok else [requests, sum(seconds)])

    def collect(self) -> list[Metric]:
        """The metric families of all workers (multiprocess mode) or of ``registry``."""
        registry = self.registry
        if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
            made_again(os.environ["PROMETHEUS_MULTIPROC_DIR"])  # removed while serving
            registry = CollectorRegistry()
            WholeFilesCollector(registry)
        return list(registry.collect())

    @never_raises
    def model_loaded(
        self,
        handle: ModelHandle,
        seconds: float,
        memory_bytes: int | None = None,
        shared_memory_bytes: int | None = None,
    ) -> None:
        """Set ``serving_model_info`` for a model this worker now serves (``device``:
        ``cuda:N`` on a GPU, else ``cpu``), count its load of ``seconds`` and set the
        memory it added here and, when it is the master's copy, there (bytes, when
        measured: ``ModelRuntime.memory_bytes``, ``shared_memory_bytes``)."""
        self.model_info.labels(*_info_labels(handle)).set(1)
        self.load_duration.labels(handle.name, handle.version).observe(seconds)
        if memory_bytes is not None:
            self.memory.labels(handle.name, handle.version).set(memory_bytes)
        if shared_memory_bytes is not None:
            self.shared_memory.labels(handle.name, handle.version).set(shared_memory_bytes)

    def model_unloaded(self, handle: ModelHandle) -> None:
        """This worker no longer serves ``handle`` (a change in place dropped it): its
        ``serving_model_info`` and memory gauges go to 0 (a live worker's series stays in
        the multiprocess files; 0 adds nothing to a sum, nor to a maximum)."""
        self.model_info.labels(*_info_labels(handle)).set(0)
        self.memory.labels(handle.name, handle.version).set(0)
        self.shared_memory.labels(handle.name, handle.version).set(0)

    def render(self) -> bytes:
        """The text exposition of all workers (multiprocess mode) or of ``registry``."""
        if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
            made_again(os.environ["PROMETHEUS_MULTIPROC_DIR"])  # removed while serving
            for attempt in range(3):
                registry = CollectorRegistry()
                WholeFilesCollector(registry)
                try:
                    return generate_latest(registry)
                except FileNotFoundError:  # a dead worker's file archived while we read
                    if attempt == 2:
                        raise

        return generate_latest(self.registry)


_default: ServingMetrics | None = None
_default_lock = threading.Lock()


def default_metrics() -> ServingMetrics:
    """The process's metrics in the default registry, created on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = ServingMetrics()
        return _default


def _info_labels(handle: ModelHandle) -> tuple[str, ...]:
    """``serving_model_info``'s labels of ``handle`` (``device``: ``cuda:N`` on a GPU,
    else ``cpu``)."""
    device = f"cuda:{handle.device_id}" if handle.device_id is not None else "cpu"
    return (
        handle.name, handle.version, handle.format, handle.execution_provider, device,
        handle.engine,
    )  # fmt: skip
