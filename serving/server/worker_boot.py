"""How a worker gets its model before it serves, and what the master shares for it.

Two ways, decided in ``post_fork``: a worker of the first boot loads in the background
while accepting (``load_while_accepting``: ``/livez`` 200, ``/healthz`` 503 until every
worker is ready) and a failed load halts the server (``halt_on_failure``: exit status
``WORKER_BOOT_ERROR``, one line saying why). A worker forked once others serve (a respawn,
a ``max_requests`` recycle, a ``SIGHUP`` reload) loads before it accepts a connection and
retries a failed load after ``RETRY_FIRST_S`` seconds, doubling up to ``RETRY_MAX_S``
(``load_before_accepting``), while the others serve on; when none serves any more, it
accepts meanwhile (503 ``not_ready``, ``/livez`` 200) and retries in the background.
Either way it publishes its state on the board (``serving.server.board``).

``Boot`` is what the master creates before the first fork and every worker inherits: the
board, the recycle gate and two flags in shared memory. Imports neither prometheus-client
nor the Flask app at module level (the master imports it through ``hooks``).
"""

from __future__ import annotations

import contextlib
import functools
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.server import sharing
from serving.server.board import Board, WorkerState, install_board
from serving.server.metrics_dir import remove_at_exit
from serving.server.recycling import RecycleGate
from serving.settings import DEMO_MODEL_PATH, Settings

__all__ = [
    "RETRY_FIRST_S",
    "RETRY_MAX_S",
    "WORKER_BOOT_ERROR",
    "Boot",
    "Retry",
    "halt_on_failure",
    "load_error_line",
    "load_before_accepting",
    "load_while_accepting",
    "stop_on_signal_until_serving",
]

#: Exit status that makes the Gunicorn arbiter halt instead of respawning the worker.
WORKER_BOOT_ERROR = 3
#: Seconds between load attempts of a worker after the first boot: doubling, at most 60.
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 60.0


@dataclass(frozen=True)
class Boot:
    """What the master shares with the workers it forks (``Boot.create`` in
    ``on_starting``).

    ``failed`` is set by the first worker whose model fails to load. Only that worker exits
    with ``WORKER_BOOT_ERROR``: when a second one does too, the arbiter meets it again while
    halting and dies with a traceback and status 1. The others exit with 1, which the
    halting arbiter just reaps (waiting for its SIGTERM instead can take the whole graceful
    timeout: a worker still booting loses a signal sent before its handlers exist).
    ``booted`` is set by the master once every first-boot worker is ready
    (``serving.server.rollover``): a worker forked after that loads before accepting.
    ``stopping`` is set by the master as it stops the whole server (not a reload), so the
    last workers to close the listening socket first take what is in its backlog
    (``ServingWorker._stop_listening``). ``shared`` is 1 while another server may listen
    on the same socket (inherited from systemd or a file descriptor, this master started
    by a ``SIGUSR2`` upgrade, or an upgrade it started: set by its ``pre_exec``), so
    workers orphaned by a killed master filter new connections only when it is 0.
    """

    board: Board
    gate: RecycleGate
    failed: Any  # multiprocessing.Value("b"): 1 once a first-boot load failed
    booted: Any  # multiprocessing.Value("b"): 1 once the first boot is over
    #: multiprocessing.Value("b"): 1 once the master is stopping the whole server.
    stopping: Any = None
    #: multiprocessing.Value("b"): 1 while another server may listen on the socket.
    shared: Any = None

    @classmethod
    def create(cls, num_workers: int) -> Boot:
        """A new board (removed when the master exits, and installed for the probes), a
        gate for ``num_workers`` and both flags down."""
        board = Board.create()
        remove_at_exit(board.destroy)
        stopping = multiprocessing.Value("b", 0)
        install_board(board, stopping=lambda: bool(stopping.value))
        gate = RecycleGate(board)
        gate.target = num_workers
        return cls(
            board,
            gate,
            multiprocessing.Value("b", 0),
            multiprocessing.Value("b", 0),
            stopping,
            multiprocessing.Value("b", 0),
        )

    def others_serve(self) -> bool:
        """Whether this worker must load before accepting: the first boot is over, or a
        worker is already ready (a recycle or respawn before the master noticed the boot
        was over)."""
        return bool(self.booted.value) or self.board.read().ready_count > 0


