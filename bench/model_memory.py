"""Memory per model: one Gunicorn worker's RSS and PSS with 0..n models of SERVING_MODELS.

    python bench/model_memory.py

Starts the service with one worker for each configuration below, waits until every model
is loaded and warmed up, answers one request per model, then reads the worker's RSS and
PSS (``/proc/<pid>/smaps_rollup``) and the master's. The difference between rows is what
one more model costs in every worker (the figure to multiply by SERVING_WORKERS).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.http_load import free_port  # noqa: E402
from bench.models import RESULTS, model_path, real_rows  # noqa: E402

GUNICORN = Path(sys.executable).parent / "gunicorn"


def memory_mib(pid: int) -> tuple[float, float]:
    """(RSS, PSS) of ``pid`` in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value, *_ = line.split()
        fields[name.rstrip(":")] = int(value) / 1024
    return fields["Rss"], fields["Pss"]


def measure(models: list[dict[str, str]]) -> tuple[float, float, float]:
    """Worker RSS, worker PSS, master RSS (MiB) with ``models`` loaded."""
    port = free_port()
    config = Path(tempfile.mkdtemp()) / "models.json"
    config.write_text(json.dumps(models))
    env = {
        **os.environ,
        "SERVING_MODELS": str(config),
        "SERVING_WORKERS": "1",
        "SERVING_BIND": f"127.0.0.1:{port}",
        "SERVING_ACCESS_LOG": "false",
        "SERVING_METRICS_DIR": tempfile.mkdtemp(),
    }
    log = RESULTS / "model_memory.log"
    RESULTS.mkdir(exist_ok=True)
    with log.open("wb") as out:
        command = [str(GUNICORN), "wsgi:app", "-c", "gunicorn.conf.py", "--no-control-socket"]
        server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=out,
                                  process_group=0)  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while log.read_text().count("ready to serve") < len(models):
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"server did not start:\n{log.read_text()}")
                time.sleep(0.2)
            row = real_rows()[0].tolist()
            for spec in models:
                body = {"instances": [row] * 32, "model_version": spec["version"]}
                requests.post(f"http://127.0.0.1:{port}/predict", json=body, timeout=30)
            children = Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()
            rss, pss = memory_mib(int(children[0]))
            return rss, pss, memory_mib(server.pid)[0]
        finally:
            server.terminate()
            server.wait(30)


def main() -> None:
    entries = [
        ("demo LogisticRegression (joblib)", model_path("light")),
        ("demo LogisticRegression (ONNX)", model_path("light").with_suffix(".onnx")),
        ("MLP 512x512 (ONNX)", model_path("mlp-onnx")),
        ("MLP 512x512 (joblib)", model_path("mlp")),
        ("RandomForest 300 trees (joblib)", model_path("heavy")),
    ]
    print(f"{'models loaded (one worker)':<58} {'RSS MiB':>8} {'PSS MiB':>8} {'+RSS':>7}")
    previous = None
    for n in range(1, len(entries) + 1):
        models = [
            {"name": "m", "version": str(i), "path": str(path)}
            for i, (_, path) in enumerate(entries[:n])
        ]
        rss, pss, master = measure(models)
        added = f"{rss - previous:+7.1f}" if previous is not None else " " * 7
        label = ("" if n == 1 else "+ ") + entries[n - 1][0]
        print(f"{label:<58} {rss:8.1f} {pss:8.1f} {added}")
        previous = rss
    print(f"(master: {master:.1f} MiB RSS)")


if __name__ == "__main__":
    main()
