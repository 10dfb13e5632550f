"""OpenTelemetry tracing, off unless configured the standard way.

On when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set
(and ``OTEL_SDK_DISABLED`` is not ``true``); everything else (``OTEL_SERVICE_NAME``,
``OTEL_TRACES_SAMPLER``, headers, ``OTEL_BSP_*``) is read by the OpenTelemetry SDK itself
(the master checks them with the SDK before forking, ``tracing_guards``).
Spans go out over OTLP/HTTP (protobuf) through the SDK's ``BatchSpanProcessor``, whose
thread does not survive fork: ``setup()`` runs in each Gunicorn worker (``post_fork``),
and again lazily in any process that has not run it.

Unless ``OTEL_TRACES_SAMPLER`` says otherwise, a request whose caller sent a sampled W3C
``traceparent`` is traced, one in ``1 / DEFAULT_SAMPLE_RATIO`` of the others is, and one
whose caller sent an unsampled ``traceparent`` is not (``ParentBased`` over
``TraceIdRatioBased``): peers sample by default too (Ray Serve 1 %, Triton 1 in 1,000), and
the SDK exporting every request costs the demo model about half its CPU per request
(the span's creation and its protobuf encoding, ~200 us on a 2-vCPU AMD EPYC;
``bench/protocols_load.py --traced``). ``OTEL_TRACES_SAMPLER=parentbased_always_on``
traces every request.

Each traced request gets one ``SERVER`` span named ``METHOD /route/{template}``, continuing
a caller's ``traceparent``. Its stages are span events on it, as Triton's OpenTelemetry
trace mode records a request's timestamps (times measured by the data plane with
``perf_counter()``, recorded after the fact):

- ``queue_start``: its instances conformed to the model's rows (reading and decoding the
  body before it: the span's start to this event);
- ``compute_start``: the predict call that answered it began (waiting in the model's
  batcher before it);
- ``compute_end``: that call answered (encoding the response after it, to the span's end);

with ``serving.batch_size`` (instances) and ``serving.batch_requests`` (requests merged)
as attributes. Each predict call gets one ``predict`` span, the child of the first traced
request it served, with a link to the server span of every traced request it served: one
span a request and one a batch, not one per stage (five spans a request cost about as
much as the request itself on the ``bench/protocols_load.py --traced`` bench).

The trace id (32 hex digits) goes into the request's access-log line as ``trace_id``
when there is a trace to find: the request was sampled, or its caller sent a
``traceparent``.

A slow, hung or dead collector never holds up a request or a worker's exit: each export
gives up after ``OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`` / ``OTEL_EXPORTER_OTLP_TIMEOUT``
(``EXPORT_TIMEOUT_S`` when neither is set, where the SDK would wait 10 s), and at exit the
spans still queued get ``SHUTDOWN_S`` seconds (the SDK's own exit hook waits up to 30 s,
an export in flight and then the rest: 21 s with a hung collector). Spans dropped are
counted in ``tracing_spans_dropped_total{reason}``: ``queue_full`` (the SDK's queue,
``OTEL_BSP_MAX_QUEUE_SIZE``, was full: counted from the SDK's own warning, which it says
at most once in 20 s) and ``export_failed`` (the collector refused them, or the export
timed out; the exporter logs one line per failed batch).

Boundary: no Flask; the app passes headers and route in.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

from serving.context import Timing
from serving.observe import process, tracing_guards

__all__ = [
    "active",
    "current_span_context",
    "enabled",
    "end_request",
    "record_stages",
    "setup",
    "start_request",
]

#: The share of requests without a caller's ``traceparent`` traced when
#: ``OTEL_TRACES_SAMPLER`` is not set.
DEFAULT_SAMPLE_RATIO: Final = 0.1
#: Longest one export may take, in seconds, unless an OTEL_*_TIMEOUT variable says.
EXPORT_TIMEOUT_S: Final = 5.0
#: Longest a worker's exit waits for its queued spans to be exported, in seconds.
SHUTDOWN_S: Final = 2.0
#: The SDK's warning for each span its full queue drops (logger
#: ``opentelemetry.sdk._shared_internal``), which ``_CountQueueFull`` counts.
_QUEUE_FULL_MSG: Final = "Queue full, dropping %s."

log = logging.getLogger(__name__)
_lock = threading.Lock()
_tracer: Any = None
_pid = -1
#: The SDK's modules and W3C propagator, imported once by ``setup`` when tracing is on.
_otel: Any = None


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the OTLP exporter is configured (the standard variables, not ours)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def setup() -> None:
    """Start this process's tracer provider and exporter thread, once per process (call
    it after fork); nothing when tracing is not configured."""
    global _tracer, _pid, _otel
    with _lock:
        if _pid == os.getpid():
            return
        _pid = os.getpid()
        if not enabled():
            _tracer = None
            return
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        from serving.observe.metrics import default_metrics

        dropped = default_metrics().tracing_spans_dropped
        timeout_s = None if any(os.environ.get(v) for v in tracing_guards.TIMEOUT_VARIABLES) else (
            EXPORT_TIMEOUT_S
        )  # fmt: skip
        exporter = _counting(OTLPSpanExporter(timeout=timeout_s), dropped)
        processor = BatchSpanProcessor(exporter)
        # resource (and a sampler when one is named) from the OTEL_* environment; our exit
        # hook, not the SDK's
        sampler = None if os.environ.get("OTEL_TRACES_SAMPLER") else (
            ParentBased(TraceIdRatioBased(DEFAULT_SAMPLE_RATIO))
        )  # fmt: skip
        if sampler is None and (problem := tracing_guards.sampler_problem()):
            # one the master did not see (Gunicorn's raw_env, changed by a reload)
            log.warning(
                "tracing: invalid setting %s: %s; sampling one in %g requests instead",
                *problem, 1 / DEFAULT_SAMPLE_RATIO,
            )  # fmt: skip
            sampler = ParentBased(TraceIdRatioBased(DEFAULT_SAMPLE_RATIO))
        provider = TracerProvider(sampler=sampler, shutdown_on_exit=False)
        provider.add_span_processor(processor)
        atexit.register(_shutdown, processor)
        tracing_guards.quiet_header_warnings()
        sdk_log = logging.getLogger("opentelemetry.sdk._shared_internal")
        sdk_log.filters.insert(0, _CountQueueFull(dropped))  # before the SDK's dedup filter
        trace.set_tracer_provider(provider)
        _otel = _Otel()
        _tracer = provider.get_tracer("serving")


def _shutdown(processor: Any) -> None:
    """Export the spans still queued, waiting at most ``SHUTDOWN_S`` seconds: the SDK's
    ``shutdown()`` takes no time limit (its processor waits up to 30 s, each export up to
    its timeout), so it runs on a daemon thread the process does not wait for."""
    flush = threading.Thread(target=processor.shutdown, name="serving-otel-exit", daemon=True)
    flush.start()
    flush.join(SHUTDOWN_S)


class _CountQueueFull(logging.Filter):
    """Counts each span the SDK's full queue drops, from the warning it logs for each (its
    own ``DuplicateFilter``, after this one, says it at most once in 20 s)."""

    def __init__(self, dropped: Any) -> None:
        super().__init__()
        self.queue_full = dropped.labels("queue_full")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == _QUEUE_FULL_MSG:
            self.queue_full.inc()
        return True


def _counting(exporter: Any, dropped: Any) -> Any:
    """``exporter`` counting the spans of each failed export in ``dropped``
    (``export_failed``)."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    failed = dropped.labels("export_failed")

    class Counting(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            result = exporter.export(spans)
            if result is not SpanExportResult.SUCCESS:
                failed.inc(len(spans))
            return result  # type: ignore[no-any-return]

        def shutdown(self) -> None:
            exporter.shutdown()

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return bool(exporter.force_flush(timeout_millis))

    return Counting()


def _current_tracer() -> Any:
    if _pid != process.pid():  # per request: no system call (serving.observe.process)
        setup()
    return _tracer


def active() -> bool:
    """Whether this process traces requests (OTLP configured): a test per request that
    costs no system call."""
    return _current_tracer() is not None


class _Otel:
    """What each request uses of the SDK, imported once: ``trace``, ``context`` and the W3C
    ``traceparent`` propagator."""

    def __init__(self) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.trace, self.context = trace, context
        self.server = trace.SpanKind.SERVER
        self.propagator = TraceContextTextMapPropagator()


def start_request(
    environ: Mapping[str, Any], method: str, route: str
) -> tuple[Any, Any, str] | None:
    """Open the request's server span, continuing the ``traceparent`` (and ``tracestate``)
    header in the WSGI ``environ``, and make it current: ``(span, token, trace_id_hex)``
    for ``end_request``, or None when off. The trace id is ``""`` when the request is
    neither sampled nor the continuation of a caller's trace (it names no trace)."""
    tracer = _current_tracer()
    if tracer is None:
        return None
    otel = _otel
    parent = None
    if (traceparent := environ.get("HTTP_TRACEPARENT")) is not None:
        carrier = {"traceparent": traceparent}
        if (tracestate := environ.get("HTTP_TRACESTATE")) is not None:
            carrier["tracestate"] = tracestate
        parent = otel.propagator.extract(carrier)
    span = tracer.start_span(
        f"{method} {route}",
        context=parent,
        kind=otel.server,
        attributes={"http.request.method": method, "http.route": route},
    )
    token = otel.context.attach(otel.trace.set_span_in_context(span))
    # a trace there is, here or the caller's (a header it cannot parse names none)
    named = span.is_recording() or (
        parent is not None and otel.trace.get_current_span(parent).get_span_context().is_valid
    )
    return span, token, format(span.get_span_context().trace_id, "032x") if named else ""


def end_request(state: tuple[Any, Any, str], status: int) -> None:
    """Close the server span with the response's status (an error for a 5xx)."""
    otel = _otel
    span, token, _ = state
    if span.is_recording():
        span.set_attribute("http.response.status_code", status)
        if status >= 500:
            span.set_status(otel.trace.StatusCode.ERROR)
        span.end()
    otel.context.detach(token)


def current_span_context() -> Any:
    """The current request's server span context (the batcher hands it to the ``predict``
    spans of every request merged with it), or None when not traced."""
    if _tracer is None:
        return None
    context = _otel.trace.get_current_span().get_span_context()
    return context if context.is_valid and context.trace_flags.sampled else None


def record_stages(timing: Timing) -> None:
    """The current request's stage events (``queue_start``, ``compute_start``,
    ``compute_end``) and batch attributes on its server span, from the data plane's
    ``perf_counter()`` marks in ``timing`` (``conformed``, ``computed``, ``answered``);
    and the ``predict`` span of its batch when it is the batch's first traced request;
    nothing when not traced."""
    if _tracer is None:
        return
    trace = _otel.trace
    server = trace.get_current_span()
    if not server.is_recording():
        return
    conformed, computed, answered = timing.conformed, timing.computed, timing.answered
    if conformed is None:
        return
    now_perf, now_ns = time.perf_counter(), time.time_ns()

    def wall(mark: float) -> int:
        return now_ns - int((now_perf - mark) * 1e9)

    server.add_event("queue_start", timestamp=wall(conformed))
    if computed is None or answered is None:
        return
    server.add_event("compute_start", timestamp=wall(computed))
    server.add_event("compute_end", timestamp=wall(answered))
    if not timing.batch_size:
        return
    server.set_attributes(
        {"serving.batch_size": timing.batch_size, "serving.batch_requests": len(timing.merged)}
    )
    traced = [t.span for t in timing.merged if getattr(t, "span", None) is not None]
    if traced and traced[0] is timing.span:  # the batch's first traced request records it
        _tracer.start_span(
            "predict",
            context=trace.set_span_in_context(server),
            start_time=wall(computed),
            attributes={"serving.batch_size": timing.batch_size,
                        "serving.batch_requests": len(timing.merged)},
            links=[trace.Link(span) for span in traced],
        ).end(end_time=max(wall(answered), wall(computed)))  # fmt: skip
