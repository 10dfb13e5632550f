"""Load once, fork many (``SERVING_SHARE_MODEL=auto``) under real Gunicorn on a busy machine
(``cpu_hog``): the master loads the file once, every worker (first ones, a SIGKILLed
worker's replacement, a reload's) serves that copy, and a reload onto a broken file keeps
the old model serving. ``UnevenLoading`` leaves one file in ``tickets`` per load."""

from __future__ import annotations

import os
import pickle
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
from sklearn.datasets import make_classification
from sklearn.ensemble import RandomForestClassifier

from tests.e2e.server import GunicornServer
from tests.models import RowOffset, SlowLoading, UnevenLoading
from tests.waiting import until

Start = Callable[..., GunicornServer]
Pickled = Callable[[Any, str], Path]

pytestmark = pytest.mark.usefixtures("cpu_hog")


def _loads(tickets: Path) -> int:
    return len(list(tickets.iterdir()))


def _answer(server: GunicornServer, value: float) -> float:
    response = server.predict([[value]])
    assert response.status_code == 200, response.text
    prediction: float = response.json()["predictions"][0]
    return prediction


def test_workers_share_one_load_respawns_and_ttin_load_nothing_and_hup_swaps_the_model(
    gunicorn: Start, tmp_path: Path
) -> None:
    v1_tickets, v2_tickets, broken_tickets = (tmp_path / n for n in ("t1", "t2", "t3"))
    for tickets in (v1_tickets, v2_tickets, broken_tickets):
        tickets.mkdir()
    current = tmp_path / "m.pkl"
    v1 = UnevenLoading((0.0,), str(v1_tickets), offset=0.0)
    current.write_bytes(pickle.dumps(v1))
    server = gunicorn(model_path=current)
    server.wait_ready(workers=2)

    assert "model sharing: 'm' version '1' shared (pickle: loaded once in the master)" in (
        server.output()
    )
    assert _loads(v1_tickets) == 1  # one load for two workers
    rows = np.array([[1.0], [2.5]])
    answered = server.predict(rows.tolist()).json()["predictions"]
    assert answered == v1.predict(rows).tolist()  # as in-process

    # A SIGKILLed worker's replacement serves the master's copy: it reads no file.
    victim, survivor = server.worker_pids()
    os.kill(victim, signal.SIGKILL)
    server.wait_for_log("ready to serve", 3, timeout_s=30)
    (replacement,) = set(server.worker_pids()) - {survivor}
    log = server.output()
    assert f"[{replacement}] [INFO] model 'm': inherited from the master" in log, log
    assert f"[{replacement}] [INFO] model {current}: read and checked" not in log, log
    assert _loads(v1_tickets) == 1
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTTIN)  # one more worker: it inherits the model too
    server.wait_for_log("ready to serve", 4, timeout_s=30)
    assert _loads(v1_tickets) == 1
    server.proc.send_signal(signal.SIGTTOU)
    until(lambda: len(server.worker_pids()) == 2, 30, interval_s=0.1, what="back to 2")

    # HUP onto a new file: the master loads it once, the new workers answer with it.
    new = tmp_path / "m.pkl.new"
    new.write_bytes(pickle.dumps(UnevenLoading((0.0,), str(v2_tickets), offset=1000.0)))
    new.rename(current)
    server.proc.send_signal(signal.SIGHUP)
    until(lambda: _answer(server, 1.0) == 1001.0, 60, interval_s=0.1,
          what=lambda: f"the new model's answers:\n{server.output()}")  # fmt: skip
    until(lambda: len(server.worker_pids()) == 2, 30, interval_s=0.1, what="old workers gone")
    assert _loads(v2_tickets) == 2  # the master's, after its trial in a separate process

    # HUP onto a broken file: the master says why; the workers serving the model go on.
    new.write_bytes(b"not a pickle")
    new.rename(current)
    server.proc.send_signal(signal.SIGHUP)
    server.wait_for_log("model sharing: the master cannot load 'm' version '1'", 1)
    server.wait_for_log("retrying in", 2, timeout_s=30)  # the new workers cannot load it
    assert [_answer(server, 1.0) for _ in range(20)] == [1001.0] * 20
    health = requests.get(f"{server.url}/healthz", timeout=5)
    assert health.status_code == 200 and health.json()["workers"]["rollout"] == "failed"
    assert server.terminate() == 0


