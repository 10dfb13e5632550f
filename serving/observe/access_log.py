"""The access log: one JSON object per line on stdout, written off the request thread.

The request thread hands over the line's fields (``record``: a ``queue.SimpleQueue`` put,
about a microsecond) and goes on. One writer thread per worker wakes for the first line,
lingers ``linger_s`` (20 ms) so that more arrive, formats them with orjson and writes them
in one call: it wakes at most about 50 times a second whatever the load, instead of once
per request, and a line costs a few microseconds instead of the ~100 µs a ``logging``
record cost through a ``QueueListener`` and python-json-logger (``docs/batching.md``).

A line, in the format the ``logging`` version wrote (``time`` is local time, as
``logging``'s ``asctime``)::

    {"time":"2026-12-01 06:18:57,313","level":"INFO","message":"request",
     "request_id":"...","method":"POST","route":"/predict","status":200,...}

Under Gunicorn, ``serving.server.hooks.post_fork`` starts the writer (``configure``) and
``worker_exit`` stops it after the drain (``stop``), so the last answers are logged too.
Without a writer (tests, another WSGI server) ``record`` drops the line.

Boundary: standard library and orjson only.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, Final

import orjson

__all__ = ["AccessLog", "configure", "record", "stop"]

log = logging.getLogger("serving")

_STOP: Final = object()
#: Most lines formatted per write: bounds how long the writer holds the GIL at once.
_CHUNK_LINES: Final = 256


class AccessLog:
    """A writer thread for access lines; ``write`` is safe from any thread.

    :param linger_s: how long the writer waits after the first queued line for more, in
        seconds: the most a line waits before it is written, and what bounds the writer's
        wake-ups (1 / ``linger_s`` a second at most).

    Usage::

        access = AccessLog().start()
        access.write({"route": "/predict", "status": 200})
        access.stop()                        # writes what is queued, ends the thread
    """

    def __init__(self, linger_s: float = 0.02) -> None:
        self.linger_s = linger_s
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="serving-access-log", daemon=True)
        self._failed = False

    def start(self) -> AccessLog:
        self._thread.start()
        return self

    def write(self, fields: Mapping[str, Any]) -> None:
        """Queue one request's line: ``fields`` (plain JSON values) after time, level and
        message. The time is taken now, on the caller's thread."""
        self._queue.put((time.time(), fields))

    def stop(self, timeout_s: float | None = 10.0) -> None:
        """Write every line queued before this call, then end the thread."""
        self._queue.put(_STOP)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            items = [self._queue.get()]
            if items[0] is not _STOP:
                time.sleep(self.linger_s)
            while True:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stopping = any(item is _STOP for item in items)
            lines = [item for item in items if item is not _STOP]
            for start in range(0, len(lines), _CHUNK_LINES):
                self._emit(lines[start : start + _CHUNK_LINES])
            if stopping:
                return

    def _emit(self, lines: list[tuple[float, Mapping[str, Any]]]) -> None:
        text = b"".join(_format(at, fields) for at, fields in lines).decode()
        try:
            out = sys.stdout  # looked up per write: tests and embedders may replace it
            out.write(text)
            out.flush()
        except Exception as exc:  # a closed or broken stdout loses lines, not the worker
            if not self._failed:
                self._failed = True
                log.error("the access log cannot write to stdout (%s); lines are lost", exc)


def _format(at: float, fields: Mapping[str, Any]) -> bytes:
    """One line: ``time`` as ``logging``'s ``asctime`` (local, milliseconds), ``level``,
    ``message``, then ``fields``; values orjson cannot encode are written with ``str``."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) + f",{int(at % 1 * 1000):03d}"
    head = {"time": stamp, "level": "INFO", "message": "request"}
    return orjson.dumps({**head, **fields}, default=str) + b"\n"


_writer: AccessLog | None = None


def configure(enabled: bool) -> None:
    """Start this process's writer (after fork: a thread does not survive ``fork()``), or
    none when ``enabled`` is false. Replaces a writer already running (stopping it first)."""
    global _writer
    stop()
    if enabled:
        _writer = AccessLog().start()


def record(fields: Mapping[str, Any]) -> None:
    """Queue one access line on this process's writer; dropped when none was configured."""
    writer = _writer
    if writer is not None:
        writer.write(fields)


def stop() -> None:
    """Write the lines still queued and stop this process's writer (idempotent)."""
    global _writer
    writer, _writer = _writer, None
    if writer is not None:
        writer.stop()
