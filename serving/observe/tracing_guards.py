"""What keeps the OpenTelemetry SDK's own faults out of the request path and the log.

- ``environment_problem()``: the SDK reads its ``OTEL_*`` variables itself, in each
  worker, when tracing starts. A span limit that is no integer (``OTEL_SPAN_*_LIMIT``,
  ``OTEL_ATTRIBUTE_*_LIMIT``) raised at its import, a negative one in ``SpanLimits()``,
  a batch processor value out of range (``OTEL_BSP_MAX_QUEUE_SIZE=0``) in its
  constructor: every worker crashed at start. A ``OTEL_BSP_*`` value that is no integer
  logged a traceback per worker, and an export timeout that is not a positive number
  (``OTEL_EXPORTER_OTLP_TIMEOUT=-5``) made every export fail. A sampler name the SDK does
  not know (``OTEL_TRACES_SAMPLER``), or a ratio that is no number from 0 to 1
  (``OTEL_TRACES_SAMPLER_ARG``), it replaced with tracing every request, logging a warning
  per worker. The master asks the SDK once, before forking, and start-up stops with one
  line naming the variable.
- ``quiet_header_warnings()``: the API warns for each ``tracestate`` it cannot parse,
  quoting it whole, at every request that sends one: a client could flood the log. Those
  loggers then say at most one line per ``QUIET_S`` seconds, cut to ``LINE_CHARS``.

Boundary: no flask, werkzeug or gunicorn; the SDK is imported only when asked.
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import time
from typing import Final

__all__ = [
    "LINE_CHARS",
    "QUIET_S",
    "TIMEOUT_VARIABLES",
    "environment_problem",
    "quiet_header_warnings",
    "sampler_problem",
]

#: Least time between two lines of a logger that warns per bad trace header, in seconds.
QUIET_S: Final = 60.0
#: Most characters of such a line kept (the rest is the client's header).
LINE_CHARS: Final = 200
#: The API's loggers that warn per bad ``traceparent`` or ``tracestate`` it is sent.
_HEADER_LOGGERS: Final = (
    "opentelemetry.trace.span",
    "opentelemetry.trace.propagation.tracecontext",
)
#: The exporter's timeout variables, in the order it reads them (seconds).
TIMEOUT_VARIABLES: Final = ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
#: The samplers the SDK builds from ``OTEL_TRACES_SAMPLER``, as an error lists them.
_SAMPLERS: Final = (
    "always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off, "
    "parentbased_traceidratio"
)
#: A variable's name in one of the SDK's messages.
_OTEL_NAME: Final = re.compile(r"\bOTEL_[A-Z_]+\b")
#: Each parameter of the SDK's batch processor, as its errors name it, and its variable.
_VARIABLES: Final = {
    "max_queue_size": "OTEL_BSP_MAX_QUEUE_SIZE",
    "schedule_delay_millis": "OTEL_BSP_SCHEDULE_DELAY",
    "max_export_batch_size": "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
    "export_timeout_millis": "OTEL_BSP_EXPORT_TIMEOUT",
}


class _Collect(logging.Filter):
    """Keeps the records of the logger it filters, and drops them (no traceback)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return False


def environment_problem() -> tuple[str, str] | None:
    """``(variable, "got 'value': problem")`` for the first ``OTEL_*`` variable the SDK
    refuses or cannot read, asked of the SDK itself (importing it, building its
    ``SpanLimits`` and its ``BatchSpanProcessor``, at once shut down), then the export
    timeouts, which the exporter takes whatever their sign; None when all are good."""
    try:
        from opentelemetry.sdk.trace import SpanLimits
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

        SpanLimits()
    except ValueError as exc:  # "OTEL_SPAN_LINK_COUNT_LIMIT must be a non-negative ..."
        variable = next(iter(_OTEL_NAME.findall(str(exc))), "OTEL_*")
        return variable, f"got {os.environ.get(variable)!r}: {exc}"
    if problem := sampler_problem():
        return problem
    collect = _Collect()
    sdk_log = logging.getLogger("opentelemetry.sdk.trace.export")
    sdk_log.addFilter(collect)
    try:
        BatchSpanProcessor(SpanExporter()).shutdown()  # type: ignore[no-untyped-call]
    except ValueError as exc:
        message = str(exc)
        named = [(message.find(p), v) for p, v in _VARIABLES.items() if p in message]
        named.sort(key=lambda at: (at[1] not in os.environ, at[0]))  # a set one first
        variable = named[0][1] if named else "OTEL_BSP_*"
        return variable, f"got {os.environ.get(variable)!r}: {message}"
    finally:
        sdk_log.removeFilter(collect)
    for record in collect.records:
        variable = next((str(a) for a in record.args or () if str(a) in _VARIABLES.values()), "")
        if variable and record.levelno >= logging.ERROR:
            return variable, f"got {os.environ.get(variable)!r}: not an integer"
    return _timeout_problem()


def sampler_problem() -> tuple[str, str] | None:
    """The sampler variables, read by the SDK's ``TracerProvider`` as each worker builds
    one: a name or a ratio it warns of and replaces with tracing every request;
    ``(variable, problem)`` or None."""
    name = os.environ.get("OTEL_TRACES_SAMPLER")
    if not name:
        return None
    from opentelemetry.sdk.trace import TracerProvider

    argument = os.environ.get("OTEL_TRACES_SAMPLER_ARG")
    collect = _Collect()
    sdk_log = logging.getLogger("opentelemetry.sdk.trace.sampling")
    sdk_log.addFilter(collect)
    try:
        TracerProvider(shutdown_on_exit=False)
    finally:
        sdk_log.removeFilter(collect)
    said = " ".join(record.getMessage() for record in collect.records)
    if "recognize sampler" in said:
        return "OTEL_TRACES_SAMPLER", f"got {name!r}: not a sampler the SDK knows ({_SAMPLERS})"
    if "TRACES_SAMPLER_ARG" in said:
        return "OTEL_TRACES_SAMPLER_ARG", f"got {argument!r}: not a ratio from 0 to 1"
    return None


def _timeout_problem() -> tuple[str, str] | None:
    """The export timeout the exporter reads (the traces variable, else the general one):
    a positive number of seconds, or None when neither is set."""
    variable = next((v for v in TIMEOUT_VARIABLES if os.environ.get(v)), None)
    if variable is None:
        return None
    value = os.environ[variable]
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        return variable, f"got {value!r}: not a positive number of seconds"
    return None


class _Sparse(logging.Filter):
    """At most one record per ``QUIET_S`` seconds, its message cut to ``LINE_CHARS``."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._next = 0.0

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        with self._lock:
            if now < self._next:
                return False
            self._next = now + QUIET_S
        message = record.getMessage()
        if len(message) > LINE_CHARS:
            message = f"{message[:LINE_CHARS]}... (cut; at most one such line per {QUIET_S:g} s)"
        record.msg, record.args = message, None
        return True


def quiet_header_warnings() -> None:
    """Make the loggers that warn per bad trace header sparse (once per process)."""
    for name in _HEADER_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Sparse) for f in logger.filters):
            logger.addFilter(_Sparse())
