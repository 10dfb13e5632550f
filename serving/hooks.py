"""What ``gunicorn.conf.py``'s hooks do, kept here so the config file stays settings only.

Runs in two roles: ``settings_or_exit``, ``prepare_metrics_dir``, ``on_starting`` and
``child_exit`` in the master; ``post_fork`` and ``worker_exit`` in each worker. Nothing
here imports prometheus-client or the Flask app at module level: the master must set
``PROMETHEUS_MULTIPROC_DIR`` before prometheus-client is first imported.

Why the model is loaded after fork, not preloaded in the master: ONNX Runtime and
OpenMP/BLAS create thread pools when a model is loaded or first run, and threads do not
survive ``fork()`` (a forked pool can deadlock on a lock held by a thread that no longer
exists). Each worker loads its own copy, pins its own pools, and warms up.
"""

from __future__ import annotations

import logging
import logging.handlers
import multiprocessing
import os
import queue
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from serving.auth import load_api_keys
from serving.errors import SettingsError
from serving.settings import Settings, load_settings, unknown_variables

__all__ = [
    "child_exit",
    "configure_access_log",
    "cpus_for_slot",
    "on_starting",
    "post_fork",
    "pre_fork",
    "prepare_metrics_dir",
    "settings_or_exit",
    "stop_access_log",
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
# Set once any worker has its model ready. A worker forked after that (a respawn, a
# max_requests recycle, a HUP reload) loads before it accepts a connection, so it never
# answers 503 for traffic the ready workers could serve. The first workers load while
# answering /livez 200 and /healthz 503: nobody can serve yet, and probes learn it.
_some_worker_ready: Any = None


def settings_or_exit() -> Settings:
    """``load_settings()``, or one line on stderr naming the bad variable and exit status 2."""
    try:
        settings = load_settings()
        load_api_keys(settings)  # an unreadable keys file stops start-up here, not per worker
    except SettingsError as exc:
        print(f"serving: invalid setting {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    for name in unknown_variables(os.environ):
        print(f"serving: warning: {name} is not a setting (ignored); see README", file=sys.stderr)
    return settings


def prepare_metrics_dir(settings: Settings) -> Path:
    """Choose the prometheus-client multiprocess directory and export it to the workers.

    ``SERVING_METRICS_DIR``, else an already exported ``PROMETHEUS_MULTIPROC_DIR``, else a
    new temporary directory. Idempotent: Gunicorn re-reads the config on HUP.
    """
    if settings.metrics_dir is not None:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(settings.metrics_dir)
    elif "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="serving-metrics-")
    path = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(
            f"serving: invalid setting SERVING_METRICS_DIR: {path}: {exc.strerror}", file=sys.stderr
        )
        raise SystemExit(2) from None
    return path


def on_starting(server: Any) -> None:
    """Master, once: remove prometheus-client's ``*.db`` files so counters start at zero.
    Only those: the directory may be shared or hold other files."""
    global _boot_failed, _some_worker_ready
    _boot_failed = multiprocessing.Value("b", 0)  # shared with the workers forked later
    _some_worker_ready = multiprocessing.Value("b", 0)
    path = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    for stale in path.glob("*.db"):
        stale.unlink(missing_ok=True)
    server.log.info("metrics directory %s", path)


class _RecordQueueHandler(logging.handlers.QueueHandler):
    """A ``QueueHandler`` that queues the record as it is: the standard one formats the
    message and copies the record on the calling thread (``prepare``), which is the cost
    this handler exists to move off the request thread. Access records carry only plain
    values (``extra``), nothing that changes after the call."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record


_access_listener: logging.handlers.QueueListener | None = None


def configure_access_log(settings: Settings) -> None:
    """One JSON object per line on stdout for ``serving.access`` (python-json-logger):
    time, request id, route template, status, latency, instances, batch size, model.

    The request thread only builds the record and puts it on a queue; a
    ``QueueListener`` thread of this process formats and writes it (standard library
    ``logging.handlers``). Call it after fork, in each worker: a thread does not survive
    ``fork()``. Calling it again replaces the listener; :func:`stop_access_log` writes
    what is queued and stops it.
    """
    global _access_listener
    from pythonjsonlogger.orjson import OrjsonFormatter

    stop_access_log()
    access = logging.getLogger("serving.access")
    writer = logging.StreamHandler(sys.stdout)
    writer.setFormatter(
        OrjsonFormatter(
            "{asctime}{levelname}{message}",
            style="{",
            rename_fields={"asctime": "time", "levelname": "level"},
        )
    )
    access.setLevel(logging.INFO if settings.access_log else logging.WARNING)
    access.propagate = False
    if not settings.access_log:
        access.handlers = [writer]  # warnings only: rare, written in place
        return
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    access.handlers = [_RecordQueueHandler(records)]
    _access_listener = logging.handlers.QueueListener(records, writer)
    _access_listener.start()


def stop_access_log() -> None:
    """Write the access lines still queued and stop the listener thread (idempotent)."""
    global _access_listener
    if _access_listener is not None:
        _access_listener.stop()
        _access_listener = None


def pre_fork(server: Any, worker: Any) -> None:
    """Master: give the new worker the lowest CPU slot no live worker holds."""
    taken = {getattr(w, "serving_slot", None) for w in server.WORKERS.values()}
    worker.serving_slot = next(slot for slot in range(len(taken) + 1) if slot not in taken)


def cpus_for_slot(slot: int, cpus: list[int], per_worker: int) -> set[int]:
    """The ``per_worker`` CPUs of worker ``slot``, round-robin over ``cpus``.

    Why pin: a worker's request threads and batcher thread hand the GIL back and forth
    thousands of times a second; on one CPU a hand-off is a cheap switch, across CPUs each
    wake-up crosses cores and the waker spins for the GIL. Measured here (2 cores, demo
    model, 64 connections): pinned workers answer 1.46x the requests (bench/http_load.py).
    """
    return {cpus[(slot * per_worker + i) % len(cpus)] for i in range(min(per_worker, len(cpus)))}


def post_fork(server: Any, worker: Any, settings: Settings) -> None:
    """Worker: pin its CPUs, load the model (in the background for the first workers, before
    accepting for later ones; a load failure halts the server) and start a watchdog that
    recycles the worker if its batcher gets stuck."""
    if settings.cpu_affinity == "auto" and hasattr(os, "sched_setaffinity"):
        # Before any thread starts: threads inherit the affinity of the thread creating them.
        cpus = sorted(os.sched_getaffinity(0))
        chosen = cpus_for_slot(getattr(worker, "serving_slot", 0), cpus, settings.blas_threads)
        os.sched_setaffinity(0, chosen)
        server.log.info(
            "worker %s pinned to CPU %s", worker.pid, ",".join(map(str, sorted(chosen)))
        )
    from serving.cache import ModelCache, install_cache
    from serving.metrics import default_metrics

    service_log = logging.getLogger("serving")
    service_log.handlers = list(server.log.error_log.handlers)
    service_log.setLevel(server.log.error_log.level)
    service_log.propagate = False
    configure_access_log(settings)

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

    def on_ready() -> None:
        if _some_worker_ready is not None:
            _some_worker_ready.value = 1

    cache = ModelCache(settings, default_metrics(), getattr(worker, "serving_slot", 0))
    install_cache(cache)
    loading = cache.start_loading(on_failure, on_ready)
    if _some_worker_ready is not None and _some_worker_ready.value:
        server.log.info("worker %s: loading before accepting (others are serving)", worker.pid)
        while loading.is_alive():  # bounded: the load timeout ends the process
            worker.notify()  # the arbiter's --timeout counts from the fork: stay alive
            loading.join(1.0)
    cache.start_watchdog(on_problem)


def worker_exit(server: Any, worker: Any, settings: Settings) -> None:
    """Worker (after its last connection closed): stop the batcher, answering what is queued."""
    from serving.cache import installed_cache

    cache = installed_cache()
    if cache is not None:  # None in the master, which also calls this hook
        cache.stop(timeout_s=settings.drain_timeout_s)
    stop_access_log()  # after the drain: its answers are logged too


def child_exit(server: Any, worker: Any) -> None:
    """Master: drop the dead worker's live gauges (``livesum``) from the metrics."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]
