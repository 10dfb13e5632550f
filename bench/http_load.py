"""HTTP load, side by side in one run: this service vs the naive server vs the echo ceiling.

    python bench/http_load.py                   # full run: ~15 minutes on 2 cores
    python bench/http_load.py --short           # light model, 1 and 64 keep-alive: ~2 minutes
    python bench/http_load.py --variant log-off:SERVING_ACCESS_LOG=false --servers service
    python bench/http_load.py --interleave ...  # servers take turns run by run (noisy host)

Starts, one after another on 127.0.0.1 (2 workers each):
  service        gunicorn wsgi:app -c gunicorn.conf.py, default settings (access log on)
  naive          bench/naive_app.py under sync workers: predict once per request, one row
  naive-gthread  the same app under gthread workers (16 threads): the floor for any server
                 that batches inside a gthread worker
  echo           bench/echo_app.py on the service's Gunicorn config: parse JSON, constant answer
plus one service per ``--variant NAME:SERVING_X=Y,SERVING_Z=W`` (tuned settings),
for the "light" (demo LogisticRegression) and "heavy" (300-tree forest) models, and drives
each with wrk (Debian's package, one thread pinned to CPU 1) at 1, 8 and 64 connections,
keep-alive and new-connection-per-request, single-instance bodies of the real rows. Each
cell runs --repeats times; tables show medians. For the service it also reads the mean
batch size and the share of requests each worker answered from /metrics.

Then the guide's exercise: 1,000 instances sent one per request vs 8 requests of 125.
Tables go to stdout, PNG plots and a JSON of every run to bench/results/.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.models import RESULTS, batch_totals, model_path, real_rows, write_bodies  # noqa: E402

GUNICORN = Path(sys.executable).parent / "gunicorn"
WORKERS = 2
THREADS = 64  # the service's default: 2 x max_batch_size
NAIVE_GTHREAD_THREADS = 16


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Server:
    """One Gunicorn server of the comparison, started and stopped by the bench."""

    def __init__(
        self, kind: str, model: str, extra_env: dict[str, str] | None = None, name: str = ""
    ) -> None:
        self.kind, self.model, self.name = kind, model, name or kind
        self.port = free_port()
        self.metrics_dir = Path(tempfile.mkdtemp(prefix=f"bench-{kind}-"))
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        path = str(model_path(model))
        bind = f"127.0.0.1:{self.port}"
        common = ["--no-control-socket"]
        if kind == "service":
            env.update(
                SERVING_MODEL_PATH=path,
                SERVING_BIND=bind,
                SERVING_WORKERS=str(WORKERS),
                SERVING_METRICS_DIR=str(self.metrics_dir),
                SERVING_LOG_LEVEL="info",
            )
            env.update(extra_env or {})
            cmd = [str(GUNICORN), "wsgi:app", "-c", "gunicorn.conf.py", *common]
        elif kind in ("naive", "naive-gthread"):
            env["NAIVE_MODEL_PATH"] = path
            worker = ["-k", "sync"]
            if kind == "naive-gthread":
                worker = ["-k", "gthread", "--threads", str(NAIVE_GTHREAD_THREADS)]
            cmd = [str(GUNICORN), "bench.naive_app:app", *worker, "-w", str(WORKERS), "-b", bind]
            cmd += common
        else:
            cmd = [
                str(GUNICORN),
                "bench.echo_app:app",
                "-k",
                "gthread",
                "-w",
                str(WORKERS),
                "--threads",
                str(THREADS),
                "-b",
                bind,
                *common,
            ]
        RESULTS.mkdir(exist_ok=True)
        self.log_path = RESULTS / f"{self.name}-{model}.log"
        self.log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            process_group=0,  # same session as wrk: one CFS autogroup (see bench/README.md)
        )
        self._wait_ready()
        if kind != "service":
            self._pin_like_the_service()

    def _pin_like_the_service(self) -> None:
        """Pin worker k (all its threads) to CPU k, as SERVING_CPU_AFFINITY=auto does for the
        service, so the comparison is on the same CPU layout."""
        cpus = sorted(os.sched_getaffinity(0))
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        for slot, pid in enumerate(sorted(int(p) for p in children.split())):
            for task in Path(f"/proc/{pid}/task").iterdir():
                os.sched_setaffinity(int(task.name), {cpus[slot % len(cpus)]})

    def _wait_ready(self, timeout_s: float = 60) -> None:
        body = json.dumps({"instances": [real_rows()[0].tolist()]})
        deadline = time.monotonic() + timeout_s
        ok = 0
        while self.kind == "service" and time.monotonic() < deadline:  # every worker loaded
            if self.log_path.read_text().count("ready to serve") >= WORKERS:
                break
            time.sleep(0.1)
        while time.monotonic() < deadline and ok < 20:  # 20 answers: both workers are up
            if self.proc.poll() is not None:
                break
            try:
                status, _ = request(self.port, "POST", "/predict", body)
                ok = ok + 1 if status == 200 else 0
            except OSError:
                time.sleep(0.1)
        if ok < 20:
            raise SystemExit(f"{self.kind} did not start:\n{self.log_path.read_text()}")

    def batch_stats(self) -> tuple[float, float]:
        """(predict calls, instances) so far, from /metrics; zeros for servers without it."""
        if self.kind != "service":
            return 0.0, 0.0
        _, text = request(self.port, "GET", "/metrics")
        return batch_totals(text)

    def per_worker_requests(self) -> list[float]:
        """Requests each live worker answered so far, from its own prometheus-client file."""
        if self.kind != "service":
            return []
        from prometheus_client import CollectorRegistry
        from prometheus_client.multiprocess import MultiProcessCollector

        counts = []
        for path in sorted(self.metrics_dir.glob("counter_*.db")):
            alone = Path(tempfile.mkdtemp())
            shutil.copy(path, alone / path.name)
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=str(alone))
            total = sum(
                s.value
                for m in registry.collect()
                if m.name == "http_requests"
                for s in m.samples
                if s.name == "http_requests_total"
            )
            counts.append(total)
            shutil.rmtree(alone)
        return counts

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        shutil.rmtree(self.metrics_dir, ignore_errors=True)


def request(port: int, method: str, path: str, body: str | None = None) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {"Content-Type": "application/json"} if body else {}
        conn.request(method, path, body, headers)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def wrk(
    port: int, connections: int, duration_s: float, bodies: Path, close: bool
) -> dict[str, Any]:
    """One wrk run, one thread pinned to CPU 1; the Lua script's JSON summary."""
    cpus = os.cpu_count() or 1
    pin = ["taskset", "-c", str(cpus - 1)] if shutil.which("taskset") and cpus > 1 else []
    cmd = [
        *pin,
        "wrk",
        "-t1",
        f"-c{connections}",
        f"-d{max(1, round(duration_s))}s",
        "--timeout",
        "10s",
        "-s",
        str(ROOT / "bench" / "wrk_predict.lua"),
        f"http://127.0.0.1:{port}",
        "--",
        str(bodies),
        "close" if close else "keepalive",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + 60, check=True)
    summary: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    summary["rps"] = summary["requests"] / summary["seconds"]
    summary["errors"] = sum(
        summary[k]
        for k in ("connect_errors", "read_errors", "write_errors", "status_errors", "timeouts")
    )
    return summary


