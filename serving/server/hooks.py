"""What ``gunicorn.conf.py``'s hooks do, kept here so the config file stays settings only.

Runs in two roles: ``settings_or_exit``, ``prepare_metrics_dir``, ``on_starting``,
``when_ready``, ``on_reload``, ``pre_fork``, ``child_exit`` and ``on_exit`` in the master;
``post_fork``, ``post_worker_init`` and ``worker_exit`` in each worker. Each hook is a few
named steps calling into this folder: how a worker gets its model (``worker_boot``), the
workers' states (``board``), how the master rolls them over (``rollover``) and recycles
them one at a time (``recycling``), CPU pinning (``pinning``), the metrics directory
(``metrics_dir``; ``prepare_metrics_dir`` re-exported for the config file). Nothing here
imports prometheus-client or the Flask app at module level: the master must set
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

import logging
import os
import signal
import struct
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gunicorn import systemd  # type: ignore[import-untyped]

from serving.auth import load_api_keys
from serving.batching.arrivals import process_arrivals
from serving.errors import SettingsError
from serving.model_settings import ModelSpec, serving_on
from serving.observe import access_log, tracing, tracing_guards
from serving.observe.payload_sinks import check_sink
from serving.server import applied, control, in_place, repository, sharing, worker_change
from serving.server.children import forget_server_in_children, stop_children
from serving.server.metrics_dir import prepare_metrics_dir, run_at_exit, set_master
from serving.server.pinning import Always, pin_while_quiet
from serving.server.recycling import recycle_one_at_a_time
from serving.server.respawn import Backoff
from serving.server.rollover import roll_over
from serving.server.startup import address_taken, unknown_variables
from serving.server.unloads import Unloads, versions
from serving.server.worker import ConnectionLimits, ServingWorker
from serving.server.worker_boot import (
    Boot,
    halt_on_failure,
    load_before_accepting,
    load_while_accepting,
    stop_on_signal_until_serving,
)
from serving.settings import Settings, load_settings

__all__ = [
    "checked_settings",
    "child_exit",
    "on_exit",
    "on_reload",
    "on_starting",
    "post_fork",
    "post_worker_init",
    "pre_exec",
    "pre_fork",
    "prepare_metrics_dir",
    "reload_problem",
    "running_settings",
    "settings_or_exit",
    "when_ready",
    "worker_exit",
]

# Made by the master in on_starting, before the first fork; every worker inherits it.
_boot: Boot | None = None
# The settings this master runs with, once read (a reload that finds them invalid keeps
# these).
_settings: Settings | None = None
# The master's record of repository versions its workers could not load (poll, none).
_quarantine: repository.Quarantine | None = None
# The master's pause in forking after workers died while loading (serving.server.respawn).
_respawn = Backoff()
# The versions the master's workers serve, and the count of those reloads left out.
_unloads: Unloads | None = None
# Reloads (SIGHUP) the master has done; a worker's copy, taken at its fork, is its
# generation (on the board: /healthz shows a fleet serving two at once).
_generation = 0
# The generation of the last rollover (start, or a reload that forked new workers).
_rolled_at = 0
# What the master read of each model version its workers serve (serving.server.in_place).
_identities: dict[str, tuple[int, ...] | None] = {}
# Load and unload calls made (explicit control) as of the last reload: each new one is
# a reload asked for (serving.server.in_place.asks), which may be taken in place; and
# whether the reload going on is one the server asked for (taken at its check, refused
# or not: every reload is one SIGHUP).
_calls = 0
_asked = False
# The settings the check of the reload going on read (a change in place takes them rather
# than read the repository again), or None when it refused the reload.
_checked: Settings | None = None


def checked_settings() -> Settings:
    """``load_settings()``, with what the workers would otherwise find each on its own: an
    API keys file that cannot be read, a payload log file sink that cannot be written,
    an ``OTEL_*`` value the SDK refuses.

    :raises SettingsError: naming the variable.
    """
    kept = _kept()
    with serving_on(kept):
        settings = _selected(load_settings(), kept)
    load_api_keys(settings)  # an unreadable keys file stops start-up here, not per worker
    check_sink(settings)  # so does a payload log file that cannot be written
    if tracing.enabled() and (problem := tracing_guards.environment_problem()):
        raise SettingsError(*problem)  # the SDK's OTEL_* (it crashed each worker)
    return settings


def _selected(settings: Settings, kept: dict[str, list[ModelSpec]]) -> Settings:
    """``settings`` serving, of a model repository, what the load and unload calls left
    (explicit control) and none of the versions its workers could not load (the
    quarantine): both known to the master after its first fork only. Read again, a model
    whose ``config.json`` cannot be taken serves on what ``kept`` says.

    :raises SettingsError: when that leaves nothing to serve.
    """
    if settings.model_repository is None or _boot is None:
        return settings
    wanted = control.wanted(_boot.board) if settings.controls_explicitly() else None
    excluded = _quarantine.excluded() if _quarantine is not None else {}
    if wanted is None and not excluded:
        return settings
    try:
        return settings.selecting(wanted.models if wanted else None, excluded, kept)
    except ValueError as exc:
        problem = str(exc).removeprefix("SERVING_MODEL_REPOSITORY: ")
        raise SettingsError("SERVING_MODEL_REPOSITORY", problem) from None


def _kept() -> dict[str, list[ModelSpec]]:
    """The repository versions the master serves now (``_settings``) whose files are still
    the ones loaded, by model: what a model whose ``config.json`` goes bad serves on. A
    version republished with other files meanwhile is not among them (its config.json
    would have to be read to take it)."""
    if _settings is None or _settings.model_repository is None:
        return {}
    try:
        models = sharing.models_of(_settings)
    except ValueError:  # an artifact gone since: none kept
        return {}
    now = in_place.identities(models)
    kept: dict[str, list[ModelSpec]] = {}
    for spec, model in zip(_settings.entries() or [], models, strict=False):
        key = in_place.loaded_as(model)
        if now[key] is not None and now[key] == _identities.get(key):
            kept.setdefault(spec.name, []).append(spec)
    return kept


def settings_or_exit() -> Settings:
    """``checked_settings()``, or one line on stderr naming the bad variable and exit
    status 2. On a reload (Gunicorn re-reads gunicorn.conf.py at ``SIGHUP``) a setting
    that became invalid since ``reload_problem()`` looked does not stop the running
    server: the line, then the settings it runs with."""
    global _settings
    try:
        settings = checked_settings()
    except SettingsError as exc:
        print(f"serving: invalid setting {exc}", file=sys.stderr)
        if _settings is not None:
            return _settings
        raise SystemExit(2) from None
    if _settings is None:
        for name in unknown_variables(os.environ):
            print(
                f"serving: warning: {name} is not a setting (ignored); see README", file=sys.stderr
            )
    _settings = settings
    return settings


def running_settings() -> Settings | None:
    """The settings this server's master checked last (a worker has its copy, from its
    fork), or None before: the app of a worker takes these rather than read the
    environment and its files again, which may have changed since (a worker forked after
    a model file was removed exited on it, and its replacement too, at each respawn)."""
    return _settings


def reload_problem() -> str | None:
    """Master, on ``SIGHUP`` before anything is re-read: the invalid setting that a reload
    would stop on (``"SERVING_MODEL_PATH: ..."``: a model file removed before its copy, a
    half-written ``SERVING_MODELS`` file), or None. The rollover then refuses the reload
    and the running workers serve on (``serving.server.rollover``)."""
    global _calls, _asked, _checked
    changes = control.changes(_boot.board) if _boot is not None else 0  # read before
    repository.reading()  # the poller compares with what this reload reads
    in_place.asks.add(max(0, changes - _calls))
    _calls, _asked, _checked = max(changes, _calls), in_place.asks.take(), None
    try:
        _checked = checked_settings()
    except SettingsError as exc:
        problem: str | None = f"invalid setting {exc}"
    else:
        problem = None
    if _boot is not None:  # for a load or unload call waiting on its outcome
        applied.note_applied(_boot.board, changes, _generation + 1, problem)
    return problem


def on_starting(server: Any) -> None:
    """Master, once: remove prometheus-client's ``*.db`` files so counters start at zero
    (only those: the directory may be shared or hold other files; and not after a
    ``SIGUSR2`` re-exec, whose old generation still writes there), create what the workers
    share (``worker_boot.Boot``: the board, the recycle gate) and make the arbiter roll
    workers over one by one (``serving.server.rollover``)."""
    global _boot
    if not issubclass(server.worker_class, ServingWorker):
        server.log.error(
            "serving: worker_class must be serving.server.worker.ServingWorker or a subclass "
            "(got %s): its connection limits, drain and counts live there",
            server.cfg.worker_class_str,
        )  # fmt: skip
        raise SystemExit(1)
    if problem := address_taken(server):
        print(f"serving: cannot listen on {problem}", file=sys.stderr)
        raise SystemExit(2)
    # Gunicorn's own -e / raw_env / GUNICORN_CMD_ARGS are in os.environ only now
    if tracing.enabled() and (otel := tracing_guards.environment_problem()):
        print(f"serving: invalid setting {otel[0]}: {otel[1]}", file=sys.stderr)
        raise SystemExit(2)
    set_master(server)
    try:
        _boot = boot = Boot.create(server.num_workers)
    except OSError as exc:  # /dev/shm full or not writable: a traceback, and no word of it
        print(
            "serving: cannot create what the workers share (locks and flags in /dev/shm, "
            f"a board in {tempfile.gettempdir()}): {exc}",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    path = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    if not server.master_pid:
        for stale in path.glob("*.db"):
            stale.unlink(missing_ok=True)
    server.log.info("metrics directory %s", path)

    def booted() -> None:
        boot.booted.value = 1
        server.log.info("every worker is ready; from now on a worker loads before accepting")

    # Another server may listen on the sockets: systemd's or an inherited fd://, or the
    # other generation of a SIGUSR2 upgrade (this master's, or one it starts: pre_exec).
    inherited = any(str(address).startswith("fd://") for address in server.cfg.bind)
    # (Gunicorn sets server.systemd only after on_starting: ask as it will)
    activated = systemd.listen_fds(False)
    boot.shared.value = int(bool(server.master_pid or activated or inherited))

    def stopping() -> None:
        if not server.reexec_pid and not boot.shared.value:
            boot.stopping.value = 1

    roll_over(
        server, boot.board, booted, gate=boot.gate, on_stop=stopping, check=reload_problem,
        hold=_respawn, in_place=lambda: change_in_place(server),
    )  # fmt: skip


def _log_to_gunicorn(server: Any) -> logging.Logger:
    """Send the ``serving`` loggers' records to Gunicorn's error log, at its level."""
    service_log = logging.getLogger("serving")
    service_log.handlers = list(server.log.error_log.handlers)
    service_log.setLevel(server.log.error_log.level)
    service_log.propagate = False
    return service_log


def when_ready(server: Any, settings: Settings) -> None:
    """Master, once, before the first fork: load the models the workers will share
    (``serving.server.sharing``), saying which and why in one line. A load past
    ``SERVING_LOAD_TIMEOUT_S`` stops the start (exit status 3) with a line naming the
    model."""
    global _quarantine, _unloads
    _log_to_gunicorn(server)  # the loader's own lines (read and checked, loaded as)
    _import_what_workers_import()
    if _boot is not None:
        _unloads = Unloads(_boot.board)
        _unloads.note(_generation, versions(settings))
        _unloads.start(lambda: _generation, server.log.warning)
    repository.say_refused(server.log.warning, settings)
    _quarantine = repository.follow(
        server.log, settings, _boot.board if _boot is not None else None,
        lambda: _generation, running_settings,
    )  # fmt: skip
    if settings.controls_explicitly() and _boot is not None:
        control.begin(_boot.board, settings.entries() or [])
        server.log.info(
            "model repository: %s under explicit control: only load and unload calls "
            "change what is served", settings.model_repository,
        )  # fmt: skip
    _identities.update(in_place.identities(sharing.models_of(settings)))
    if sharing.load_in_master(settings, server.log.info, server.log.error) == "timed_out":
        print(
            f"serving: the master's load of model {settings.model_settings()[0].name!r} took "
            f"longer than SERVING_LOAD_TIMEOUT_S={settings.load_timeout_s:g} s; not starting",
            file=sys.stderr,
        )
        raise SystemExit(3)


def _import_what_workers_import() -> None:
    """Master, once, before the first fork (``PROMETHEUS_MULTIPROC_DIR`` set since
    ``on_starting``): import the modules every worker imports to serve (the app's, Flask,
    werkzeug, prometheus-client: 189 modules), so each fork inherits them, and shares
    their pages, instead of importing them again: 0.2 s of CPU per worker at each fork,
    and a rollover forks every worker while the old ones serve. Modules only: no app is
    created, no thread started, no metric written (``preload_app`` stays off)."""
    import serving.app
    import serving.cache
    import serving.protocols.dispatch  # noqa: F401


def pre_exec(server: Any) -> None:
    """The new master of a ``SIGUSR2`` upgrade, before it execs: from now on this
    generation's workers share the listening sockets with the next one (an orphaned worker
    then leaves them unfiltered)."""
    if _boot is not None:
        _boot.shared.value = 1


def on_reload(server: Any, settings: Settings) -> None:
    """Master, on ``SIGHUP``, after re-reading the configuration and before forking the new
    workers: load the new artifacts to share, each first in a separate process (a load
    that would crash the master is left out; a failure keeps nothing shared: the new
    workers load for themselves, fail and retry, the old ones serve on) and note what it
    serves (``serving.server.unloads``). The workers forked from now on are the next
    generation."""
    global _generation, _identities, _rolled_at
    _generation += 1
    _rolled_at = _generation
    _note_change(server, settings)
    _identities = in_place.identities(sharing.models_of(settings))
    sharing.load_in_master(
        settings, server.log.info, server.log.error, trial=True,
        meanwhile=server.reap_workers,  # a worker dying meanwhile is reaped (Gunicorn 27)
    )  # fmt: skip


def _note_change(server: Any, settings: Settings) -> None:
    """Master, at each reload (rolled or in place): say what the repository refuses, and
    note what the new generation serves (``serving_model_unloads_total``) and the files
    of the versions it loads (the quarantine)."""
    repository.say_refused(server.log.warning, settings)
    if _unloads is not None:
        _unloads.note(_generation, versions(settings))
    if _quarantine is not None:
        _quarantine.loading(repository.served_keys(settings))  # its files as read now


def change_in_place(server: Any) -> bool:
    """Master, at a reload the checks passed (``serving.server.rollover``): when the
    master or a load or unload call asked for it and the running workers can take it in
    place (``serving.server.in_place``), publish the plan they follow and return True:
    no worker is forked. Else False: the workers roll over."""
    global _generation, _settings, _identities
    asked, settings, new = _asked, _settings, _checked
    if not asked or settings is None or new is None or _boot is None:
        return False
    try:
        why = in_place.why_unsettled(_boot.board.read(), server.WORKERS, _rolled_at)
        why = why or in_place.why_rolled(
            settings, new, sharing.models_of(settings), sharing.models_of(new), _identities
        )  # fmt: skip
    except ValueError as exc:  # a file gone since the check: rolled
        why = str(exc)
    if why is None:
        why, stopping = in_place.tried(
            settings, new, _identities, server.reap_workers, server.log.info
        )
        if stopping:
            return True  # nothing forked, nothing changed: the master stops next
    if why is None:
        try:
            in_place.publish(
                _boot.board, in_place.Plan(_generation + 1, new, sharing.models_of(new))
            )
        except OSError as exc:  # the board's disk full: a rollover needs none of it
            why = f"the plan could not be written: {exc}"
    if why is not None:
        server.log.info("model repository: the change rolls the workers over (%s)", why)
        return False
    _settings, _generation = new, _generation + 1
    _note_change(server, new)
    _identities = in_place.identities(sharing.models_of(new))
    server.log.info(
        "model repository: generation %s taken in place by the running workers (only "
        "models loaded in each worker changed)", _generation,
    )  # fmt: skip
    return True


def pre_fork(server: Any, worker: Any) -> None:
    """Master: give the new worker the lowest CPU slot no live worker holds."""
    taken = {getattr(w, "serving_slot", None) for w in server.WORKERS.values()}
    worker.serving_slot = next(slot for slot in range(len(taken) + 1) if slot not in taken)


def post_fork(server: Any, worker: Any, settings: Settings) -> None:
    """Worker: prepare the process (CPUs, tracing, logs), get the model (loaded here, or
    the one the master loaded before fork: ``serving.server.sharing``), then start the
    one-at-a-time recycling, a watchdog that recycles the worker if its batcher gets
    stuck, and the limits on its connections. How the model is loaded, and what a failure
    does, depends on whether others serve already (``serving.server.worker_boot``). Each
    worker publishes its state, and its generation, on the board (``/healthz``).
    ``settings`` are gunicorn.conf.py's, read at start or at the last rollover; the
    master's since a change in place are newer, and taken instead."""
    settings = _settings or settings
    stop_on_signal_until_serving(server)
    if _boot is not None:
        _boot.board.generation = _generation  # this process's copy: the one at its fork
    service_log = _prepare_worker(server, worker, settings)
    cache = _get_model(server, worker, settings, service_log)
    recycle_one_at_a_time(server, worker, _boot.gate if _boot is not None else None)
    cache.start_watchdog(_recycle_on_problem(server, worker))
    if _boot is not None and settings.model_repository is not None:
        board, slot = _boot.board, getattr(worker, "serving_slot", 0)
        worker_change.follow(board, lambda plan: worker_change.apply(
            plan, board, slot=slot, on_problem=_recycle_on_problem(server, worker),
            log=server.log,
        ), server.log.error)  # fmt: skip
    _guard_connections(worker, settings)


