"""Where payload log records go: an HTTP CloudEvents receiver or this worker's own file.

Each sink is ``send(event)`` for ``serving.observe.payload_log``'s sender thread and
raises ``OSError`` when the record could not be delivered (the sender drops and counts
it); nothing here prints or logs. ``check_sink`` is run by the Gunicorn master at start
(``serving.server.hooks.settings_or_exit``), so a file sink that cannot be written stops
the server with one line instead of failing records in every worker.

Boundary: standard library only at import (the ``cloudevents`` SDK is imported when a
sink is made); no prometheus-client, so the master may import this before it sets
``PROMETHEUS_MULTIPROC_DIR``.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from serving.errors import SettingsError
from serving.settings import Settings

__all__ = ["FileSink", "check_sink", "file_path", "http_sink"]

_BACKOFF_S = 0.1


def file_path(settings: Settings) -> Path:
    """The path of a ``file://`` ``SERVING_PAYLOAD_LOG_URL`` (each worker writes beside it)."""
    assert settings.payload_log_url is not None
    url = settings.payload_log_url.removeprefix("file://")
    return Path(urllib.request.url2pathname(url))


def check_sink(settings: Settings) -> None:
    """Check, when the payload log is on with a file sink, that files can be created
    where its workers will write (an unnamed temporary file, removed at once).

    :raises SettingsError: naming ``SERVING_PAYLOAD_LOG_URL``, the path and the system's
        reason (``No such file or directory``, ``Permission denied``, ...).
    """
    url = settings.payload_log_url
    if settings.payload_log == "off" or url is None or not url.startswith("file://"):
        return
    path = file_path(settings)
    try:
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as exc:
        problem = f"cannot create files beside {path} (each worker writes "
        problem += f"{path.stem}-<pid>{path.suffix} there): {exc.strerror}"
        raise SettingsError("SERVING_PAYLOAD_LOG_URL", problem) from None


def http_sink(settings: Settings) -> Callable[[Any], None]:
    """``send(event)``: post it in the configured content mode, retrying with backoff.

    :raises OSError: when every try failed (the caller counts the drop).
    """
    from cloudevents.core.bindings import http

    encode = http.to_binary_event if settings.payload_log_mode == "binary" else (
        http.to_structured_event
    )  # fmt: skip
    url = settings.payload_log_url
    assert url is not None
    timeout_s = settings.payload_log_timeout_ms / 1000
    tries = settings.payload_log_retries + 1

    def send(event: Any) -> None:
        message = encode(event)
        for attempt in range(tries):
            request = urllib.request.Request(
                url, data=message.body, headers=message.headers, method="POST"
            )
            try:
                with urllib.request.urlopen(request, timeout=timeout_s) as response:
                    response.read()
                return
            except OSError:  # URLError, HTTPError, timeouts, refused connections
                if attempt == tries - 1:
                    raise
                time.sleep(_BACKOFF_S * 2**attempt)

    return send


class FileSink:
    """``send(event)``: one structured-mode JSON line appended to this worker's file
    ``<stem>-<pid><suffix>``, rotated when the next line would pass ``max_bytes``
    (``.1`` the newest of ``backups`` older files; with none, the file starts afresh), as
    the standard library's ``RotatingFileHandler`` does but for these differences: every
    failure (the file cannot be opened, a full disk, EIO) raises ``OSError`` to the caller
    instead of printing a traceback; a failed write is cut back, leaving no partial line;
    and a file that was removed or replaced is opened again (by its path: a removed
    directory then fails each record until it is back).

    Usage::

        send = FileSink(Path("/var/log/p.jsonl"), max_bytes=100 * 2**20, backups=5)
        send(event)                                   # appends to /var/log/p-<pid>.jsonl
    """

    def __init__(self, path: Path, max_bytes: int, backups: int) -> None:
        from cloudevents.core.bindings import http

        self.path = path.with_name(f"{path.stem}-{os.getpid()}{path.suffix}")
        self.max_bytes = max_bytes
        self.backups = backups
        self._encode = http.to_structured_event
        self._fd = -1
        self._id = (0, 0)  # (device, inode) of the open file
        self._size = 0
        self._regular = True

    def __call__(self, event: Any) -> None:
        self.write(self._encode(event).body + b"\n")

    def write(self, line: bytes) -> None:
        """Append ``line`` (bytes ending in a newline) in one piece, or raise ``OSError``."""
        fd = self._open()
        if self._regular and self._size and self._size + len(line) > self.max_bytes:
            self._rotate()
            fd = self._open()
        done = 0
        try:
            while done < len(line):  # a short write is followed by one that says why
                done += os.write(fd, line[done:])
        except OSError:
            if done and self._regular:
                with contextlib.suppress(OSError):  # no partial line for a reader to trip on
                    os.ftruncate(fd, self._size)
            raise
        self._size += done

    def _open(self) -> int:
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            now = None
        if self._fd >= 0 and now is not None and (now.st_dev, now.st_ino) == self._id:
            return self._fd
        self.close()
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
        self._fd = os.open(self.path, flags, 0o644)
        opened = os.fstat(self._fd)
        self._id = (opened.st_dev, opened.st_ino)
        self._size = opened.st_size
        self._regular = stat.S_ISREG(opened.st_mode)
        return self._fd

    def _rotate(self) -> None:
        self.close()
        if self.backups == 0:
            os.unlink(self.path)
            return
        for index in range(self.backups - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{index}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{index + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)
