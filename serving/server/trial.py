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

The child tells how its load ended on a pipe, one byte before it exits; end of file
without it is a death. Not the exit status: the master's ``SIGCHLD`` handler reaps every
child (Gunicorn's ``waitpid(-1)``) and may take the status first, and a crash then read
as a clean exit let the master load the file that crashes it. A fork, not a fresh
interpreter: that started Python and imported the libraries again, 1.7 s of CPU per
reload on a 2-vCPU EPYC while the old workers served (the demo model loads in
milliseconds).

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
import time
from collections.abc import Sequence

from serving.model_settings import ModelSettings

__all__ = ["trial_load"]

#: The byte the child writes once its load ended, either way.
_ENDED = b"."
#: The signals the master handles: the child takes the defaults back.
_MASTER_SIGNALS = ("SIGHUP", "SIGQUIT", "SIGINT", "SIGTERM", "SIGTTIN", "SIGTTOU",
                   "SIGUSR1", "SIGUSR2", "SIGWINCH", "SIGCHLD")  # fmt: skip


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
    try:
        ended = _wait_for_byte(read_end, timeout_s)
    finally:
        os.close(read_end)
    if ended is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _reap(pid)
        return f"took longer than {timeout_s:g} s (SERVING_LOAD_TIMEOUT_S)"
    status = _reap(pid)
    if ended:
        return None
    if status is not None and os.WIFSIGNALED(status):
        return f"died of {signal.Signals(os.WTERMSIG(status)).name}"
    return "died while loading"


def _child(models: Sequence[ModelSettings], write_end: int) -> None:
    """The forked child: load each model as the master would, write the byte, exit
    (never returns; no handler, ``atexit`` or log line of the master's runs here, and
    nothing it prints reaches the master's log)."""
    try:
        for name in _MASTER_SIGNALS:
            signal.signal(getattr(signal, name), signal.SIG_DFL)
        logging.disable(logging.CRITICAL)  # the master logs its own load
        faulthandler.disable()  # a crash is said once, by the master
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1)  # what the file prints as it loads: not the master's log
        os.dup2(quiet, 2)
        from serving.loading import load_artifact

        for model in models:
            try:
                load_artifact(model)
            except Exception:  # an error: the master's own load says it
                break
        os.write(write_end, _ENDED)
    finally:
        os._exit(0)


def _wait_for_byte(read_end: int, timeout_s: float) -> bool | None:
    """True when the byte came, False at end of file without it (the child died), None
    when ``timeout_s`` passed first."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            readable, _, _ = select.select([read_end], [], [], left)
        except InterruptedError:  # pragma: no cover (PEP 475 retries; kept for clarity)
            continue
        if readable:
            return os.read(read_end, 1) == _ENDED
    return None


def _reap(pid: int) -> int | None:
    """The child's exit status, or None when a ``SIGCHLD`` handler reaped it first."""
    try:
        return os.waitpid(pid, 0)[1]
    except ChildProcessError:
        return None
