"""What keeps the OpenTelemetry SDK's own faults out of the request path and the log.

- ``environment_problem()``: the SDK reads its ``OTEL_BSP_*`` variables itself, in each
  worker, when tracing starts. A value that is no integer gets a logged traceback there
  and the default; a value out of range (``OTEL_BSP_MAX_QUEUE_SIZE=0``) raises, and every
  worker crashed at start. The master asks the SDK once, before forking, and start-up
  stops with one line naming the variable.
- ``quiet_header_warnings()``: the API warns for each ``tracestate`` it cannot parse,
  quoting it whole, at every request that sends one: a client could flood the log. Those
  loggers then say at most one line per ``QUIET_S`` seconds, cut to ``LINE_CHARS``.

Boundary: no flask, werkzeug or gunicorn; the SDK is imported only when asked.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Final

__all__ = ["LINE_CHARS", "QUIET_S", "environment_problem", "quiet_header_warnings"]

#: Least time between two lines of a logger that warns per bad trace header, in seconds.
QUIET_S: Final = 60.0
#: Most characters of such a line kept (the rest is the client's header).
LINE_CHARS: Final = 200
#: The API's loggers that warn per bad ``traceparent`` or ``tracestate`` it is sent.
_HEADER_LOGGERS: Final = (
    "opentelemetry.trace.span",
    "opentelemetry.trace.propagation.tracecontext",
)
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
    """``(variable, "got 'value': problem")`` for the first ``OTEL_BSP_*`` variable the
    SDK refuses, or cannot read as an integer, asked of the SDK itself by building (and
    at once shutting down) its ``BatchSpanProcessor``; None when all are good."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

    collect = _Collect()
    sdk_log = logging.getLogger("opentelemetry.sdk.trace.export")
    sdk_log.addFilter(collect)
    try:
        BatchSpanProcessor(SpanExporter()).shutdown()  # type: ignore[no-untyped-call]
    except ValueError as exc:
        message = str(exc)
        named = [(message.find(p), v) for p, v in _VARIABLES.items() if p in message]
        variable = min(named)[1] if named else "OTEL_BSP_*"
        return variable, f"got {os.environ.get(variable)!r}: {message}"
    finally:
        sdk_log.removeFilter(collect)
    for record in collect.records:
        variable = next((str(a) for a in record.args or () if str(a) in _VARIABLES.values()), "")
        if variable and record.levelno >= logging.ERROR:
            return variable, f"got {os.environ.get(variable)!r}: not an integer"
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