def _prepare_worker(server: Any, worker: Any, settings: Settings) -> logging.Logger:
    """Worker, before its first thread: pin its CPUs, keep the listening sockets out of
    processes its model forks, start tracing and the access log, route the ``serving``
    loggers to Gunicorn's and set the GIL switch interval. Returns the ``serving`` logger."""
    if settings.cpu_affinity != "none" and hasattr(os, "sched_setaffinity"):
        gate = Always() if settings.cpu_affinity == "auto" else None  # adaptive: QuietGate
        pin_while_quiet(server, worker, settings.blas_threads, gate)
    forget_server_in_children(getattr(worker, "sockets", ()))  # a model that forks
    from serving.observe.metrics import default_metrics

    tracing.setup()  # OpenTelemetry's exporter thread does not survive fork: one per worker
    service_log = _log_to_gunicorn(server)
    _start_access_log(settings, default_metrics().access_log_dropped)
    if settings.switch_interval_ms is not None:
        sys.setswitchinterval(settings.switch_interval_ms / 1000)
    return service_log


def _get_model(server: Any, worker: Any, settings: Settings, service_log: Any) -> Any:
    """Worker: install this process's ``ModelCache``, loaded before accepting when others
    serve already (unless none serves when a load fails: then it accepts, answering 503,
    and retries in the background), else loading in the background (a failure halts the
    server). Returns the cache."""
    from serving.cache import ModelCache, install_cache
    from serving.observe.metrics import default_metrics

    pid, slot = os.getpid(), getattr(worker, "serving_slot", 0)
    board = _boot.board if _boot is not None else None
    if _boot is not None and _boot.others_serve():
        server.log.info("worker %s: loading before accepting (others are serving)", pid)
        cache, retry = load_before_accepting(server, worker, settings, slot, board)
        install_cache(cache)
        if retry is not None:  # nobody serves: accept meanwhile, answering 503

            def loaded(new: Any) -> None:
                install_cache(new)
                new.start_watchdog(_recycle_on_problem(server, worker))

            retry(loaded)
        elif board is not None:
            board.write(pid, "ready")
        return cache
    models = sharing.models_of(settings)
    cache = ModelCache.of(
        models, default_metrics(), slot, sharing.inherited, settings.refused_models()
    )
    install_cache(cache)
    load_while_accepting(cache, board, halt_on_failure(server, worker, _boot, service_log))
    return cache


