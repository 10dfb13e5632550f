"""A trial load in a forked child, before the master loads a new model version to share.

The Gunicorn master loads the pickle, joblib and skops models its workers share
(``serving.server.sharing``). A file whose load crashes the process (a native library
built for another version reading the wrong memory, a pickle that calls ``os.abort``)
would take the master down with it, and with it every worker serving the old versions.
So on a reload, before the master loads what changed, a child forked from the master
loads the same models first, with the master's own imports and settings: only when it
did not die and ended within ``SERVING_LOAD_TIMEOUT_S`` does the master load them (a
load that fails with an error fails the same way in the master, which says so as it
always has). Otherwise the master's load is left out: each new worker loads its own,
and one that dies loading is noticed as such (``serving.server.repository.Quarantine``).

The child tells how its load ended on a pipe, one byte before it exits; its exit without
the byte is a death. Not the exit status alone: the master's ``SIGCHLD`` handler reaps
every child (Gunicorn's ``waitpid(-1)``) and may take the status first, and a crash then
read as a clean exit let the master load the file that crashes it. The child keeps none
of the master's descriptors (its listening sockets, the metrics directory's lock) and
leads its own process group, which is killed once the trial ends, is past its time, or
the master is told to stop (``stop_trials``): nothing a load forks outlives the trial.
A fork, not a fresh interpreter: that started Python and imported the libraries again,
1.7 s of CPU per reload on a 2-vCPU EPYC while the old workers served (the demo model
loads in milliseconds).

Boundary: standard library and ``serving.loading`` (in the child); no Gunicorn, Flask or
prometheus-client.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Sequence
from typing import Literal

from serving.model_settings import ModelSettings

__all__ = ["stop_trials", "trial_load"]

#: The byte the child writes once its load ended, either way.
_ENDED = b"."
#: The descriptor the child writes it to (every other one above 2 is closed).
_PIPE_FD = 3
#: Seconds between two looks at whether the child still runs.
_LOOK_S = 0.05
#: Seconds a child that wrote its byte (or closed its pipe) has to exit on its own.
_EXIT_S = 2.0
#: The signals the master handles: the child takes the defaults back.
_MASTER_SIGNALS = ("SIGHUP", "SIGQUIT", "SIGINT", "SIGTERM", "SIGTTIN", "SIGTTOU",
                   "SIGUSR1", "SIGUSR2", "SIGWINCH", "SIGCHLD")  # fmt: skip

#: The trial children running now (their process groups).
_running: set[int] = set()
_lock = threading.Lock()


def trial_load(models: Sequence[ModelSettings], timeout_s: float) -> str | None:
    """Load ``models`` in a child forked from this process: why this process must not
    load them (``died of SIGSEGV``, ``took longer than 30 s (SERVING_LOAD_TIMEOUT_S)``),
    or None: they loaded, or failed with an error the master's own load reports as it
    always has (its load fails the same way, safely)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child: measured by its byte)
        os.close(read_end)
        _child(models, write_end)
    os.close(write_end)
    with _lock:
        _running.add(pid)
    status: list[int] = []
    hung = False  # the pipe closed, and the child ran on
    try:
        ended = _wait(pid, read_end, timeout_s, status)
        if ended in (True, "closed") and not status:
            # the byte, or a closed pipe: the child's own exit says the rest (a load that
            # wrote the byte itself and then aborted passed the trial: the second attack)
            found, hung = _exit_within(pid, _EXIT_S)
            status.extend(found)
    finally:
        os.close(read_end)
        _kill_group(pid)  # what the load forked, and the child itself when past its time
        if not status:
            status.extend(_reap(pid))
        with _lock:
            _running.discard(pid)
    if ended is None:
        return f"took longer than {timeout_s:g} s (SERVING_LOAD_TIMEOUT_S)"
    if hung and ended is True:
        return "did not exit once it loaded"
    if hung:
        return "closed its pipe to the master while it loaded"
    return _why(ended is True, status)


def _why(said_loaded: bool, status: list[int]) -> str | None:
    """The outcome of a trial that ended by itself: whether the child wrote its byte,
    and its exit status (none: a ``SIGCHLD`` handler took it)."""
    if status and os.WIFSIGNALED(status[0]):
        return f"died of {signal.Signals(os.WTERMSIG(status[0])).name}"
    if status and os.WEXITSTATUS(status[0]) != 0:
        return f"exited with status {os.WEXITSTATUS(status[0])} while it loaded"
    return None if said_loaded else "died while loading"


def stop_trials() -> None:
    """Kill every trial running now, with what it forked (the master is stopping)."""
    with _lock:
        running = list(_running)
    for pid in running:
        _kill_group(pid)


def _child(models: Sequence[ModelSettings], write_end: int) -> None:
    """The forked child: leave the master's process group and descriptors, load each
    model as the master would, write the byte, exit (never returns; no handler,
    ``atexit`` or log line of the master's runs here, and nothing it prints reaches the
    master's log)."""
    try:
        os.setsid()
        for name in _MASTER_SIGNALS:
            signal.signal(getattr(signal, name), signal.SIG_DFL)
        os.dup2(write_end, _PIPE_FD)
        os.closerange(_PIPE_FD + 1, os.sysconf("SC_OPEN_MAX"))
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1)  # what the file prints as it loads: not the master's log
        os.dup2(quiet, 2)
        os.close(quiet)
        logging.disable(logging.CRITICAL)  # the master logs its own load
        faulthandler.disable()  # a crash is said once, by the master
        from serving.loading import load_artifact

        for model in models:
            try:
                load_artifact(model)
            except Exception:  # an error: the master's own load says it
                break
        os.write(_PIPE_FD, _ENDED)
    finally:
        os._exit(0)


def _wait(
    pid: int, read_end: int, timeout_s: float, status: list[int]
) -> bool | Literal["closed"] | None:
    """True when the byte came, False when the child exited without it (a death, even
    while something it forked holds the pipe open), ``"closed"`` when the pipe closed
    without it (the child's exit tells the rest), None when ``timeout_s`` passed first.
    ``status`` gets the child's exit status when this look reaped it."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([read_end], [], [], min(left, _LOOK_S))
        if readable:
            return True if os.read(read_end, 1) == _ENDED else "closed"
        try:
            done, code = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # a SIGCHLD handler reaped it: it has exited
            done, code = pid, None
        if done:
            if code is not None:
                status.append(code)
            readable, _, _ = select.select([read_end], [], [], 0)
            return bool(readable) and os.read(read_end, 1) == _ENDED
    return None


def _exit_within(pid: int, seconds: float) -> tuple[list[int], bool]:
    """The child's exit status once it exits within ``seconds`` (after its byte it only
    calls ``os._exit(0)``), or none when a ``SIGCHLD`` handler reaped it; and whether it
    still ran at the end (it is killed)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            done, code = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return [], False
        if done:
            return [code], False
        if time.monotonic() > deadline:
            return [], True
        time.sleep(0.005)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _reap(pid: int) -> list[int]:
    """The child's exit status, or none when a ``SIGCHLD`` handler reaped it first."""
    try:
        return [os.waitpid(pid, 0)[1]]
    except ChildProcessError:
        return []
