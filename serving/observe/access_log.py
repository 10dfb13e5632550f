"""The access log: one JSON object per line on stdout, written off the request thread.

The request thread hands over the line's fields (``record``: a ``queue.SimpleQueue`` put
after a look at its size, under a microsecond) and goes on. One writer thread per worker
wakes for the first line, lingers ``linger_s`` (20 ms) so that more arrive, formats them
with orjson and writes them in one call: it wakes at most about 50 times a second whatever
the load, instead of once per request, and a line costs a few microseconds instead of the
~100 µs a ``logging`` record cost through a ``QueueListener`` and python-json-logger
(``docs/batching.md``).

A line, in the format the ``logging`` version wrote (``time`` is local time, as
``logging``'s ``asctime``)::

    {"time":"2026-12-01 06:18:57,313","level":"INFO","message":"request",
     "request_id":"...","method":"POST","route":"/predict","status":200,...}

A stdout that does not keep up (a pipe nobody reads) never holds up a request or a
worker's exit: a worker queues at most ``max_lines`` lines
(``SERVING_ACCESS_LOG_QUEUE_LINES``; its writer takes at most as many more to write), drops
the others, and ``stop`` waits at most ``timeout_s`` for the writer. Lines are dropped and
counted through ``on_drop(reason, count)`` (``access_log_dropped_total{reason}``):
``queue_full``, ``stdout_error`` (a write raised: a closed or broken stdout), ``stopped``
(not yet written when ``stop`` gave up; lines inside a write that never returns are lost
with the process, uncounted). Each reason is said in
the ``serving`` log once, then at most once a minute. Lines go to stdout's file descriptor
with ``os.write``, not through ``sys.stdout``'s buffer, so a writer blocked on a full pipe
holds no lock that the interpreter's exit would wait for.

Under Gunicorn, ``serving.server.hooks.post_fork`` starts the writer (``configure``) and
``worker_exit`` stops it after the drain (``stop``), so the last answers are logged too.
Without a writer (tests, another WSGI server) ``record`` drops the line.

Boundary: standard library and orjson only.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

import orjson

from serving.observe.complaint import Complaint

__all__ = ["AccessLog", "OnDrop", "configure", "record", "stop"]

log = logging.getLogger("serving")

_STOP: Final = object()
#: Most lines formatted per write: bounds how long the writer holds the GIL at once.
_CHUNK_LINES: Final = 256
#: ``on_drop(reason, count)``: ``count`` lines dropped for ``reason``.
OnDrop = Callable[[str, int], None]


class AccessLog:
    """A writer thread for access lines; ``write`` is safe from any thread.

    :param linger_s: how long the writer waits after the first queued line for more, in
        seconds: the most a line waits before it is written, and what bounds the writer's
        wake-ups (1 / ``linger_s`` a second at most).
    :param max_lines: most lines queued (the writer takes at most as many more at once to
        write); more are dropped.
    :param on_drop: called with a reason and a count for each drop (the metric).

    Usage::

        access = AccessLog(max_lines=4096, on_drop=count_drops).start()
        access.write({"route": "/predict", "status": 200})
        access.stop(timeout_s=2.0)           # writes what is queued, ends the thread
    """

    def __init__(
        self, linger_s: float = 0.02, max_lines: int = 4096, on_drop: OnDrop | None = None
    ) -> None:
        self.linger_s = linger_s
        self.max_lines = max_lines
        self.on_drop = on_drop
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="serving-access-log", daemon=True)
        self._lock = threading.Lock()  # the writer's counts, against stop() giving up
        self._held = 0  # lines the writer took from the queue and has not written
        self._writing = 0  # of which in the write call now running
        self._abandoned = False  # stop() gave up waiting: write nothing more
        self._stop_taken = False  # the writer took stop()'s _STOP from the queue
        self._said: dict[str, Complaint] = {}

    def start(self) -> AccessLog:
        self._thread.start()
        return self

    @property
    def pending(self) -> int:
        """Lines queued or taken by the writer and not yet written."""
        return self._queue.qsize() + self._held

    def write(self, fields: Mapping[str, Any]) -> None:
        """Queue one request's line: ``fields`` (plain JSON values) after time, level and
        message. The time is taken now, on the caller's thread. Dropped (and counted)
        when ``max_lines`` are held already."""
        if self._queue.qsize() >= self.max_lines:  # racing callers may pass it by a few
            self._drop("queue_full", 1, "stdout does not keep up (a pipe nobody reads?)")
            return
        self._queue.put((time.time(), fields))

    def stop(self, timeout_s: float | None = 2.0) -> None:
        """Write every line queued before this call, waiting at most ``timeout_s`` seconds;
        the lines the writer has not started writing by then are dropped and counted."""
        self._queue.put(_STOP)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            return
        with self._lock:
            self._abandoned = True
            queued = self._queue.qsize() - (0 if self._stop_taken else 1)  # not _STOP
            left = queued + self._held - self._writing
        if left:
            self._drop("stopped", left, f"stdout took none of them in {timeout_s} s at exit")

    def _drop(self, reason: str, count: int, why: str) -> None:
        if self.on_drop is not None:
            self.on_drop(reason, count)
        said = self._said.get(reason)
        if said is None:
            metric = f'access_log_dropped_total{{reason="{reason}"}}'
            said = self._said.setdefault(reason, Complaint(log, "access log lines", metric))
        said.drop(why)

    def _run(self) -> None:
        while True:
            items = [self._queue.get()]
            if items[0] is not _STOP:
                time.sleep(self.linger_s)
            while len(items) <= self.max_lines:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            stopping = any(item is _STOP for item in items)
            lines = [item for item in items if item is not _STOP]
            with self._lock:
                self._held, self._stop_taken = len(lines), stopping
            for start in range(0, len(lines), _CHUNK_LINES):
                chunk = lines[start : start + _CHUNK_LINES]
                with self._lock:
                    if self._abandoned:
                        return
                    self._writing = len(chunk)
                self._emit(chunk)
                with self._lock:
                    self._held -= len(chunk)
                    self._writing = 0
            if stopping:
                return

    def _emit(self, lines: list[tuple[float, Mapping[str, Any]]]) -> None:
        data = b"".join(_format(at, fields) for at, fields in lines)
        out = sys.stdout  # looked up per write: tests and embedders may replace it
        try:
            try:
                fd = out.fileno()
            except (AttributeError, OSError, ValueError):  # not a file: pytest's capsys
                out.write(data.decode())
                out.flush()
                return
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except Exception as exc:  # a closed or broken stdout loses lines, not the worker
            self._drop("stdout_error", len(lines), f"stdout failed: {type(exc).__name__}: {exc}")


def _format(at: float, fields: Mapping[str, Any]) -> bytes:
    """One line: ``time`` as ``logging``'s ``asctime`` (local, milliseconds), ``level``,
    ``message``, then ``fields``; values orjson cannot encode are written with ``str``."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at)) + f",{int(at % 1 * 1000):03d}"
    head = {"time": stamp, "level": "INFO", "message": "request"}
    return orjson.dumps({**head, **fields}, default=str) + b"\n"


_writer: AccessLog | None = None


def configure(enabled: bool, max_lines: int = 4096, on_drop: OnDrop | None = None) -> None:
    """Start this process's writer (after fork: a thread does not survive ``fork()``), or
    none when ``enabled`` is false. Replaces a writer already running (stopping it first)."""
    global _writer
    stop()
    if enabled:
        _writer = AccessLog(max_lines=max_lines, on_drop=on_drop).start()


def record(fields: Mapping[str, Any]) -> None:
    """Queue one access line on this process's writer; dropped when none was configured."""
    writer = _writer
    if writer is not None:
        writer.write(fields)


def stop(timeout_s: float = 2.0) -> None:
    """Write the lines still queued, waiting at most ``timeout_s`` seconds, and stop this
    process's writer (idempotent)."""
    global _writer
    writer, _writer = _writer, None
    if writer is not None:
        writer.stop(timeout_s)
