"""The master's prometheus-client multiprocess directory: chosen, held, and removed.

``prepare_metrics_dir`` (the config file, in the master) picks the directory
(``SERVING_METRICS_DIR``, else an exported ``PROMETHEUS_MULTIPROC_DIR``, else a new
temporary one, marked as this server's), exports it to the workers and takes an exclusive
``flock`` on ``<dir>/serving.lock``, which holds the master's pid. Two servers on one
directory wiped and overwrote each other's counters (each master removes the ``*.db``
files at start, and each worker writes ``counter_<pid>.db``): a second server is now
refused at start, naming the directory and the first master's pid. The lock belongs to
the open file, which the workers inherit: it is held while any process of the server
lives. A ``SIGUSR2`` generation (``GUNICORN_PID`` is its parent master, the holder)
shares its parent's directory, as Gunicorn intends, and takes the lock over when the
parent generation is gone.

``remove_at_exit`` removes what the master made (the temporary metrics directory, unless
another generation of the server still uses it; the workers' board) when the master's
interpreter exits, whichever way (``run_at_exit`` from ``on_exit`` does it earlier):
Gunicorn calls its ``on_exit`` hook only after a normal halt, not when it cannot bind its
address.

Imports only the standard library.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from serving.server.board import alive
from serving.settings import Settings

__all__ = [
    "LOCK_FILE",
    "OWNED_MARK",
    "prepare_metrics_dir",
    "remove_at_exit",
    "run_at_exit",
    "set_master",
]

#: Marks a metrics directory this server created (and removes when its master exits).
OWNED_MARK = ".serving-temporary"
#: In the metrics directory: ``flock``-ed by the server using it, holding its master's pid.
LOCK_FILE = "serving.lock"

_held: dict[Path, int] = {}  # directory -> the open lock file (this master's)
_master = os.getpid()
_server: Any = None  # the Gunicorn arbiter, once it runs
_at_exit: list[Callable[[], None]] = []


def _refuse(message: str) -> SystemExit:
    print(f"serving: invalid setting SERVING_METRICS_DIR: {message}", file=sys.stderr)
    return SystemExit(2)


def _lock(path: Path) -> None:
    """Hold ``path/serving.lock`` for this server, or exit with status 2 naming the holder.

    :raises SystemExit: (2) another server's master holds it.
    """
    if path in _held:  # a HUP runs the config file again
        return
    fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        if holder == os.environ.get("GUNICORN_PID"):  # a SIGUSR2 generation: its parent's
            _take_over(path, fd)  # directory is its own; the lock, once the parent goes
            return
        os.close(fd)
        raise _refuse(
            f"{path} is in use by another server (master pid {holder}); give each server "
            "its own directory"
        ) from None
    _held[path] = fd
    _write_pid(fd)


def _take_over(path: Path, fd: int) -> None:
    """Wait (a daemon thread) for the parent generation to release the lock, then hold it."""

    def wait() -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _held[path] = fd
        _write_pid(fd)

    threading.Thread(target=wait, name="serving-metrics-lock", daemon=True).start()


def _write_pid(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def set_master(server: Any) -> None:
    """The master, once it runs (after a ``--daemon`` fork): the cleanup and the pid in the
    lock files are this process's, and ``server`` (the arbiter) knows whether another
    generation shares the directory."""
    global _master, _server
    _master, _server = os.getpid(), server
    for fd in _held.values():
        _write_pid(fd)


def _remove_created(path: Path) -> None:
    """Remove the temporary directory this server made, unless a ``SIGUSR2`` generation
    (the new master, or the old one) still runs and uses it."""
    server = _server
    other = (server.reexec_pid or server.master_pid) if server is not None else 0
    if not (other and alive(other)):
        shutil.rmtree(path, ignore_errors=True)


def remove_at_exit(remove: Callable[[], None]) -> None:
    """Call ``remove()`` when the master's interpreter exits (not in the workers, which
    inherit the registration)."""
    if not _at_exit:
        atexit.register(run_at_exit)
    _at_exit.append(remove)


def run_at_exit() -> None:
    """In the master: do (once) what ``remove_at_exit`` registered; elsewhere nothing."""
    if os.getpid() != _master:
        return
    while _at_exit:
        with contextlib.suppress(Exception):
            _at_exit.pop()()


def prepare_metrics_dir(settings: Settings) -> Path:
    """Choose the prometheus-client multiprocess directory, export it to the workers and
    hold it for this server (see the module docstring). Idempotent: Gunicorn re-reads the
    config on HUP.

    :raises SystemExit: (2) with one line on stderr when the directory cannot be made or
        another server uses it.
    """
    if settings.metrics_dir is not None:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(settings.metrics_dir)
    elif "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        created = Path(tempfile.mkdtemp(prefix="serving-metrics-"))
        (created / OWNED_MARK).touch()
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(created)
        remove_at_exit(lambda: _remove_created(created))
    path = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    try:
        path.mkdir(parents=True, exist_ok=True)
        _lock(path)
    except OSError as exc:
        raise _refuse(f"{path}: {exc.strerror}") from None
    return path