def stop_on_signal_until_serving(server: Any) -> None:
    """Worker, first thing after fork: exit at once on SIGTERM, SIGINT or SIGQUIT until
    Gunicorn installs the worker's own handlers (after ``post_fork``). Until then the
    worker runs the master's handlers, which only queue the signal: a SIGTERM (the master
    shutting down or replacing it) was lost and the worker loaded and served on, or was
    SIGKILLed after the graceful timeout. It has accepted nothing yet, so it can go."""
    pid = os.getpid()

    def leave(signum: int, frame: Any) -> None:
        server.log.info("worker %s: stopping while loading (signal %s)", pid, signum)
        for listener in server.LISTENERS:  # now, not at exit: see ServingWorker.set_accept_enabled
            with contextlib.suppress(OSError):
                listener.close()
        sys.exit(0)

    for stop in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
        signal.signal(stop, leave)


def halt_on_failure(
    server: Any, worker: Any, boot: Boot | None, service_log: Any
) -> Callable[[BaseException], None]:
    """The first boot's ``on_failure``: log why and exit, with ``WORKER_BOOT_ERROR`` (the
    server halts) for the first worker to fail, with 1 for any other."""

    def on_failure(exc: BaseException) -> None:
        first = boot is None
        if boot is not None:
            with boot.failed.get_lock():
                first, boot.failed.value = boot.failed.value == 0, 1
        if first:
            server.log.error("worker %s: %s; stopping the server", worker.pid, exc)
            for handler in service_log.handlers:
                handler.flush()
            os._exit(WORKER_BOOT_ERROR)
        server.log.error("worker %s: %s", worker.pid, exc)
        os._exit(1)

    return on_failure


def load_while_accepting(
    cache: Any, board: Board | None, on_failure: Callable[[BaseException], None]
) -> None:
    """Worker of the first boot: load in the background ("starting" on the board, then
    "ready"); ``on_failure`` halts the server."""
    pid = os.getpid()
    if board is not None:
        board.write(pid, "starting")
        cache.report_stages(functools.partial(board.write, pid, "starting", None))

    def on_ready() -> None:
        if board is not None:
            board.write(pid, "ready")

    cache.start_loading(on_failure, on_ready)


#: What ``load_before_accepting`` hands back when no worker serves: start retrying in the
#: background, calling ``on_loaded(cache)`` with the loaded cache.
Retry = Callable[[Callable[[Any], None]], None]


def load_before_accepting(
    server: Any, worker: Any, settings: Settings, slot: int, board: Board | None
) -> tuple[Any, Retry | None]:
    """Worker, after the first boot: load every model before accepting a connection. A
    failed load is logged (model path and cause), counted in
    ``serving_model_load_failures_total``, shown in ``/healthz`` (``failed``) and retried
    after ``RETRY_FIRST_S`` doubling up to ``RETRY_MAX_S`` seconds; the server goes on with
    the other workers. Returns the loaded ``ModelCache`` and None.

    When no worker serves (the others died since), a worker waiting to retry would hold
    the listening socket while nobody accepts: every client waited for its own timeout,
    ``/livez`` included. It then returns a cache of models not loaded (they answer 503
    ``not_ready``) and a ``Retry`` to start: the worker accepts meanwhile, ``starting`` on
    the board with its last error, and retries in the background."""
    pid = os.getpid()
    delay_s = RETRY_FIRST_S
    last_error: str | None = None  # kept while retrying: the rollout still failed
    while True:
        if board is not None:
            board.write(pid, "warming", last_error)
        cache, error = _load_once(worker, settings, slot, board, last_error)
        if error is None:
            return cache, None
        failed_on = _failed_model(cache)
        last_error = load_error_line(error)
        if cache is not None and board is not None and board.read().ready_count == 0:
            server.log.error(
                "worker %s: %s; no worker serves: accepting meanwhile (503 not_ready), "
                "retrying in %g s", pid, last_error, delay_s,
            )  # fmt: skip
            board.write(pid, "starting", last_error)
            retry = functools.partial(
                _retry_while_accepting, server, worker, settings,
                slot=slot, board=board, delay_s=delay_s, last_error=last_error,
            )  # fmt: skip
            return _unloaded(settings, slot), retry
        server.log.error(
            "worker %s: %s; retrying in %g s (the other workers go on serving)",
            pid,
            last_error,
            delay_s,
        )
        if board is not None:
            board.write(pid, "failed", last_error, model=failed_on)
        _wait_alive(worker, delay_s)
        delay_s = min(delay_s * 2, RETRY_MAX_S)


def load_error_line(error: BaseException) -> str:
    """``error`` as one line for the log, the board and the repository index; one that
    is no ``Exception`` (a file whose load calls ``sys.exit(4)`` or raises
    ``KeyboardInterrupt``) or says nothing is named by its type (the attack read ``a worker
    could not load it: 4``, and an empty reason)."""
    text = " ".join(str(error).split())  # a message may hold newlines
    if isinstance(error, Exception) and text:
        return text
    return f"the load raised {type(error).__name__}" + (f"({text})" if text else "")


