"""Processes a model forks inside a worker: what they inherit, and how the worker ends them.

A model may fork (``os.fork()``, ``multiprocessing`` with the fork start method) to run a
helper. The child is a copy of the Gunicorn worker: it holds the listening sockets and
Gunicorn's signal handlers, whose ``SIGTERM`` only sets the worker's ``alive`` flag. After
the server's ``SIGTERM`` such a child went on running, held the port (the next server
could not bind it) and took a ``SIGKILL`` to stop.

``forget_server_in_children`` (each worker, after fork) registers an at-fork hook that runs
in every child the worker forks from Python: it closes the listening sockets in the child
and sets the signals Gunicorn handles back to their defaults, so ``SIGTERM`` ends it.
``stop_children`` (the worker, when it exits) sends ``SIGTERM`` to the worker's children
still running, then ``SIGKILL`` to those still there after ``timeout_s``: a worker's exit
takes what its model forked with it. Children that ``exec`` (``subprocess``) run no
at-fork hook; they do not inherit the listening sockets (Python makes sockets
non-inheritable), and ``stop_children`` ends them too. Grandchildren are not followed.

Imports only the standard library.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = ["children", "forget_server_in_children", "stop_children"]

#: Signals a Gunicorn master or worker handles; a forked child gets the defaults back.
_SERVER_SIGNALS = (
    "SIGTERM", "SIGINT", "SIGQUIT", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGWINCH", "SIGABRT",
    "SIGTTIN", "SIGTTOU", "SIGCHLD",
)  # fmt: skip

_registered = False


def _forget(listeners: Iterable[Any]) -> None:
    """In a freshly forked child: close ``listeners`` and restore default signal actions."""
    for listener in listeners:
        with contextlib.suppress(OSError):
            listener.close()
    for name in _SERVER_SIGNALS:
        with contextlib.suppress(AttributeError, OSError, ValueError):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    with contextlib.suppress(ValueError):
        signal.set_wakeup_fd(-1)


def forget_server_in_children(listeners: Iterable[Any]) -> bool:
    """Make every child this process forks from now on close ``listeners`` (the worker's
    listening sockets: objects with ``close()``) and take back the default action of each
    signal Gunicorn handles. Once per process; False when already registered."""
    global _registered
    if _registered:
        return False
    sockets = list(listeners)
    os.register_at_fork(after_in_child=lambda: _forget(sockets))
    _registered = True
    return True


def children(pid: int | None = None) -> list[int]:
    """The live children of process ``pid`` (default: this one), over all its threads,
    from ``/proc/<pid>/task/<tid>/children``; empty where the kernel does not list them."""
    pid = os.getpid() if pid is None else pid
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += [int(child) for child in (task / "children").read_text().split()]
    return sorted(set(found))


def _reap(pids: list[int]) -> list[int]:
    """Reap whichever of ``pids`` (our children) exited; the ones still running."""
    running = []
    for pid in pids:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # already reaped (multiprocessing, a SIGCHLD handler)
            continue
        if not done:
            running.append(pid)
    return running


def stop_children(
    timeout_s: float = 2.0,
    log: Callable[[str], None] | None = None,
    pids: list[int] | None = None,
    interval_s: float = 0.05,
) -> list[int]:
    """``SIGTERM`` to each live child of this process (or to ``pids``, children of it);
    ``SIGKILL`` to those still running after ``timeout_s`` seconds; each is reaped.
    Returns the pids that were running."""
    pids = children() if pids is None else pids
    if not pids:
        return []
    if log is not None:
        log(f"stopping {len(pids)} process(es) the model forked: {pids}")
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    running = _reap(pids)
    while running and time.monotonic() < deadline:
        time.sleep(interval_s)
        running = _reap(running)
    for pid in running:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    return pids
