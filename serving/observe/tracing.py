"""OpenTelemetry tracing, off unless configured the standard way.

On when ``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set
(and ``OTEL_SDK_DISABLED`` is not ``true``); everything else (``OTEL_SERVICE_NAME``,
``OTEL_TRACES_SAMPLER``, headers, ``OTEL_BSP_*``) is read by the OpenTelemetry SDK itself.
Spans go out over OTLP/HTTP (protobuf) through the SDK's ``BatchSpanProcessor``, whose
thread does not survive fork: ``setup()`` runs in each Gunicorn worker (``post_fork``),
and again lazily in any process that has not run it.

Each request gets a ``SERVER`` span named ``METHOD /route/{template}``, continuing a
caller's W3C ``traceparent``, with children (times measured by the data plane with
``perf_counter()``, recorded after the fact):

- ``decode``: from the request's start to its instances conformed to the model's rows
  (reading and decoding the body included);
- ``queue``: waiting in the model's batcher;
- ``predict``: the predict call that answered it, with ``serving.batch_size``
  (instances) and ``serving.batch_requests`` (requests merged) as attributes, and a link
  to the server span of every traced request that call served (its own included);
- ``encode``: from the data plane's answer to the response built.

The trace id (32 hex digits) goes into the request's access-log line as ``trace_id``.
Boundary: no Flask; the app passes headers and route in.
"""

from __future__ import annotations

import contextvars
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

__all__ = [
    "current_span_context",
    "enabled",
    "end_request",
    "record_stages",
    "setup",
    "start_request",
]

_lock = threading.Lock()
_tracer: Any = None
_pid = -1
#: The data plane's answer time (``time_ns``) of the request this thread serves.
_answered_ns: contextvars.ContextVar[int] = contextvars.ContextVar("serving_answered_ns")


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
    global _tracer, _pid
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

        provider = TracerProvider()  # resource and sampler from the OTEL_* environment
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
        _tracer = provider.get_tracer("serving")


def _current_tracer() -> Any:
    if _pid != os.getpid():
        setup()
    return _tracer


def start_request(headers: Any, method: str, route: str) -> tuple[Any, Any, str] | None:
    """Open the request's server span, continuing ``headers``' ``traceparent``, and make it
    current: ``(span, token, trace_id_hex)`` for ``end_request``, or None when off."""
    tracer = _current_tracer()
    if tracer is None:
        return None
    from opentelemetry import context, trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent = TraceContextTextMapPropagator().extract(headers)
    span = tracer.start_span(
        f"{method} {route}",
        context=parent,
        kind=trace.SpanKind.SERVER,
        attributes={"http.request.method": method, "http.route": route},
    )
    token = context.attach(trace.set_span_in_context(span))
    return span, token, format(span.get_span_context().trace_id, "032x")


def end_request(state: tuple[Any, Any, str], status: int) -> None:
    """Close the server span (with an ``encode`` child from the data plane's answer)."""
    from opentelemetry import context, trace

    span, token, _ = state
    now = time.time_ns()
    answered = _answered_ns.get(None)
    if answered is not None and span.is_recording():
        ctx = trace.set_span_in_context(span)
        _tracer.start_span("encode", context=ctx, start_time=answered).end(end_time=now)
        _answered_ns.set(None)  # type: ignore[arg-type]
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_status(trace.StatusCode.ERROR)
    span.end(end_time=now)
    context.detach(token)


def current_span_context() -> Any:
    """The current request's server span context (the batcher hands it to the ``predict``
    spans of every request merged with it), or None when not traced."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    return context if context.is_valid and context.trace_flags.sampled else None


def record_stages(started: float, timing: Mapping[str, Any]) -> None:
    """The ``decode``, ``queue`` and ``predict`` spans of the current request, from the
    data plane's ``perf_counter()`` marks in ``timing`` (``conformed``, ``answered``,
    ``infer_s``, ``batch_size``, ``batch_tags``); nothing when not traced."""
    if _tracer is None:
        return
    from opentelemetry import trace

    server = trace.get_current_span()
    if not server.is_recording():
        return
    now_perf, now_ns = time.perf_counter(), time.time_ns()

    def wall(mark: float) -> int:
        return now_ns - int((now_perf - mark) * 1e9)

    ctx = trace.set_span_in_context(server)
    begin = getattr(server, "start_time", None) or wall(started)
    conformed = timing.get("conformed")
    if conformed is None:
        return
    _span(ctx, "decode", begin, wall(conformed))
    answered = timing.get("answered")
    if answered is None:
        return
    infer_s = timing.get("infer_s", 0.0)
    computed = max(answered - infer_s, conformed)
    _span(ctx, "queue", wall(conformed), wall(computed))
    if "batch_size" in timing:
        tags = timing.get("batch_tags", ())
        attributes = {
            "serving.batch_size": timing["batch_size"],
            "serving.batch_requests": len(tags),
        }
        links = [trace.Link(tag) for tag in tags if tag is not None]
        _span(ctx, "predict", wall(computed), wall(answered), attributes=attributes, links=links)
    _answered_ns.set(now_ns)


def _span(
    ctx: Any, name: str, start: int, end: int, *, attributes: Any = None, links: Any = None
) -> None:
    span = _tracer.start_span(
        name, context=ctx, start_time=start, attributes=attributes, links=links
    )
    span.end(end_time=max(end, start))