def _recycle_on_problem(server: Any, worker: Any) -> Callable[[str], None]:
    """The watchdog's ``on_problem``: Gunicorn's own --timeout does not cover a gthread
    worker whose request threads hang, so recycle it ourselves. SIGTERM is a graceful exit
    (waiting requests get their 504 at SERVING_REQUEST_TIMEOUT_MS); the arbiter starts a
    fresh worker."""

    def on_problem(reason: str) -> None:
        server.log.error("worker %s: %s; recycling it", worker.pid, reason)
        os.kill(os.getpid(), signal.SIGTERM)

    return on_problem


def _guard_connections(worker: Any, settings: Settings) -> None:
    """Worker: the limits our worker class puts on its connections (headers, bodies,
    clients not reading: ``serving.server.worker``) and the count of its requests on their
    way to a batcher."""
    worker.guard(
        ConnectionLimits(
            header_timeout_s=settings.header_timeout_s,
            body_timeout_s=settings.request_timeout_ms / 1000,
            body_buffer_bytes=settings.max_body_bytes,
        ),
        process_arrivals(),
        server_stopping=lambda: _boot is not None and bool(_boot.stopping.value),
        socket_shared=lambda: _boot is None or bool(_boot.shared.value),
    )


def _start_access_log(settings: Settings, dropped: Any) -> None:
    """Worker: start the access log's writer; its drops go to ``dropped`` (the
    ``access_log_dropped_total`` counter, by reason)."""
    access_log.configure(
        settings.access_log,
        settings.access_log_queue_lines,
        on_drop=lambda reason, count: dropped.labels(reason).inc(count),
    )


