"""Python per request besides the model, in-process: our ``/predict`` (single-row body,
a no-op model, access log and metrics on as by default) beside a bare Flask view that
echoes the body, each called as a WSGI app with a prebuilt environ, so no socket,
Gunicorn or batching thread is in the figure.

    python bench/request_path.py                        # this tree
    python bench/request_path.py --before 2f4a608       # and a commit, taking turns
    python bench/request_path.py --body v2-binary --rows 64 --width 30 --dtype float32

``--body`` picks the request: ``predict`` (``{"instances": [[...]]}``), ``v2-json`` (one
KServe V2 tensor of ``--dtype`` as JSON data) or ``v2-binary`` (the same tensor as
Triton's binary tensor data); ``--rows`` instances of ``--width`` values each, for a
no-op model whose features are ``--dtype`` (a float32 ONNX graph's, or scikit-learn's
float64). The echo view echoes the same body.

Ours writes its metrics as under Gunicorn, in prometheus-client's multiprocess mode
(``PROMETHEUS_MULTIPROC_DIR``: every write goes to an mmap file), unless ``--metrics
local`` (in-memory values, cheaper: the figure before 2026-12-02 was taken so).

Each round runs every target in its own fresh interpreter (``--requests`` calls after a
warm-up) and reports CPU microseconds per request (``time.process_time``: the process's
CPU, so a busy neighbour moves it less than wall time would) and wall microseconds.
Rounds alternate targets; every round is printed, then min/median/max, and the ratio of
ours to the echo. The CPU model is printed first: compare ratios from one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.host import cpu_model  # noqa: E402

_RUN = r"""
import io, json, sys, time
sys.path.insert(0, sys.argv[1])
import numpy as np
from flask import Flask, request
from prometheus_client import CollectorRegistry

kind, n = sys.argv[2], int(sys.argv[3])
form, n_rows, width, dtype = sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
rows = (np.arange(n_rows * width).reshape(n_rows, width) % 7 + 0.5).astype(dtype)
path, headers = "/predict", {}
if form == "predict":
    body = json.dumps({"instances": rows.tolist()}).encode()
else:
    path = "/v2/models/noop/infer"
    datatype = {"float32": "FP32", "float64": "FP64"}[dtype]
    tensor = {"name": "input-0", "shape": [n_rows, width], "datatype": datatype}
    if form == "v2-json":
        body = json.dumps({"inputs": [{**tensor, "data": rows.ravel().tolist()}]}).encode()
    else:
        tensor["parameters"] = {"binary_data_size": rows.nbytes}
        header = json.dumps({"inputs": [tensor]}).encode()
        body = header + rows.astype(rows.dtype.newbyteorder("<")).tobytes()
        headers = {"HTTP_INFERENCE_HEADER_CONTENT_LENGTH": str(len(header))}
if kind == "echo":
    app = Flask("echo")

    @app.post(path)
    def predict():
        return request.get_data(), 200, {"Content-Type": "application/json"}
else:
    from serving.app import create_app
    from serving.model.handle import ModelHandle
    from serving.observe import access_log
    from serving.observe.metrics import ServingMetrics
    from serving.settings import Settings
    handle = ModelHandle("noop", "1", "callable",
                         lambda rows: {"predictions": np.zeros(len(rows))},
                         n_features=width, input_dtype=np.dtype(dtype))
    app = create_app(Settings(workers=1), models=[handle],
                     metrics=ServingMetrics(CollectorRegistry()))
    access_log.record = lambda fields: None  # the line's formatting runs off the request thread

def environ():
    return {
        "REQUEST_METHOD": "POST", "PATH_INFO": path, "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000", "wsgi.url_scheme": "http", "SERVER_PROTOCOL": "HTTP/1.1",
        "CONTENT_TYPE": "application/json", "CONTENT_LENGTH": str(len(body)),
        "wsgi.input": io.BytesIO(body), "wsgi.errors": sys.stderr, "wsgi.multithread": True,
        "wsgi.multiprocess": False, "wsgi.run_once": False, **headers,
    }

statuses = []
def start_response(status, headers, exc_info=None):
    statuses.append(status)

def call():
    for chunk in app(environ(), start_response):
        pass

for _ in range(500):
    call()
assert statuses[-1].startswith("200"), statuses[-1]
cpu, wall = time.process_time(), time.perf_counter()
for _ in range(n):
    call()
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
print(json.dumps({"cpu_us": cpu / n * 1e6, "wall_us": wall / n * 1e6}))
"""


def measure(tree: Path, kind: str, args: argparse.Namespace) -> dict[str, float]:
    shape = [args.body, str(args.rows), str(args.width), args.dtype]
    env = dict(os.environ)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    with tempfile.TemporaryDirectory() as values:
        if args.metrics == "multiprocess":
            env["PROMETHEUS_MULTIPROC_DIR"] = values
        out = subprocess.run(
            [sys.executable, "-c", _RUN, str(tree), kind, str(args.requests), *shape],
            check=True, capture_output=True, text=True, timeout=600, env=env,
        )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="a commit to measure beside this tree")
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--metrics", choices=("multiprocess", "local"), default="multiprocess")
    parser.add_argument("--body", choices=["predict", "v2-json", "v2-binary"], default="predict")
    parser.add_argument("--rows", type=int, default=1, help="instances per request")
    parser.add_argument("--width", type=int, default=3, help="features per instance")
    parser.add_argument("--dtype", choices=["float64", "float32"], default="float64",
                        help="the model's feature type (and the V2 tensor's)")  # fmt: skip
    args = parser.parse_args()
    cpu = cpu_model()
    print(f"CPU: {cpu}; metrics: {args.metrics}")
    print(f"body: {args.body}, {args.rows} x {args.width} {args.dtype}")
    targets: dict[str, tuple[Path, str]] = {"echo": (ROOT, "echo"), "ours": (ROOT, "ours")}
    with tempfile.TemporaryDirectory() as scratch:
        if args.before:
            before = Path(scratch) / "before"
            subprocess.run(
                ["git", "worktree", "add", "--detach", str(before), args.before],
                cwd=ROOT, check=True, capture_output=True,
            )  # fmt: skip
            targets[f"ours@{args.before}"] = (before, "ours")
        try:
            results: dict[str, list[dict[str, float]]] = {name: [] for name in targets}
            for round_ in range(args.rounds):
                for name, (tree, kind) in targets.items():
                    results[name].append(measure(tree, kind, args))
                    cell = results[name][-1]
                    print(f"round {round_ + 1} {name:>16}: {cell['cpu_us']:7.1f} us CPU "
                          f"{cell['wall_us']:7.1f} us wall per request")  # fmt: skip
        finally:
            if args.before:
                subprocess.run(["git", "worktree", "remove", "--force", str(before)], cwd=ROOT,
                               check=False, capture_output=True)  # fmt: skip
    echo = statistics.median(r["cpu_us"] for r in results["echo"])
    print("\nCPU us per request: min / median / max, and median over the echo's")
    for name, cells in results.items():
        values = sorted(c["cpu_us"] for c in cells)
        median = statistics.median(values)
        print(f"{name:>16}: {values[0]:7.1f} / {median:7.1f} / {values[-1]:7.1f}   "
              f"{median / echo:4.2f}x echo")  # fmt: skip


if __name__ == "__main__":
    main()
