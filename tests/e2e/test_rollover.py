"""Reload and recycling without a capacity gap, and metrics that survive any number of
recycles, under real Gunicorn on a busy machine (``cpu_hog``)."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.e2e.server import GunicornServer
from tests.models import RowOffset, UnevenLoading
from tests.waiting import until

Start = Callable[..., GunicornServer]
Pickled = Callable[[Any, str], Path]

pytestmark = pytest.mark.usefixtures("cpu_hog")

#: The request deadline of these servers (SERVING_REQUEST_TIMEOUT_MS), in seconds.
DEADLINE_S = 10.0


def timed_traffic(
    server: GunicornServer, stop: threading.Event, n_threads: int, limit_s: float = 90.0
) -> list[tuple[Any, float]]:
    """Single-instance predicts from ``n_threads`` keep-alive sessions until ``stop`` (or
    ``limit_s``): each outcome (status, or the exception) with its latency in seconds."""
    deadline = time.monotonic() + limit_s

    def loop(caller: int) -> list[tuple[Any, float]]:
        session = requests.Session()
        outcomes: list[tuple[Any, float]] = []
        while not stop.is_set() and time.monotonic() < deadline:
            started = time.perf_counter()
            try:
                response = session.post(
                    f"{server.url}/predict",
                    json={"instances": [[float(caller)]]},
                    timeout=DEADLINE_S + 5,
                )
                outcome: Any = response.status_code
            except requests.RequestException as exc:
                outcome = exc
            outcomes.append((outcome, time.perf_counter() - started))
        return outcomes

    with ThreadPoolExecutor(n_threads) as pool:
        futures = [pool.submit(loop, c) for c in range(n_threads)]
        return [outcome for future in futures for outcome in future.result(limit_s + 30)]


def test_hup_with_a_slow_load_rolls_workers_over_without_a_gap(
    gunicorn: Start, pickled: Pickled, tmp_path: Path
) -> None:
    tickets = tmp_path / "tickets"
    tickets.mkdir()
    # The first two loads are quick, the reloaded workers take 5 s each.
    model = pickled(UnevenLoading((0.3, 0.3, 5.0), str(tickets)), "m.pkl")
    server = gunicorn(model_path=model, request_timeout_ms=DEADLINE_S * 1000)
    server.wait_ready()
    server.wait_for_log("every worker is ready", 1)
    stop = threading.Event()

    with ThreadPoolExecutor(1) as pool:
        traffic = pool.submit(timed_traffic, server, stop, 8)
        server.wait_answered(20)  # the traffic flows
        assert server.proc is not None
        server.proc.send_signal(signal.SIGHUP)
        try:
            server.wait_for_log("ready to serve", 4, timeout_s=60)  # two new workers loaded
            server.wait_for_log("stopping (a newer worker is ready)", 2, timeout_s=30)
            server.wait_answered(server.answered() + 20)  # the traffic goes on
        finally:
            stop.set()
        outcomes = traffic.result(120)

    failures = [outcome for outcome, _ in outcomes if outcome != 200]
    assert failures == [], failures[:5]
    slowest = max(latency for _, latency in outcomes)
    assert slowest < DEADLINE_S, f"a request waited {slowest:.1f} s"
    assert len(outcomes) > 100
    output = server.output()
    # Each old worker stopped only after a new one was ready.
    assert output.index("stopping (a newer worker") > output.index("loading before accepting")


def test_max_requests_recycles_one_worker_at_a_time_and_loses_nothing(
    gunicorn: Start, pickled: Pickled
) -> None:
    model = pickled(RowOffset(offset=0.0), "m.pkl")
    server = gunicorn(model_path=model, max_requests=20, max_requests_jitter=5, threads=8)
    server.wait_ready()
    stop = threading.Event()

    with ThreadPoolExecutor(1) as pool:
        traffic = pool.submit(timed_traffic, server, stop, 8)
        try:
            # Three recycles done: three replacements ready beside the first two workers.
            server.wait_for_log("recycling after", 3, timeout_s=60)
            server.wait_for_log("ready to serve", 2 + 3, timeout_s=60)
        finally:
            stop.set()
        outcomes = traffic.result(120)

    failures = [outcome for outcome, _ in outcomes if outcome != 200]
    assert failures == [], failures[:5]
    # Between a worker's "recycling" line and its replacement's "ready to serve", no other
    # worker starts recycling.
    events = re.findall(r"recycling after|ready to serve", server.output())
    recycles = events.count("recycling after")
    assert recycles >= 3, server.output()
    in_progress = 0
    for event in events:
        in_progress += 1 if event == "recycling after" else -1 if in_progress else 0
        assert in_progress <= 1, "two workers recycled at the same time"


def test_sigterm_to_a_worker_still_loading_stops_it_at_once(
    gunicorn: Start, pickled: Pickled, tmp_path: Path
) -> None:
    """A worker forked after the first boot loads before Gunicorn installs its signal
    handlers; a SIGTERM reaching it then (an operator, an OOM killer's polite first step)
    must stop it, not be lost while it goes on to load and serve."""
    tickets = tmp_path / "tickets"
    tickets.mkdir()
    model = pickled(UnevenLoading((0.3, 8.0, 0.3), str(tickets)), "m.pkl")  # reload: 8 s
    # Each worker loads its own copy (a shared model is loaded by the master, and a worker
    # forked with it has nothing left to load: tests/e2e/test_sharing.py).
    server = gunicorn(
        model_path=model,
        workers=1,
        request_timeout_ms=int(DEADLINE_S * 1000),
        share_model="off",
    )
    server.wait_ready(workers=1, timeout_s=60)
    server.wait_for_log("every worker is ready", 1)
    assert server.proc is not None
    server.proc.send_signal(signal.SIGHUP)
    server.wait_for_log("loading before accepting", 1, timeout_s=30)
    found = re.search(r"worker (\d+): loading before accepting", server.output())
    assert found is not None

    os.kill(int(found.group(1)), signal.SIGTERM)

    server.wait_for_log("stopping while loading", 1, timeout_s=5)  # not 8 s later
    assert server.terminate() == 0, server.output()


def serving_pid(line: str) -> int:
    """The pid in a Gunicorn log line's second bracket: ``[time] [pid] [INFO] ...``."""
    return int(line.split("] [", 2)[1])


def pids_logging(server: GunicornServer, text: str) -> list[int]:
    """The pids whose log lines contain ``text``, in order of their first such line."""
    pids = [serving_pid(line) for line in server.output().splitlines() if text in line]
    return list(dict.fromkeys(pids))


def test_a_failed_reload_keeps_the_old_workers_and_the_next_reload_acts_at_once(
    gunicorn: Start, pickled: Pickled, tmp_path: Path
) -> None:
    """HUP onto a broken model file, then fix the file and HUP again. The failed reload
    showed as a plain 200 "ready"; the master waited for the old workers to stop (they
    never did: nothing replaced them) for the whole graceful timeout, so the second HUP was
    acted on only then, and it stopped both old workers at once, before the new ones had
    loaded, if the failed ones had not yet healed on their own retry timer."""
    current = tmp_path / "current.pkl"
    pickled(RowOffset(offset=0.0), "v1.pkl").rename(current)
    server = gunicorn(
        model_path=current, request_timeout_ms=DEADLINE_S * 1000, graceful_timeout_s=60
    )
    server.wait_ready()
    server.wait_for_log("every worker is ready", 1)
    first = set(server.worker_pids())
    assert server.proc is not None
    stop = threading.Event()

    with ThreadPoolExecutor(1) as pool:
        traffic = pool.submit(timed_traffic, server, stop, 8)
        try:
            broken = tmp_path / "broken.pkl"
            broken.write_bytes(b"not a pickle")
            broken.rename(current)
            server.proc.send_signal(signal.SIGHUP)
            # Both new workers failed three times: their next retry is 8 s away.
            server.wait_for_log("retrying in 8 s", 2, timeout_s=60)
            # The master says it too ("model sharing: the master cannot load ..."): the
            # workers that failed are the others.
            failed = set(pids_logging(server, "cannot load model")) - {server.proc.pid}
            assert len(failed) == 2 and not failed & first
            health = requests.get(f"{server.url}/healthz", timeout=5)
            assert health.status_code == 200, health.text  # the old model serves
            assert health.json()["workers"]["rollout"] == "failed", health.text
            assert set(server.worker_pids()) >= first

            pickled(RowOffset(offset=1000.0), "v2.pkl").rename(current)
            server.proc.send_signal(signal.SIGHUP)
            server.wait_for_log("Hang up", 2, timeout_s=5)  # not after the graceful timeout
            until(  # before the failed workers' next retry, 8 s away
                lambda: server.predict([[1.0]]).json()["predictions"] == [1001.0], 8,
                interval_s=0.05, what=lambda: f"v2 served:\n{server.output()}",
            )  # fmt: skip
            until(
                lambda: not (first | failed) & set(server.worker_pids()), 30, interval_s=0.1,
                what=lambda: f"the old and failed workers gone:\n{server.output()}",
            )  # fmt: skip
        finally:
            stop.set()
        outcomes = traffic.result(120)

    failures = [outcome for outcome, _ in outcomes if outcome != 200]
    assert failures == [], failures[:5]
    assert len(outcomes) > 100
    health = requests.get(f"{server.url}/healthz", timeout=5).json()
    assert health["workers"] == {"ready": 2, "total": 2}, health
    # The failed workers were replaced, not healed by their retry timer; each old worker
    # stopped only after a worker with the new model was ready.
    loaded = pids_logging(server, "ready to serve")
    assert not failed & set(loaded), server.output()
    lines = server.output().splitlines()
    v2_ready = [
        i for i, line in enumerate(lines)
        if "ready to serve" in line and serving_pid(line) not in first
    ]  # fmt: skip
    old_stopped = [
        i for i, line in enumerate(lines)
        if "stopping (a newer worker is ready)" in line
        and int(line.split("worker ")[1].split(":")[0]) in first
    ]  # fmt: skip
    assert len(old_stopped) == 2 and len(v2_ready) == 2, server.output()
    assert v2_ready[0] < old_stopped[0] and v2_ready[1] < old_stopped[1], server.output()


def test_a_reload_whose_settings_are_invalid_is_refused_and_the_workers_serve_on(
    gunicorn: Start, pickled: Pickled, tmp_path: Path
) -> None:
    """Found by the attack: a SIGHUP re-reads gunicorn.conf.py, whose settings check
    exited the master when a setting had become invalid (the model file removed before a
    copy, a SERVING_MODELS file half-written): every worker followed it ("Parent
    changed"), and the port refused connections from then on. The reload is refused
    instead, in one line, /healthz says so, a worker forked meanwhile serves what the
    others serve, and the next good reload acts."""
    current = tmp_path / "current.pkl"
    pickled(RowOffset(offset=0.0), "v1.pkl").rename(current)
    server = gunicorn(model_path=current, request_timeout_ms=DEADLINE_S * 1000)
    server.wait_ready()
    server.wait_for_log("every worker is ready", 1)
    first = set(server.worker_pids())
    assert server.proc is not None
    outcomes: list[tuple[Any, float]] = []

    with ThreadPoolExecutor(1) as pool:
        stop = threading.Event()
        traffic = pool.submit(timed_traffic, server, stop, 4)
        try:
            current.unlink()
            server.proc.send_signal(signal.SIGHUP)
            server.wait_for_log("reload refused", 1, timeout_s=30)
            health = requests.get(f"{server.url}/healthz", timeout=5)
            workers = health.json()["workers"]
            assert health.status_code == 200, health.text
            assert workers["rollout"] == "failed", workers
            assert "SERVING_MODEL_PATH" in workers["errors"][0]["error"], workers
            time.sleep(1.0)  # the workers would have seen their master go by now
            assert server.proc.poll() is None, server.output()
            assert set(server.worker_pids()) == first, server.output()
        finally:
            stop.set()
        outcomes += traffic.result(120)

    # A worker forked now (its predecessor killed; its clients' connections go with it)
    # serves with the settings its master checked and the model it loaded: it read them
    # again, found the file gone and exited with status 3, at every respawn.
    killed = min(first)
    os.kill(killed, signal.SIGKILL)
    server.wait_replaced(killed)

    with ThreadPoolExecutor(1) as pool:
        stop = threading.Event()
        traffic = pool.submit(timed_traffic, server, stop, 4)
        try:
            pickled(RowOffset(offset=1000.0), "v2.pkl").rename(current)
            server.proc.send_signal(signal.SIGHUP)
            until(
                lambda: server.predict([[1.0]]).json()["predictions"] == [1001.0], 60,
                interval_s=0.1, what=lambda: f"v2 served:\n{server.output()}",
            )  # fmt: skip
            until(
                lambda: "rollout" not in requests.get(f"{server.url}/healthz", timeout=5)
                .json()["workers"], 60, interval_s=0.2,
                what=lambda: f"the rollout over:\n{server.output()}",
            )  # fmt: skip
        finally:
            stop.set()
        outcomes += traffic.result(120)

    failures = [outcome for outcome, _ in outcomes if outcome != 200]
    assert failures == [], failures[:5]
    assert len(outcomes) > 50
    lines = [line for line in server.output().splitlines() if "reload refused" in line]
    assert len(lines) == 1, server.output()
    assert "SERVING_MODEL_PATH" in lines[0] and "serve on" in lines[0], lines[0]
    assert "exited with code 3" not in server.output(), server.output()


def test_when_no_worker_serves_the_failed_ones_accept_and_answer_503_until_a_load_works(
    gunicorn: Start, pickled: Pickled, tmp_path: Path
) -> None:
    """Found by the attack: after a reload onto a broken file, the old workers killed, the
    new ones (failed, retrying before accepting) held the listening socket: the kernel
    completed every handshake and nothing answered, /livez and /healthz included, until
    each client's own timeout. With no worker serving, a failed one accepts meanwhile:
    /livez 200, /healthz and predictions 503 not_ready at once, and it serves once its
    retry loads a good file."""
    current = tmp_path / "current.pkl"
    pickled(RowOffset(offset=0.0), "v1.pkl").rename(current)
    server = gunicorn(model_path=current, request_timeout_ms=DEADLINE_S * 1000)
    server.wait_ready()
    server.wait_for_log("every worker is ready", 1)
    first = set(server.worker_pids())
    assert server.proc is not None
    broken = tmp_path / "broken.pkl"
    broken.write_bytes(b"not a pickle")
    broken.rename(current)
    server.proc.send_signal(signal.SIGHUP)
    server.wait_for_log("cannot load model", 2, timeout_s=60)
    for pid in first:
        os.kill(pid, signal.SIGKILL)
    until(lambda: not first & set(server.worker_pids()), 30, interval_s=0.1)

    def predict() -> requests.Response:
        return requests.post(f"{server.url}/predict", json={"instances": [[1.0]]}, timeout=2)

    def answers() -> tuple[int, int, int]:
        live = requests.get(f"{server.url}/livez", timeout=2).status_code
        health = requests.get(f"{server.url}/healthz", timeout=2).status_code
        return live, health, predict().status_code

    def answered() -> bool:
        try:
            return answers() == (200, 503, 503)
        except requests.RequestException:
            return False

    until(
        answered, 30, interval_s=0.2, what=lambda: f"503s at once ({answers()}):\n{server.output()}"
    )
    body = predict().json()
    assert body["error"]["code"] == "not_ready", body
    health = requests.get(f"{server.url}/healthz", timeout=2).json()["workers"]
    assert "cannot load model" in health["errors"][0]["error"], health

    pickled(RowOffset(offset=1000.0), "v2.pkl").rename(current)
    until(
        lambda: predict().status_code == 200, 90, interval_s=0.5,
        what=lambda: f"v2 served after a retry:\n{server.output()}",
    )  # fmt: skip
    assert server.predict([[1.0]]).json()["predictions"] == [1001.0]
    until(
        lambda: requests.get(f"{server.url}/healthz", timeout=2).status_code == 200, 90,
        interval_s=0.5, what=lambda: f"every worker ready:\n{server.output()}",
    )  # fmt: skip


def test_max_requests_bounds_what_each_worker_serves_across_a_reload(
    gunicorn: Start, pickled: Pickled
) -> None:
    """SERVING_MAX_REQUESTS=500 let one worker serve 13,574 requests: a worker past its
    count waits for the recycle gate, and the gate's slot was freed only by a replacement
    that became ready after the leaver had exited. A reload (or TTIN) during a recycle
    readied workers while the leaver was still draining, so the slot stayed taken and no
    worker recycled again; and each replacement was forked only once its leaver had
    exited and been reaped (1-4 s on a busy machine), all that time the other worker
    serving past its count."""
    limit, clients = 20, 8
    model = pickled(RowOffset(offset=0.0), "m.pkl")
    server = gunicorn(model_path=model, max_requests=limit, max_requests_jitter=0, threads=8)
    server.wait_ready()
    server.wait_for_log("every worker is ready", 1)
    assert server.proc is not None
    stop = threading.Event()

    with ThreadPoolExecutor(1) as pool:
        traffic = pool.submit(timed_traffic, server, stop, clients)
        try:
            for hup in (1, 2):
                server.wait_for_log("recycling after", 2 * hup, timeout_s=60)
                server.proc.send_signal(signal.SIGHUP)  # while a recycle is under way
                server.wait_for_log("Hang up", hup, timeout_s=30)
            # Recycling goes on after the reloads.
            until(
                lambda: server.output().rpartition("Hang up")[2].count("recycling after") >= 6,
                60, interval_s=0.1, what=lambda: f"6 recycles after:\n{server.output()}",
            )  # fmt: skip
        finally:
            stop.set()
        outcomes = traffic.result(120)
    assert server.terminate() == 0, server.output()

    failures = [outcome for outcome, _ in outcomes if outcome != 200]
    assert failures == [], failures[:5]
    served = [int(n) for n in re.findall(r"exiting after (\d+) requests", server.output())]
    assert len(served) >= 10, server.output()
    # Past its count a worker serves on only while another loads: the previous leaver's
    # replacement, or a reload's new workers (observed: at most 56-135 with this limit of
    # 20 on a quiet host; 655 and 682 with the CPU hog, a worker past its count through a
    # whole rollover; 13,574 before, when recycling stopped for good). That recycling goes
    # on is the wait above; this bound only says no worker served without one.
    assert max(served) <= 100 * limit, sorted(served)


def test_a_new_worker_killed_while_it_loads_leaves_no_old_model_serving(
    gunicorn: Start, pickled: Pickled, tmp_path: Path
) -> None:
    """Serve A, rename B over the file, HUP, and SIGKILL the first new worker as it loads
    (an OOM kill during its warm-up): no replacement was forked, the rollover retired one
    old worker, and 60 s later 93 of 200 answers still came from A, with /healthz saying
    2 of 2 ready and nothing of a rollout. Now the dead worker's place goes to another new
    one, /healthz says the rollout is in progress, and then every answer comes from B."""
    tickets = tmp_path / "tickets"
    tickets.mkdir()
    current = tmp_path / "current.pkl"
    pickled(RowOffset(offset=0.0), "a.pkl").rename(current)
    server = gunicorn(
        model_path=current, share_model="off", load_timeout_s=60,
        request_timeout_ms=DEADLINE_S * 1000,
    )  # fmt: skip
    server.wait_ready()
    server.wait_for_log("every worker is ready", 1)
    first = set(server.worker_pids())
    assert server.proc is not None
    # B loads slowly in each new worker (3 s): time to catch one loading.
    pickled(UnevenLoading((3.0,), str(tickets), offset=1000.0), "b.pkl").rename(current)
    server.proc.send_signal(signal.SIGHUP)
    fresh = until(
        lambda: set(server.worker_pids()) - first, 10, interval_s=0.02,
        what="a new worker forked",
    )  # fmt: skip
    os.kill(min(fresh), signal.SIGKILL)
    seen_in_progress = until(
        lambda: requests.get(f"{server.url}/healthz", timeout=5).json()["workers"].get("rollout")
        == "in_progress",
        10, interval_s=0.05, what="the rollout shown in progress",
    )  # fmt: skip
    until(
        lambda: not first & set(server.worker_pids()), 60, interval_s=0.2,
        what=lambda: f"every old worker gone:\n{server.output()}",
    )  # fmt: skip
    answers = [server.predict([[1.0]]).json()["predictions"][0] for _ in range(200)]
    health = requests.get(f"{server.url}/healthz", timeout=5).json()["workers"]

    assert seen_in_progress
    assert answers == [1001.0] * 200  # B only
    assert health == {"ready": 2, "total": 2}, health