def post_worker_init(worker: Any) -> None:
    """Worker, once Gunicorn has loaded the app (``wsgi.py``) and before it accepts: say
    so. Its model may have been ready before (the first boot loads while accepting): an
    app that cannot load (a settings check failing) ends the worker only here."""
    from serving.cache import installed_cache

    cache = installed_cache()
    loading = cache is not None and cache.state == "loading"
    worker.log.info(
        "worker %s: application loaded, accepting connections%s", os.getpid(),
        " (its models still load: /healthz and predictions answer 503 until they serve)"
        if loading else "",
    )  # fmt: skip


def worker_exit(server: Any, worker: Any, settings: Settings) -> None:
    """Worker (after its last connection closed): stop the batcher, answering what is
    queued, then the processes its model forked (``serving.server.children``)."""
    from serving.cache import installed_cache

    if getattr(worker, "pid", None) != os.getpid():
        return  # the master calls this hook too, for a worker that is already gone
    if _boot is not None:
        worker_change.leave(_boot.board)  # a change it loads: the next worker takes it
    cache = installed_cache()
    if cache is not None:
        cache.stop(timeout_s=settings.drain_timeout_s)
    stop_children(log=lambda line: server.log.info("worker %s: %s", worker.pid, line))
    server.log.info("worker %s: exiting after %s requests", worker.pid, worker.nr)
    access_log.stop()  # after the drain: its answers are logged too (waits 2 s at most)


