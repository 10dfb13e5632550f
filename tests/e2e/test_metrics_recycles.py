"""Metrics over many worker recycles: the multiprocess directory stays bounded (dead
workers' files are folded into an archive) and counters keep every request.

No CPU hog here: this checks counting and file growth, not timing, and each recycle
(fork, import, load, one at a time) is what takes the time: ~1 s each on a 2-core machine
at load average 6, up to 3 s with the full suite beside it. 50 recycles by default;
``E2E_RECYCLES=200`` for the issue's figure.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from serving.server.metrics_archive import ARCHIVED_TYPES
from tests.e2e.server import GunicornServer
from tests.models import RowOffset

Start = Callable[..., GunicornServer]
Pickled = Callable[[Any, str], Path]


@pytest.mark.timeout(600)
def test_metrics_files_stay_bounded_and_counts_exact_over_many_recycles(
    gunicorn: Start, pickled: Pickled
) -> None:
    recycles = int(os.environ.get("E2E_RECYCLES", "50"))
    model = pickled(RowOffset(offset=0.0), "m.pkl")
    server = gunicorn(model_path=model, max_requests=2, max_requests_jitter=0, access_log=False)
    server.wait_ready()
    # A new connection per request: a leaving worker lingers on kept-alive connections
    # (Gunicorn gives a request already on its way an answer), which would slow each recycle.
    sent = 0
    deadline = time.monotonic() + 4 * recycles + 30
    while sent % 20 or server.output().count("recycling after") < recycles:
        assert time.monotonic() < deadline, "too slow"
        response = requests.post(f"{server.url}/predict", json={"instances": [[1.0]]}, timeout=30)
        assert response.status_code == 200, response.text
        sent += 1

    files = list(server.metrics_dir.glob("*.db"))
    # Bounded whatever the number of recycles: one file per metric type per process, at
    # most 2 workers plus 2 recycling ones still draining (serving.server.recycling.
    # RecycleGate), plus one archive per archived type.
    types = {f.name.rsplit("_", 1)[0] for f in files if "archive" not in f.name}
    bound = 4 * len(types) + len(ARCHIVED_TYPES)
    assert len(files) <= bound < recycles, sorted(f.name for f in files)
    started = time.perf_counter()
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    assert time.perf_counter() - started < 2.0
    assert server.metric('http_requests_total{route="/predict"}', text) == sent


def test_the_default_metrics_directory_is_removed_when_the_master_exits(
    pickled: Pickled, tmp_path: Path
) -> None:
    model = pickled(RowOffset(offset=0.0), "m.pkl")
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    server = GunicornServer(tmp_path, model_path=model)
    del server.env["SERVING_METRICS_DIR"]  # the default: a new temporary directory
    server.env["TMPDIR"] = str(temporary)
    try:
        server.start().wait_ready()
        assert len(list(temporary.glob("serving-metrics-*"))) == 1
        assert server.predict([[1.0]]).status_code == 200
        assert server.terminate() == 0
    finally:
        server.kill()
    assert list(temporary.iterdir()) == []  # neither metrics nor the workers' board left


def test_a_metrics_directory_removed_while_serving_is_made_again(
    gunicorn: Start, pickled: Pickled
) -> None:
    """The default metrics directory is a temporary one, which a /tmp cleaner may remove
    from under a long-running server. Before, /metrics answered 500 from then on, and a
    worker that died was never replaced: its successor failed to create its metric files
    and retried for good (one worker fewer per crash or recycle)."""
    import shutil
    import signal

    from tests.waiting import until

    model = pickled(RowOffset(offset=0.0), "m.pkl")
    server = gunicorn(model_path=model, access_log=False)
    server.wait_ready()
    assert server.predict([[1.0]]).status_code == 200
    shutil.rmtree(server.metrics_dir)

    scrape = requests.get(f"{server.url}/metrics", timeout=10)
    os.kill(server.worker_pids()[0], signal.SIGKILL)

    def both_ready() -> bool:
        health = requests.get(f"{server.url}/healthz", timeout=5).json()
        return bool(health["workers"] == {"ready": 2, "total": 2})

    until(both_ready, 30, interval_s=0.2, what=lambda: f"2 workers ready:\n{server.output()}")
    assert scrape.status_code == 200, scrape.text
    assert server.metrics_dir.is_dir()

    def counted() -> bool:  # the replacement's requests are counted again (the old
        assert server.predict([[1.0]]).status_code == 200  # worker's go to a removed file)
        return server.answered() >= 1

    until(counted, 30, interval_s=0.05, what=lambda: "a /predict counted")
    assert "removed while the server ran" in server.output()