def run_once(
    server: Server, connections: int, mode: str, args: argparse.Namespace, bodies: Path
) -> dict[str, Any]:
    """One wrk run on ``server``, with the mean batch size and each worker's share."""
    calls0, rows0 = server.batch_stats()
    per_worker0 = server.per_worker_requests()
    result = wrk(server.port, connections, args.duration, bodies, mode == "close")
    calls1, rows1 = server.batch_stats()
    per_worker1 = server.per_worker_requests()
    result["mean_batch"] = (rows1 - rows0) / (calls1 - calls0) if calls1 > calls0 else None
    served = [b - a for a, b in zip(per_worker0, per_worker1, strict=False)]
    result["worker_share"] = [round(s / sum(served), 2) for s in served] if sum(served) else []
    return result


def summarize(
    server: Server, connections: int, mode: str, runs: list[dict[str, Any]]
) -> dict[str, Any]:
    """A cell: the median of its runs."""
    median = {
        key: statistics.median(r[key] for r in runs)
        for key in ("rps", "p50_us", "p95_us", "p99_us", "errors")
    }
    batches = [r["mean_batch"] for r in runs if r["mean_batch"] is not None]
    median["mean_batch"] = statistics.median(batches) if batches else None
    median["worker_share"] = runs[len(runs) // 2]["worker_share"]
    median["errors_total"] = sum(r["errors"] for r in runs)
    return {
        "server": server.name,
        "model": server.model,
        "connections": connections,
        "mode": mode,
        "median": median,
        "runs": runs,
    }


def run_cell(
    server: Server, connections: int, mode: str, args: argparse.Namespace, bodies: Path
) -> dict[str, Any]:
    runs = [run_once(server, connections, mode, args, bodies) for _ in range(args.repeats)]
    return summarize(server, connections, mode, runs)


def run_interleaved(
    plan: list[tuple[str, str, str, dict[str, str]]], args: argparse.Namespace, bodies: Path
) -> list[dict[str, Any]]:
    """Every server of ``plan`` started at once; each repeat of each cell runs on all of
    them in turn, so a burst of load from elsewhere on the host hits every server alike."""
    cells: list[dict[str, Any]] = []
    servers: list[Server] = []
    try:
        for kind, name, model, env in plan:
            servers.append(Server(kind, model, env, name))
        for mode in args.modes:
            for connections in args.connections:
                runs: dict[int, list[dict[str, Any]]] = {i: [] for i in range(len(servers))}
                for _ in range(args.repeats):
                    for i, server in enumerate(servers):
                        runs[i].append(run_once(server, connections, mode, args, bodies))
                for i, server in enumerate(servers):
                    cells.append(summarize(server, connections, mode, runs[i]))
                    print_row(cells[-1])
    finally:
        for server in servers:
            server.stop()
    return cells


def exercise(server: Server) -> dict[str, float]:
    """1,000 instances: one per request (sequential) vs 8 requests of 125 (sequential)."""
    rows = real_rows()
    instances = [rows[i % len(rows)].tolist() for i in range(1000)]
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    headers = {"Content-Type": "application/json"}

    def send(chunk: list[list[float]]) -> None:
        conn.request("POST", "/predict", json.dumps({"instances": chunk}), headers)
        response = conn.getresponse()
        response.read()
        assert response.status == 200, response.status

    started = time.perf_counter()
    for instance in instances:
        send([instance])
    one_by_one = time.perf_counter() - started
    started = time.perf_counter()
    for k in range(8):
        send(instances[k * 125 : (k + 1) * 125])
    chunked = time.perf_counter() - started
    conn.close()
    return {
        "one_per_request_s": one_by_one,
        "eight_of_125_s": chunked,
        "speedup": one_by_one / chunked,
    }


def machine(when: str = "at start") -> str:
    """CPU model, cores and the BLAS kernel numpy uses here (threadpoolctl): ratios from one
    run mean something only next to the machine they were measured on."""
    from threadpoolctl import threadpool_info  # numpy is loaded: bench.models imports it

    cpu = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    blas = ", ".join(
        f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture', '?')}, "
        f"{i.get('num_threads')} threads)"
        for i in threadpool_info()
        if i.get("user_api") == "blas"
    )
    load = os.getloadavg()[0]
    return (
        f"{cpu}, {len(os.sched_getaffinity(0))} CPUs, BLAS {blas or 'none found'}; "
        f"load average {load:.1f} {when}"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--modes", nargs="+", default=["keepalive", "close"])
    parser.add_argument("--models", nargs="+", default=["light", "heavy"])
    parser.add_argument(
        "--servers", nargs="+", default=["service", "naive", "naive-gthread", "echo"]
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME:SERVING_X=Y,...",
        help="one more service with these settings (repeatable), e.g. tuned settings",
    )
    parser.add_argument("--env", nargs="*", default=[], help="extra SERVING_X=Y for every service")
    parser.add_argument(
        "--short",
        action="store_true",
        help="bounded quick run: light model, 1 and 64 keep-alive connections, 2 s, 1 repeat",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="start every server at once and take turns run by run (for a noisy host); "
        "skips the 1,000-instance exercise",
    )
    args = parser.parse_args()
    if args.short:
        args.duration, args.repeats, args.connections = 2.0, 1, [1, 64]
        args.modes, args.models = ["keepalive"], ["light"]
    return args


def main() -> None:
    args = parse_args()
    if not shutil.which("wrk"):
        raise SystemExit("wrk not found: apt-get install wrk")
    extra_env = dict(item.split("=", 1) for item in args.env)
    variants: list[tuple[str, dict[str, str]]] = []
    for spec in args.variant:
        name, _, settings = spec.partition(":")
        env = dict(item.split("=", 1) for item in settings.split(",") if item)
        variants.append((name, {**extra_env, **env}))
    bodies = write_bodies(RESULTS / "bodies.txt")
    print(f"machine: {machine()}", flush=True)

    cells: list[dict[str, Any]] = []
    exercises: dict[str, dict[str, float]] = {}
    plan: list[tuple[str, str, str, dict[str, str]]] = []
    for model in args.models:
        plan += [(k, k, model, extra_env) for k in args.servers if k != "echo"]
        plan += [("service", name, model, env) for name, env in variants]
    if "echo" in args.servers:
        plan.append(("echo", "echo", "light", {}))
    if args.interleave:
        cells = run_interleaved(plan, args, bodies)
        plan = []
    for kind, name, model, env in plan:
        server = Server(kind, model, env, name)
        try:
            for mode in args.modes:
                for connections in args.connections:
                    cell = run_cell(server, connections, mode, args, bodies)
                    cells.append(cell)
                    print_row(cell)
            if kind != "echo" and not args.short:
                exercises[f"{name}/{model}"] = exercise(server)
        finally:
            server.stop()

    print(f"\nmachine: {machine('at the end')}")
    print_tables(cells, exercises, [name for name, _ in variants])
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "http_load.json").write_text(
        json.dumps(
            {"machine": machine("at the end"), "cells": cells, "exercise": exercises}, indent=1
        )
    )
    if not args.short:
        try:
            plot(cells, args)
        except ImportError:
            print("no plots: matplotlib is not installed (pip install -e '.[bench]')")


def print_row(cell: dict[str, Any]) -> None:
    m = cell["median"]
    batch = f"{m['mean_batch']:.1f}" if m["mean_batch"] is not None else "-"
    share = "/".join(f"{s:.2f}" for s in m["worker_share"]) or "-"
    print(
        f"{cell['server']:>13} {cell['model']:>6} {cell['mode']:>9} c={cell['connections']:<3} "
        f"{m['rps']:>8.0f} req/s  p50 {m['p50_us'] / 1000:7.2f}  p95 {m['p95_us'] / 1000:7.2f}  "
        f"p99 {m['p99_us'] / 1000:7.2f} ms  errors {m['errors_total']:<4} batch {batch:>5}  "
        f"workers {share}",
        flush=True,
    )


def find(
    cells: list[dict[str, Any]], server: str, model: str, c: int, mode: str
) -> dict[str, Any] | None:
    for cell in cells:
        if (cell["server"], cell["connections"], cell["mode"]) == (server, c, mode) and (
            server == "echo" or cell["model"] == model
        ):
            return cell["median"]  # type: ignore[no-any-return]
    return None


def print_tables(
    cells: list[dict[str, Any]], exercises: dict[str, dict[str, float]], variants: list[str]
) -> None:
    """Ratios of the cells measured in this run: the service (and each variant) over the
    naive servers and the echo ceiling. Latency ratios below 1 and throughput ratios above
    1 are the service's wins."""
    print("\nratios (medians of this run):")
    checks = [
        ("light, 1 conn: {s} / naive-gthread p50", "light", 1, "p50_us", "naive-gthread", "<= 1.1"),
        ("light, 1 conn: {s} / naive p50", "light", 1, "p50_us", "naive", "<= 1.3"),
        ("light, 8 conn: {s} / naive throughput", "light", 8, "rps", "naive", ""),
        ("light, 64 conn: {s} / echo throughput", "light", 64, "rps", "echo", ">= 0.7"),
        ("light, 64 conn: {s} / naive throughput", "light", 64, "rps", "naive", ">= 1.2"),
        ("heavy, 1 conn: {s} / naive p50", "heavy", 1, "p50_us", "naive", ""),
        ("heavy, 64 conn: {s} / naive throughput", "heavy", 64, "rps", "naive", ">= 10"),
        ("light, 1 conn: naive-gthread / naive p50", "light", 1, "p50_us", "naive", ""),
    ]
    for mode in ("keepalive", "close"):
        for label, model, c, key, other, target in checks:
            subjects = ["service", *variants] if "{s}" in label else ["naive-gthread"]
            for subject in subjects:
                ours, theirs = (
                    find(cells, subject, model, c, mode),
                    find(cells, other, model, c, mode),
                )
                if ours and theirs and theirs[key]:
                    ratio = ours[key] / theirs[key]
                    text = label.format(s=subject)
                    print(f"  [{mode:>9}] {text}: {ratio:6.2f}  (target {target or '-'})")
    for name, ex in exercises.items():
        print(
            f"  1,000 instances on {name}: one per request {ex['one_per_request_s']:.2f} s, "
            f"8 x 125 {ex['eight_of_125_s']:.3f} s, speed-up {ex['speedup']:.1f}x"
        )


def plot(cells: list[dict[str, Any]], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for model in args.models:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        names = [*args.servers, *(v.partition(":")[0] for v in args.variant)]
        for server in names:
            for mode, style in (("keepalive", "o-"), ("close", "s:")):
                points = [(c, find(cells, server, model, c, mode)) for c in args.connections]
                points = [(c, m) for c, m in points if m]
                if not points:
                    continue
                xs = [c for c, _ in points]
                left.plot(xs, [m["rps"] for _, m in points], style, label=f"{server} ({mode})")
                right.plot(
                    xs, [m["p99_us"] / 1000 for _, m in points], style, label=f"{server} ({mode})"
                )
        for axis, label in ((left, "requests/s"), (right, "p99 latency (ms)")):
            axis.set_xscale("log", base=2)
            axis.set_xlabel("concurrent connections")
            axis.set_ylabel(label)
        right.set_yscale("log")
        left.legend(fontsize=7)
        fig.suptitle(
            f"{model} model, {WORKERS} workers, single-instance requests (median of {args.repeats})"
        )
        fig.tight_layout()
        fig.savefig(RESULTS / f"http_load_{model}.png", dpi=100)
        plt.close(fig)
    print(f"plots and http_load.json in {RESULTS}")


if __name__ == "__main__":
    main()
