"""What ``gunicorn.conf.py``'s hooks do, kept here so the config file stays settings only.

Runs in two roles: ``settings_or_exit``, ``prepare_metrics_dir``, ``on_starting``,
``when_ready``, ``on_reload``, ``child_exit`` and ``on_exit`` in the master; ``post_fork``
and ``worker_exit`` in each worker. How workers know each other's state and how the master
rolls them over is in ``serving.server.workers``; the metrics directory
(``prepare_metrics_dir``, re-exported for the config file) in
``serving.server.metrics_dir``. Nothing here imports prometheus-client or the Flask app
at module level: the master must set
``PROMETHEUS_MULTIPROC_DIR`` before prometheus-client is first imported.

Where the model is loaded: pickle, joblib and skops models once, in the master, before it
forks (``when_ready``, and ``on_reload`` for a ``SIGHUP``), so every worker shares one copy
(``serving.server.sharing``; never predict in the master). ONNX models, your own classes
and everything under ``SERVING_SHARE_MODEL=off`` in each worker after fork: ONNX Runtime
and OpenMP/BLAS create thread pools when a model is loaded or first run, and threads do
not survive ``fork()`` (a forked pool can deadlock on a lock held by a thread that no
longer exists). Either way each worker pins its own pools, warms up and batches.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from serving.auth import load_api_keys
from serving.batching.arrivals import process_arrivals
from serving.errors import SettingsError
from serving.observe import access_log
from serving.observe.payload_sinks import check_sink
from serving.server import sharing
from serving.server.children import forget_server_in_children, stop_children
from serving.server.metrics_dir import prepare_metrics_dir, remove_at_exit, run_at_exit, set_master
from serving.server.workers import Board, RecycleGate, install_board, roll_over
from serving.settings import Settings, load_settings, unknown_variables

__all__ = [
    "child_exit",
    "on_exit",
    "cpus_for_slot",
    "on_reload",
    "on_starting",
    "post_fork",
    "pre_fork",
    "prepare_metrics_dir",
    "settings_or_exit",
    "when_ready",
    "worker_exit",
]

#: Exit status that makes the Gunicorn arbiter halt instead of respawning the worker.
WORKER_BOOT_ERROR = 3

# Set by the first worker whose model fails to load. Only that worker exits with
# WORKER_BOOT_ERROR: when a second one does too, the arbiter meets it again while halting
# and dies with a traceback and status 1. The others exit with 1, which the halting
# arbiter just reaps (waiting for its SIGTERM instead can take the whole graceful
# timeout: a worker still booting loses a signal sent before its handlers exist).
_boot_failed: Any = None
# Set by the master once every first-boot worker is ready (serving.server.workers.roll_over). A
# worker forked after that (a respawn, a max_requests recycle, a HUP reload) loads before
# it accepts a connection and retries a failed load with backoff instead of halting the
# server. The first workers load while answering /livez 200 and /healthz 503: nobody can
# serve yet, and probes learn it.
_booted: Any = None
# Every worker's state, one file each (serving.server.workers.Board), and the max_requests gate.
_board: Board | None = None
_gate: RecycleGate | None = None
#: Seconds between load attempts of a worker after the first boot: doubling, at most 60.
RETRY_FIRST_S = 1.0
RETRY_MAX_S = 60.0


def settings_or_exit() -> Settings:
    """``load_settings()``, or one line on stderr naming the bad variable and exit status 2
    (also for an API keys file that cannot be read and a payload log file sink that cannot
    be written)."""
    try:
        settings = load_settings()
        load_api_keys(settings)  # an unreadable keys file stops start-up here, not per worker
        check_sink(settings)  # so does a payload log file that cannot be written
    except SettingsError as exc:
        print(f"serving: invalid setting {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    for name in unknown_variables(os.environ):
        print(f"serving: warning: {name} is not a setting (ignored); see README", file=sys.stderr)
    return settings


def on_starting(server: Any) -> None:
    """Master, once: remove prometheus-client's ``*.db`` files so counters start at zero
    (only those: the directory may be shared or hold other files; and not after a
    ``SIGUSR2`` re-exec, whose old generation still writes there), create the workers'
    board and make the arbiter roll workers over one by one (``serving.server.workers``)."""
    global _boot_failed, _booted, _board, _gate
    _boot_failed = multiprocessing.Value("b", 0)  # shared with the workers forked later
    _booted = multiprocessing.Value("b", 0)
    set_master(server)
    _board = Board.create()
    remove_at_exit(_board.destroy)
    install_board(_board)
    _gate = RecycleGate(_board)
    _gate.target = server.num_workers
    path = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    if not server.master_pid:
        for stale in path.glob("*.db"):
            stale.unlink(missing_ok=True)
    server.log.info("metrics directory %s", path)

    def booted() -> None:
        _booted.value = 1
        server.log.info("every worker is ready; from now on a worker loads before accepting")

    roll_over(server, _board, booted, _gate)


def _log_to_gunicorn(server: Any) -> logging.Logger:
    """Send the ``serving`` loggers' records to Gunicorn's error log, at its level."""
    service_log = logging.getLogger("serving")
    service_log.handlers = list(server.log.error_log.handlers)
    service_log.setLevel(server.log.error_log.level)
    service_log.propagate = False
    return service_log


def when_ready(server: Any, settings: Settings) -> None:
    """Master, once, before the first fork: load the models the workers will share
    (``serving.server.sharing``), saying which and why in one line."""
    _log_to_gunicorn(server)  # the loader's own lines (read and checked, loaded as)
    sharing.load_in_master(settings, server.log.info, server.log.error)


def on_reload(server: Any, settings: Settings) -> None:
    """Master, on ``SIGHUP``, after re-reading the configuration and before forking the new
    workers: load the new artifacts to share (a failure keeps nothing shared: the new
    workers load for themselves, fail and retry, the old ones serve on)."""
    sharing.load_in_master(settings, server.log.info, server.log.error)


def pre_fork(server: Any, worker: Any) -> None:
    """Master: give the new worker the lowest CPU slot no live worker holds."""
    taken = {getattr(w, "serving_slot", None) for w in server.WORKERS.values()}
    worker.serving_slot = next(slot for slot in range(len(taken) + 1) if slot not in taken)


def cpus_for_slot(slot: int, cpus: list[int], per_worker: int, start: int = 0) -> set[int]:
    """The ``per_worker`` CPUs of worker ``slot``, round-robin over ``cpus`` from the
    ``start``-th (modulo): the master passes its pid, so two servers on one host do not
    both put their first worker on the first CPU.

    Why pin: a worker's request threads and batcher thread hand the GIL back and forth
    thousands of times a second; on one CPU a hand-off is a cheap switch, across CPUs each
    wake-up crosses cores and the waker spins for the GIL. Measured here (2 cores, demo
    model, 64 connections): pinned workers answer 1.46x the requests (bench/http_load.py).
    """
    first = start + slot * per_worker
    return {cpus[(first + i) % len(cpus)] for i in range(min(per_worker, len(cpus)))}


def _pin(server: Any, worker: Any, per_worker: int) -> None:
    """Pin this worker to its CPUs (``cpus_for_slot``), before any thread starts: threads
    inherit the affinity of the thread creating them."""
    cpus = sorted(os.sched_getaffinity(0))
    slot = getattr(worker, "serving_slot", 0)
    chosen = cpus_for_slot(slot, cpus, per_worker, start=server.pid)
    os.sched_setaffinity(0, chosen)
    server.log.info("worker %s pinned to CPU %s", worker.pid, ",".join(map(str, sorted(chosen))))


def post_fork(server: Any, worker: Any, settings: Settings) -> None:
    """Worker: pin its CPUs, load the model (or take the one the master loaded before fork:
    ``serving.server.sharing``) and start a watchdog that recycles the worker if its
    batcher gets stuck. The first workers load in the background while accepting (a
    load failure halts the server: exit status 3, one line saying why); a worker forked
    after every first one was ready loads before accepting and retries a failed load
    (``_load_before_accepting``). Each publishes its state on the board (``/healthz``)."""
    _stop_on_signal_until_serving(server)
    if settings.cpu_affinity == "auto" and hasattr(os, "sched_setaffinity"):
        _pin(server, worker, settings.blas_threads)
    forget_server_in_children(getattr(worker, "sockets", ()))  # a model that forks
    from serving.cache import ModelCache, install_cache
    from serving.observe import tracing
    from serving.observe.metrics import default_metrics

    tracing.setup()  # OpenTelemetry's exporter thread does not survive fork: one per worker

    service_log = _log_to_gunicorn(server)
    _start_access_log(settings, default_metrics().access_log_dropped)

    def on_failure(exc: BaseException) -> None:
        with _boot_failed.get_lock():
            first, _boot_failed.value = _boot_failed.value == 0, 1
        if first:
            server.log.error("worker %s: %s; stopping the server", worker.pid, exc)
            for handler in service_log.handlers:
                handler.flush()
            os._exit(WORKER_BOOT_ERROR)
        server.log.error("worker %s: %s", worker.pid, exc)
        os._exit(1)

    if settings.switch_interval_ms is not None:
        sys.setswitchinterval(settings.switch_interval_ms / 1000)

    def on_problem(reason: str) -> None:
        # Gunicorn's own --timeout does not cover a gthread worker whose request threads
        # hang: recycle it ourselves. SIGTERM is a graceful exit (waiting requests get their
        # 504 at SERVING_REQUEST_TIMEOUT_MS); the arbiter starts a fresh worker.
        server.log.error("worker %s: %s; recycling it", worker.pid, reason)
        os.kill(os.getpid(), signal.SIGTERM)

    pid = os.getpid()
    metrics = default_metrics()
    slot = getattr(worker, "serving_slot", 0)
    # Others serve once the first boot is over, or already during it when one is ready (a
    # recycle or respawn before the master noticed the boot was over): then load first.
    others_serve = (_booted is not None and _booted.value) or (
        _board is not None and _board.read().ready_count > 0
    )
    if others_serve:
        server.log.info("worker %s: loading before accepting (others are serving)", pid)
        cache = _load_before_accepting(server, worker, settings, slot)
        install_cache(cache)
        if _board is not None:
            _board.write(pid, "ready")
    else:
        cache = ModelCache(settings, metrics, slot, inherit=sharing.inherited)
        install_cache(cache)
        _load_while_accepting(cache, on_failure)
    _recycle_one_at_a_time(server, worker)
    cache.start_watchdog(on_problem)
    _guard_connections(server, worker, settings)


def _stop_on_signal_until_serving(server: Any) -> None:
    """Worker, first thing after fork: exit at once on SIGTERM, SIGINT or SIGQUIT until
    Gunicorn installs the worker's own handlers (after ``post_fork``). Until then the
    worker runs the master's handlers, which only queue the signal: a SIGTERM (the master
    shutting down or replacing it) was lost and the worker loaded and served on, or was
    SIGKILLed after the graceful timeout. It has accepted nothing yet, so it can go."""
    pid = os.getpid()

    def leave(signum: int, frame: Any) -> None:
        server.log.info("worker %s: stopping while loading (signal %s)", pid, signum)
        sys.exit(0)

    for stop in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
        signal.signal(stop, leave)


def _guard_connections(server: Any, worker: Any, settings: Settings) -> None:
    """Worker: time limits on a request's headers and body and graceful closes off the main
    loop (``slow_clients``), and each response's headers and body in one write
    (``one_write``)."""
    if hasattr(worker, "handle_request"):  # Gunicorn's gthread worker
        from serving.server import slow_clients

        slow_clients.limit_header_phase(worker, settings.header_timeout_s)
        slow_clients.limit_body_phase(
            worker, settings.request_timeout_ms / 1000, settings.header_timeout_s
        )
        slow_clients.close_gracefully_off_the_main_loop()
        from serving.server.arrivals import count_arrivals

        count_arrivals(worker, process_arrivals())
    from serving.server.one_write import join_headers_and_body

    if not join_headers_and_body():
        server.log.info("worker %s: this Gunicorn writes headers and body apart", os.getpid())


def _start_access_log(settings: Settings, dropped: Any) -> None:
    """Worker: start the access log's writer; its drops go to ``dropped`` (the
    ``access_log_dropped_total`` counter, by reason)."""
    access_log.configure(
        settings.access_log,
        settings.access_log_queue_lines,
        on_drop=lambda reason, count: dropped.labels(reason).inc(count),
    )


def _load_while_accepting(cache: Any, on_failure: Any) -> None:
    """Worker of the first boot: load in the background ("starting" on the board, then
    "ready"); ``on_failure`` halts the server."""
    pid = os.getpid()
    if _board is not None:
        _board.write(pid, "starting")
        cache.report_stages(functools.partial(_board.write, pid, "starting", None))

    def on_ready() -> None:
        if _board is not None:
            _board.write(pid, "ready")

    cache.start_loading(on_failure, on_ready)


def _load_before_accepting(server: Any, worker: Any, settings: Settings, slot: int) -> Any:
    """Worker, after the first boot: load every model before accepting a connection. A
    failed load is logged (model path and cause), counted in
    ``serving_model_load_failures_total``, shown in ``/healthz`` (``failed``) and retried
    after ``RETRY_FIRST_S`` doubling up to ``RETRY_MAX_S`` seconds; the server goes on with
    the other workers. Returns the loaded ``ModelCache``."""
    from serving.cache import ModelCache
    from serving.errors import ModelLoadError
    from serving.observe.metrics import default_metrics

    pid = os.getpid()
    metrics = default_metrics()
    delay_s = RETRY_FIRST_S

    while True:
        if _board is not None:
            _board.write(pid, "warming")
        done = threading.Event()
        failures: list[BaseException] = []
        try:
            cache = ModelCache(settings, metrics, slot, inherit=sharing.inherited)
        except ValueError as exc:  # SERVING_MODELS paths are checked when read: vanished
            reason = "; ".join(e["msg"] for e in getattr(exc, "errors", lambda: [])())
            failures.append(ModelLoadError(settings.resolved_model_path, reason or str(exc)))
            metrics.model_load_failed(settings.resolved_model_name, settings.model_version)
        else:
            if _board is not None:
                cache.report_stages(functools.partial(_board.write, pid, "warming", None))

            def failed(exc: BaseException, failures: list[BaseException] = failures) -> None:
                failures.append(exc)

            cache.start_loading(failed, done.set)
            while not done.is_set() and not failures:  # bounded: each model's load timeout
                worker.notify()  # the arbiter's --timeout counts from the fork: stay alive
                done.wait(0.5)
            if not failures:
                return cache
            for runtime in cache.runtimes:
                if runtime.error is not None or runtime.state == "loading":
                    metrics.model_load_failed(runtime.model_name, runtime.model_version)
                    break
        error = failures[0]
        server.log.error(
            "worker %s: %s; retrying in %g s (the other workers go on serving)",
            pid,
            error,
            delay_s,
        )
        if _board is not None:
            _board.write(pid, "failed", str(error))
        deadline = time.monotonic() + delay_s
        while time.monotonic() < deadline:
            worker.notify()
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        delay_s = min(delay_s * 2, RETRY_MAX_S)


def _recycle_one_at_a_time(server: Any, worker: Any) -> None:
    """Worker: replace Gunicorn's own ``max_requests`` exit (each worker on its own, so two
    can leave in the same second) by one through ``RecycleGate``: the worker leaves (a
    graceful ``SIGTERM`` to itself) only when no other worker is loading and the previous
    leaver's replacement serves; until then it goes on serving. Leaving, it wakes the
    master (``SIGCHLD``: look at the workers), which forks its replacement at once."""
    limit = worker.max_requests
    if _gate is None or limit >= sys.maxsize:
        return
    worker.max_requests = sys.maxsize
    gate, pid = _gate, os.getpid()

    def watch() -> None:
        while worker.nr < limit or not gate.try_leave(pid):
            time.sleep(0.05)
        server.log.info(
            "worker %s: recycling after %s requests (SERVING_MAX_REQUESTS, one worker at a time)",
            pid,
            worker.nr,
        )
        os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(OSError):
            os.kill(os.getppid(), signal.SIGCHLD)

    threading.Thread(target=watch, name="serving-recycle", daemon=True).start()


def post_worker_init(worker: Any) -> None:
    """Worker, once Gunicorn has loaded the app (``wsgi.py``) and before it accepts: say
    so. Its model may have been ready before (the first boot loads while accepting): an
    app that cannot load (a settings check failing) ends the worker only here."""
    worker.log.info("worker %s: application loaded, accepting connections", os.getpid())


def worker_exit(server: Any, worker: Any, settings: Settings) -> None:
    """Worker (after its last connection closed): stop the batcher, answering what is
    queued, then the processes its model forked (``serving.server.children``)."""
    from serving.cache import installed_cache

    if getattr(worker, "pid", None) != os.getpid():
        return  # the master calls this hook too, for a worker that is already gone
    cache = installed_cache()
    if cache is not None:
        cache.stop(timeout_s=settings.drain_timeout_s)
    stop_children(log=lambda line: server.log.info("worker %s: %s", worker.pid, line))
    server.log.info("worker %s: exiting after %s requests", worker.pid, worker.nr)
    access_log.stop()  # after the drain: its answers are logged too (waits 2 s at most)


def child_exit(server: Any, worker: Any) -> None:
    """Master: drop the dead worker's live gauges (``livesum``) from the metrics, fold its
    counters and histograms into the archive (``serving.server.metrics_archive``) and drop its
    state file from the board."""
    from prometheus_client import multiprocess

    from serving.server.metrics_archive import archive_dead_worker

    multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]
    try:
        archive_dead_worker(
            Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]), worker.pid, str(os.getpid())
        )
    except OSError as exc:
        server.log.warning("worker %s: metrics not archived: %s", worker.pid, exc)
    if _board is not None:
        _board.remove(worker.pid)


def on_exit(server: Any) -> None:
    """Master, when it exits: remove the board, and the metrics directory if this server
    created it (no ``SERVING_METRICS_DIR``) and no other generation (``SIGUSR2``) uses it
    (``serving.server.metrics_dir``; also done when the master exits without this hook,
    as when it cannot bind)."""
    run_at_exit()
