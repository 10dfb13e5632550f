"""``/healthz`` under real Gunicorn with API keys: a probe without a key learns ready and
counts, not a failed worker's load error (the model's path, a corrupt file's bytes)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from tests.e2e.server import GunicornServer
from tests.models import RowEcho
from tests.waiting import until

KEY = "k" * 24


def test_healthz_shows_a_failed_workers_load_error_only_with_a_key(
    gunicorn: Callable[..., GunicornServer], pickled: Callable[[Any, str], Path]
) -> None:
    model = pickled(RowEcho(n_features=1), "m.pkl")
    # Each worker loads its own copy: a respawn reads the (corrupted) file. A shared model's
    # respawn reads none (tests/e2e/test_sharing.py).
    server = gunicorn(model_path=model, api_keys=KEY, share_model="off")
    server.wait_ready()
    server.wait_for_log("every worker is ready", 1)  # the first boot is over
    model.write_bytes(b"corrupt model bytes")  # the next worker to load it fails
    os.kill(server.worker_pids()[0], signal.SIGKILL)
    server.wait_for_log("retrying in", 1, timeout_s=30)

    def failed_shown() -> requests.Response | None:
        # the board shows the failed worker once it has written its state
        detail = requests.get(f"{server.url}/healthz", headers={"X-API-Key": KEY}, timeout=5)
        return detail if detail.json()["workers"].get("failed") == 1 else None

    detail = until(failed_shown, 30, interval_s=0.05, what=lambda: f"failed:\n{server.output()}")
    assert str(model) in detail.json()["workers"]["errors"][0]["error"]
    assert detail.json()["model_name"] == "m"

    probe = requests.get(f"{server.url}/healthz", timeout=5)

    assert probe.status_code == 200
    assert probe.json() == {
        "status": "ready",
        "workers": {"ready": 1, "total": 1, "failed": 1, "rollout": "failed"},
    }  # no errors, no stages: no model name or path
    assert str(model.parent) not in probe.text and "load key" not in probe.text
    assert server.predict([[1.0]], headers={"X-API-Key": KEY}).status_code == 200
    assert server.terminate() == 0
