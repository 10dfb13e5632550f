"""Every protocol under load: one row per request on /predict, KServe V2 infer, TF Serving
predict and MLflow /invocations, this service against another tree's, taking turns.

    python bench/protocols_load.py --before /path/to/worktree    # ~3 min on 2 cores
    python bench/protocols_load.py --before /path/to/worktree --traced   # and traced
    python bench/protocols_load.py --before /path/to/worktree --nginx    # behind deploy/nginx

Each round starts each server afresh (own session, 2 workers, demo model, access log on),
runs wrk (one thread, pinned to the last CPU) with ``--connections`` keep-alive
connections for ``--duration`` seconds per route, and prints requests/s, p50, the
server's CPU per request (utime + stime of master and workers from /proc) and the mean
batch (instances per predict call, from /metrics). The first server changes from round to
round, and so does the first route each server is loaded with. ``--traced`` adds this
service with tracing on, exporting OTLP over HTTP to a collector in this process that
answers 200 and drops every span: ``traced`` with the default sampler, ``all`` tracing
every request (``OTEL_TRACES_SAMPLER=parentbased_always_on``). ``--nginx`` puts
deploy/nginx in front of each server (its CPU per request shown apart).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.host import cpu_model  # noqa: E402
from bench.http_load import cpu_seconds, free_port  # noqa: E402
from bench.models import RESULTS, batch_totals, real_rows  # noqa: E402

GUNICORN = Path(sys.executable).parent / "gunicorn"
ROW = [float(v) for v in real_rows()[0]]
COLUMNS = [f"f{i}" for i in range(len(ROW))]
ROUTES = {
    "predict": ("/predict", {"instances": [ROW]}, "application/json"),
    "v2": (
        "/v2/models/breast_cancer/infer",
        {"inputs": [{"name": "input-0", "shape": [1, 30], "datatype": "FP64", "data": ROW}]},
        "application/json",
    ),
    "tfserving": ("/v1/models/breast_cancer:predict", {"instances": [ROW]}, "application/json"),
    "invocations": ("/invocations", {"inputs": [ROW]}, "application/json"),
}


def serve(root: Path, extra_env: dict[str, str]) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {
        **os.environ,
        **extra_env,
        "PYTHONPATH": str(root),
        "SERVING_BIND": f"127.0.0.1:{port}",
        "SERVING_WORKERS": "2",
        "SERVING_METRICS_DIR": tempfile.mkdtemp(prefix="bench-protocols-"),
    }
    proc = subprocess.Popen(
        [str(GUNICORN), "wsgi:app", "-c", "gunicorn.conf.py", "--no-control-socket"],
        cwd=root, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    import requests

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).ok:
                return proc, port
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise SystemExit(f"server in {root} did not start")


def load(
    port: int, route: str, connections: int, duration_s: int, master: int, *, nginx: Any = None
) -> str:
    """One wrk run on ``route``: to ``port``, or through ``nginx`` in front of it."""
    path, body, kind = ROUTES[route]
    body_file = RESULTS / f"protocols-{route}.json"
    body_file.write_text(json.dumps(body))
    last_cpu = str(max(os.sched_getaffinity(0)))
    before = cpu_seconds(master)
    nginx_before = cpu_seconds(nginx.proc.pid) if nginx is not None else 0.0
    target = nginx.port if nginx is not None else port
    calls_before, instances_before = _batches(port)
    out = subprocess.run(
        [
            "taskset", "-c", last_cpu, "wrk", "-t1", f"-c{connections}", f"-d{duration_s}s",
            "-s", str(ROOT / "bench" / "wrk_route.lua"), f"http://127.0.0.1:{target}",
            "--", path, str(body_file), kind,
        ],
        capture_output=True, text=True, check=True, timeout=duration_s + 60,
    )  # fmt: skip
    used = cpu_seconds(master) - before
    nginx_used = cpu_seconds(nginx.proc.pid) - nginx_before if nginx is not None else 0.0
    calls, instances = _batches(port)
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    rate = summary["requests"] / summary["seconds"]
    bad = summary["errors"] + summary["status_errors"]
    cpu_us = used / max(summary["requests"], 1) * 1e6
    p50_ms = summary["p50_us"] / 1000
    batch = (instances - instances_before) / max(calls - calls_before, 1)
    in_front = f" (+nginx {nginx_used / max(summary['requests'], 1) * 1e6:4.0f})" if nginx else ""
    return (
        f"{rate:7.0f} req/s p50 {p50_ms:6.2f} ms cpu {cpu_us:5.0f} us/req{in_front} "
        f"batch {batch:5.1f} err {bad}"
    )


def front(port: int) -> Any:
    """deploy/nginx in front of the server on ``port`` (its own session), started."""
    from tests.deploy.nginx import NginxServer  # the deploy tests' renderer

    upstream = f"127.0.0.1:{port}"
    nginx = NginxServer(
        Path(tempfile.mkdtemp(prefix="bench-protocols-nginx-")), stable=upstream,
        canary=upstream, stable_version="1", canary_version="2",
    )  # fmt: skip
    nginx.start()
    nginx.wait_ready()
    return nginx


def _batches(port: int) -> tuple[float, float]:
    """(predict calls, instances) so far, summed over the workers (/metrics)."""
    import requests

    return batch_totals(requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)


class _Drop(BaseHTTPRequestHandler):
    """An OTLP/HTTP collector that reads each export and drops it."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def _collector() -> str:
    """Start the dropping collector; its traces endpoint."""
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _Drop)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_port}/v1/traces"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="another tree to compare")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--duration", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--traced", action="store_true", help="also this service traced")
    parser.add_argument("--nginx", action="store_true", help="every server behind deploy/nginx")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    trees: list[tuple[str, Path, dict[str, str]]] = [
        ("service", ROOT, {}),
        ("before", args.before, {}),
    ]
    if args.traced:
        endpoint = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": _collector()}
        trees.insert(1, ("traced", ROOT, endpoint))
        every = {**endpoint, "OTEL_TRACES_SAMPLER": "parentbased_always_on"}
        trees.insert(2, ("all", ROOT, every))
    where = "behind deploy/nginx" if args.nginx else "direct"
    print(
        f"CPU: {cpu_model()} ({len(os.sched_getaffinity(0))} usable); 2 workers each, "
        f"{where}, {args.connections} keep-alive connections, {args.duration} s a route"
    )
    for round_ in range(1, args.rounds + 1):
        turn = round_ % len(trees)
        for name, root, extra_env in trees[turn:] + trees[:turn]:
            proc, port = serve(root, extra_env)
            nginx = front(port) if args.nginx else None
            routes = list(ROUTES)
            routes = routes[round_ % len(routes) :] + routes[: round_ % len(routes)]
            try:
                for route in routes:  # the first route after a start changes too
                    line = load(port, route, args.connections, args.duration, proc.pid, nginx=nginx)
                    print(f"round {round_} {name:>8} {route:>12}: {line}", flush=True)
            finally:
                if nginx is not None:
                    nginx.stop()
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(30)


if __name__ == "__main__":
    main()
