"""Gunicorn's error log on stderr, dropping lines instead of blocking when nobody reads.

Gunicorn writes its error log (and ``serving``'s, which ``hooks`` sends there) with a
``logging.StreamHandler`` on stderr: a blocking write. When stderr is a pipe nobody
drains (a stalled log collector, ``gunicorn ... 2>&1 | (sleep 300)``), the pipe fills
and the first process to log blocks in ``write``: the master then handled no signal (it
ignored SIGTERM for good), replaced no dead worker, and a worker logging mid-request hung
the request (found by the attack). ``NonBlockingStreamHandler`` writes a line only while
the pipe has room (``poll`` for ``POLLOUT`` first: a pipe with room takes a write of up
to ``PIPE_BUF`` bytes at once), in pieces of at most ``PIPE_BUF`` bytes, and otherwise
drops the line (or the rest of it) and counts it; the first line written after says how
many were dropped. No thread and no queue, so it is the same in the master and in every
worker after fork. A file or a terminal always has room, and a stream without a file
descriptor (tests) is written as ``logging`` does.

``NonBlockingLogger`` is Gunicorn's logger with that handler for ``errorlog = "-"`` (its
default), and its warning per refused request made sparse; ``gunicorn.conf.py`` names it
as ``logger_class``.

Imports only the standard library and Gunicorn.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from typing import Any

from gunicorn.glogging import Logger  # type: ignore[import-untyped]

__all__ = ["INVALID_CHARS", "INVALID_EVERY_S", "NonBlockingLogger", "NonBlockingStreamHandler"]

#: Bytes a pipe with room takes in one write without blocking (POSIX PIPE_BUF on Linux).
_PIPE_BUF = 4096
#: Gunicorn's warning for each request it refuses (``workers/base.py``, ``handle_error``).
_INVALID = "Invalid request from ip="
#: Least seconds between two of those lines, and the most characters of one kept.
INVALID_EVERY_S = 60.0
INVALID_CHARS = 300


class NonBlockingStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A ``StreamHandler`` that never blocks on a full pipe: it drops lines instead,
    counting them in ``dropped`` and saying the count with the next line it writes.

    Usage::

        handler = NonBlockingStreamHandler(sys.stderr)
    """

    def __init__(self, stream: Any = None) -> None:
        super().__init__(stream)
        self.dropped = 0  # lines dropped in all
        self._unsaid = 0  # dropped since the last notice
        self._cut = False  # the last line written was cut short

    def emit(self, record: logging.LogRecord) -> None:
        try:
            fd = self.stream.fileno()
        except (AttributeError, OSError, ValueError):  # io.StringIO, pytest's capture
            super().emit(record)
            return
        try:
            line = self.format(record) + self.terminator
        except Exception:
            self.handleError(record)
            return
        with self.lock:  # type: ignore[union-attr]  # threads of one process take turns
            if self._unsaid and _room(fd):
                notice = f"log lines dropped: stderr was full ({self._unsaid} lines)\n"
                if self._write(fd, notice.encode()):
                    self._unsaid = 0
            if not self._write(fd, line.encode("utf-8", "backslashreplace")):
                self.dropped += 1
                self._unsaid += 1

    def _write(self, fd: int, data: bytes) -> bool:
        """Write ``data`` while ``fd`` has room; False when it had none for the first byte.
        A line cut short is ended with a mark once there is room (the next write's)."""
        sent = 0
        try:
            while sent < len(data):
                if not _room(fd):
                    if sent:
                        self._cut = True
                    return sent > 0
                if self._cut:
                    os.write(fd, b" [cut: stderr was full]\n")
                    self._cut = False
                    continue
                sent += os.write(fd, data[sent : sent + _PIPE_BUF])
        except OSError:  # a closed or broken stderr
            return False
        return True


def _room(fd: int) -> bool:
    """Whether a write to ``fd`` returns at once (a pipe with a free buffer)."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(mask & select.POLLOUT for _, mask in poller.poll(0))


class NonBlockingLogger(Logger):  # type: ignore[misc]
    """Gunicorn's ``glogging.Logger`` whose stderr handlers are
    ``NonBlockingStreamHandler``s (a file given as ``errorlog``/``accesslog`` is kept as
    Gunicorn opens it), and whose warning per invalid request is said at most once in
    ``INVALID_EVERY_S`` seconds, cut to ``INVALID_CHARS``, with how many were not: Gunicorn
    warns for each request it refuses, quoting it, and each such answer is already in
    the access log and ``/metrics`` (route ``(gunicorn)``)."""

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self._invalid_lock = threading.Lock()
        self._invalid_next = 0.0
        self._invalid_unsaid = 0

    def warning(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(msg, str) and msg.startswith(_INVALID):
            now = time.monotonic()
            with self._invalid_lock:
                if now < self._invalid_next:
                    self._invalid_unsaid += 1
                    return
                unsaid, self._invalid_unsaid = self._invalid_unsaid, 0
                self._invalid_next = now + INVALID_EVERY_S
            msg = msg if len(msg) <= INVALID_CHARS else f"{msg[:INVALID_CHARS]}... (cut)"
            if unsaid:
                msg = f"{msg} (and {unsaid} more since the last said, one line a minute at most)"
        super().warning(msg, *args, **kwargs)

    def _set_handler(self, log: logging.Logger, output: Any, fmt: Any, stream: Any = None) -> None:
        super()._set_handler(log, output, fmt, stream)
        if output != "-":
            return
        for index, handler in enumerate(log.handlers):
            if getattr(handler, "_gunicorn", False) and type(handler) is logging.StreamHandler:
                replacement = NonBlockingStreamHandler(handler.stream)
                replacement.setFormatter(handler.formatter)
                replacement.setLevel(handler.level)
                replacement._gunicorn = True  # type: ignore[attr-defined]  # Gunicorn's mark
                log.handlers[index] = replacement