def _unloaded(settings: Settings, slot: int) -> Any:
    """A ``ModelCache`` of the models, none loaded: each answers 503 ``not_ready``
    ("loading"), ``/livez`` 200 (a failed one says only a restart helps)."""
    from serving.cache import ModelCache
    from serving.observe.metrics import default_metrics

    return ModelCache.of(
        sharing.models_of(settings), default_metrics(), slot, sharing.inherited,
        settings.refused_models(),
    )  # fmt: skip


def _retry_while_accepting(
    server: Any,
    worker: Any,
    settings: Settings,
    on_loaded: Callable[[Any], None],
    *,
    slot: int,
    board: Board,
    delay_s: float,
    last_error: str,
) -> None:
    """In a daemon thread, while the worker accepts: retry the load as
    ``load_before_accepting`` does (``starting`` on the board, its last error kept); once
    it loads, ``on_loaded(cache)`` and ``ready``."""
    pid = os.getpid()

    def retry() -> None:
        delay, error_text = delay_s, last_error
        while True:
            time.sleep(delay)
            board.write(pid, "starting", error_text)
            cache, error = _load_once(worker, settings, slot, board, error_text, state="starting")
            if error is None:
                on_loaded(cache)
                board.write(pid, "ready")
                server.log.info("worker %s: loaded on a retry; serving", pid)
                return
            delay, error_text = min(delay * 2, RETRY_MAX_S), str(error)
            server.log.error("worker %s: %s; retrying in %g s", pid, error, delay)
            board.write(pid, "starting", error_text)

    threading.Thread(target=retry, name="serving-load-retry", daemon=True).start()


def _first_model(settings: Settings) -> tuple[str, str, Path]:
    """The first model's name, version and configured path, asking nothing of the file
    system (its artifact may be what vanished)."""
    if settings.models:
        first = settings.models[0]
        return first.name, first.version, first.path
    path = settings.model_path or settings.model_dir or DEMO_MODEL_PATH
    return settings.model_name or path.stem, settings.model_version, path


def _load_once(
    worker: Any,
    settings: Settings,
    slot: int,
    board: Board | None,
    last_error: str | None,
    *,
    state: WorkerState = "warming",
) -> tuple[Any, BaseException | None]:
    """One attempt: a ``ModelCache`` loaded in the background while this thread keeps the
    worker alive for the arbiter, its stages on the board under ``state``; ``(cache,
    None)``, or ``(None or the cache, the first error)`` with the failure counted."""
    from serving.cache import ModelCache
    from serving.errors import ModelLoadError
    from serving.observe.metrics import default_metrics

    metrics = default_metrics()
    try:
        cache = ModelCache.of(
            sharing.models_of(settings), metrics, slot, sharing.inherited,
            settings.refused_models(),
        )  # fmt: skip
    except ValueError as exc:  # the paths were checked when the settings were read: vanished
        reason = "; ".join(e["msg"] for e in getattr(exc, "errors", lambda: [])())
        name, version, path = _first_model(settings)
        metrics.model_load_failed(name, version)
        return None, ModelLoadError(path, reason or str(exc))
    if board is not None:
        pid = os.getpid()

        def report(stage: str) -> None:  # and the model it loads: a crash names it
            board.write(pid, state, last_error, stage, model=_loading(cache))

        cache.report_stages(report)
    done = threading.Event()
    failures: list[BaseException] = []
    cache.start_loading(failures.append, done.set)
    while not done.is_set() and not failures:  # bounded: each model's load timeout
        worker.notify()  # the arbiter's --timeout counts from the fork: stay alive
        done.wait(0.5)
    if not failures:
        return cache, None
    if (failed := _failed_model(cache)) is not None:
        metrics.model_load_failed(*failed)
    return cache, failures[0]


def _loading(cache: Any) -> tuple[str, str] | None:
    """The ``(name, version)`` of the model of ``cache`` being loaded now, or None."""
    for runtime in cache.runtimes:
        if runtime.stage is not None:
            return runtime.model_name, runtime.model_version
    return None


def _failed_model(cache: Any) -> tuple[str, str] | None:
    """The ``(name, version)`` of the first model of ``cache`` whose load failed (or did
    not end: its warm-up timed out), or None (no cache: the settings' paths vanished)."""
    for runtime in cache.runtimes if cache is not None else ():
        if runtime.error is not None or runtime.state == "loading":
            return runtime.model_name, runtime.model_version
    return None


def _wait_alive(worker: Any, delay_s: float) -> None:
    """Wait ``delay_s`` seconds, telling the arbiter at least once a second that the
    worker is alive."""
    deadline = time.monotonic() + delay_s
    while time.monotonic() < deadline:
        worker.notify()
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