def child_exit(server: Any, worker: Any) -> None:
    """Master: drop the dead worker's live gauges (``livesum``) from the metrics, fold its
    counters and histograms into the archive (``serving.server.metrics_archive``), tell the
    quarantine and the board of a model version it died loading (a crash in native code
    leaves no error behind), pause forking for it, and drop its state file from the
    board."""
    from prometheus_client import multiprocess

    from serving.server.metrics_archive import archive_dead_worker

    multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]
    try:
        archive_dead_worker(
            Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]), worker.pid, str(os.getpid())
        )
    except (OSError, struct.error) as exc:  # a file cut short (killed creating it): left
        server.log.warning("worker %s: metrics not archived: %s", worker.pid, exc)
    if _boot is not None:
        loading = _boot.board.loading(worker.pid)
        if loading is not None:  # died loading it (a crash): no error left behind
            _died_loading(server, worker.pid, loading)
        _boot.board.remove(worker.pid)


def _died_loading(server: Any, pid: int, loading: tuple[str, str]) -> None:
    """Master: worker ``pid`` died while it loaded model version ``loading``: noted on the
    board (a load call waiting on it answers with why), for the quarantine, and no worker
    is forked for a while (``serving.server.respawn``)."""
    assert _boot is not None
    _boot.board.note_death(pid, loading)
    if _quarantine is not None:
        _quarantine.died(pid, loading, _generation)
    pause = _respawn.died_loading()
    server.log.warning(
        "worker %s died while loading %s/%s; no worker is forked for %g s (doubling while "
        "workers die loading)", pid, loading[0], loading[1], pause,
    )  # fmt: skip


def on_exit(server: Any) -> None:
    """Master, when it exits: remove the board, and the metrics directory if this server
    created it (no ``SERVING_METRICS_DIR``) and no other generation (``SIGUSR2``) uses it
    (``serving.server.metrics_dir``; also done when the master exits without this hook,
    as when it cannot bind)."""
    run_at_exit()
