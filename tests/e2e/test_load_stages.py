"""A long first load says how far it is: /healthz names the stage each loading worker is
at (reading, loading, warming up) while it loads, and the log gives each stage's size and
time, under the real Gunicorn."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.e2e.server import GunicornServer
from tests.models import SlowLoading
from tests.waiting import until


@pytest.mark.usefixtures("cpu_hog")  # as production is: busy
def test_healthz_names_the_stage_of_a_loading_worker(
    gunicorn: Callable[..., GunicornServer], pickled: Callable[[Any, str], Path]
) -> None:
    model = pickled(SlowLoading(n_features=2, load_s=4.0), "slow.pkl")
    # The worker loads the model itself (a shared model is loaded by the master before any
    # worker exists, so no /healthz answers with its stage).
    server = gunicorn(model_path=model, workers=1, share_model="off")

    def stages() -> list[dict[str, Any]]:
        try:
            body = requests.get(f"{server.url}/healthz", timeout=5).json()
        except requests.RequestException:
            return []
        return body["workers"].get("stages", [])

    seen = until(stages, 30, interval_s=0.05, what=lambda: f"stages:\n{server.output()}")
    server.wait_ready(workers=1)

    assert seen[0]["stage"] == "model 'slow': loading"  # the unpickling sleeps 4 s
    assert "stages" not in requests.get(f"{server.url}/healthz", timeout=5).json()["workers"]
    output = server.output()
    assert f"model {model}: read and checked" in output
    assert "model 'slow': loaded as pickle" in output and "model 'slow': warmed up" in output
    # the first boot accepts while it loads: its line says so (the trial read it as ready)
    assert "accepting connections (its models still load: /healthz and predictions" in output