def test_a_shared_forest_answers_as_in_process(gunicorn: Start, pickled: Pickled) -> None:
    X, y = make_classification(n_samples=400, n_features=6, n_informative=4, random_state=0)
    forest = RandomForestClassifier(n_estimators=30, random_state=0).fit(X, y)
    server = gunicorn(model_path=pickled(forest, "forest.pkl"))
    server.wait_ready(workers=2)
    assert "'forest' version '1' shared" in server.output()

    for start in range(0, 400, 100):  # several requests: both workers answer some
        body = server.predict(X[start : start + 100].tolist()).json()
        np.testing.assert_array_equal(body["predictions"], forest.predict(X[start : start + 100]))
        np.testing.assert_allclose(  # compiled in each worker (SERVING_COMPILE=auto)
            body["probabilities"], forest.predict_proba(X[start : start + 100]), atol=1e-6
        )
    assert server.output().count("compiled to ONNX Runtime") == 2
    assert server.terminate() == 0


def test_a_master_load_past_its_timeout_stops_the_start_naming_the_model(
    gunicorn: Start, pickled: Pickled
) -> None:
    """A pickle that hangs for 90 s with SERVING_LOAD_TIMEOUT_S=5: no worker, no probe,
    for 90 s. The master's load is bounded like a worker's."""
    model = pickled(SlowLoading(n_features=1, load_s=90.0), "hangs.pkl")
    server = gunicorn(model_path=model, load_timeout_s=3)

    status = server.wait_exit(timeout_s=30)

    assert status == 3, server.output()
    assert "the master's load of model 'hangs' took longer than" in server.output()
    assert "SERVING_LOAD_TIMEOUT_S=3 s; not starting" in server.output()


def test_sigterm_while_the_master_loads_is_acted_on_at_once(
    gunicorn: Start, pickled: Pickled
) -> None:
    """A SIGTERM 17 s into a 90 s master load was acted on at 90 s (Kubernetes' 30 s grace
    would have ended in SIGKILL)."""
    model = pickled(SlowLoading(n_features=1, load_s=90.0), "hangs.pkl")
    server = gunicorn(model_path=model, load_timeout_s=120)
    server.wait_for_log("model sharing: 'hangs'", 1)  # the master is loading it
    assert server.proc is not None
    server.proc.send_signal(signal.SIGTERM)

    status = server.wait_exit(timeout_s=20)  # not after the load's 90 s

    assert status == 0, server.output()
    assert "the master stopped loading 'hangs' version '1' (SIGTERM)" in server.output()


def test_a_reload_whose_master_load_hangs_keeps_the_old_model_serving(
    gunicorn: Start, pickled: Pickled, tmp_path: Path
) -> None:
    """HUP onto a pickle that hangs: the master's reload is abandoned at the timeout, the
    new workers load for themselves (and fail at the same timeout), the old workers serve
    the old model all along, and /healthz says the rollout failed."""
    current = tmp_path / "current.pkl"
    pickled(RowOffset(offset=0.0), "a.pkl").rename(current)
    server = gunicorn(model_path=current, load_timeout_s=3)
    server.wait_ready()
    assert server.proc is not None
    pickled(SlowLoading(n_features=1, load_s=60.0), "b.pkl").rename(current)
    server.proc.send_signal(signal.SIGHUP)
    server.wait_for_log("took longer than 3 s (SERVING_LOAD_TIMEOUT_S)", 1, timeout_s=20)
    answers = [server.predict([[1.0]]).json()["predictions"] for _ in range(20)]
    health = until(
        lambda: (h := requests.get(f"{server.url}/healthz", timeout=5).json())["workers"].get(
            "rollout"
        ) == "failed" and h,
        30, interval_s=0.2, what="the failed rollout in /healthz",
    )  # fmt: skip

    assert answers == [[1.0]] * 20  # the old model, throughout
    assert health["status"] == "ready", health
