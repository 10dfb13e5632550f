"""HTTP load as users deploy: this service vs the naive server vs the echo ceiling, taking turns.

    python bench/http_load.py                   # full run: light and heavy, ~25 minutes on 2 cores
    python bench/http_load.py --short           # light, 1 and 64 keep-alive, 3 rounds: ~4 min
    python bench/http_load.py --nginx           # every server behind deploy/nginx (1 worker)
    python bench/http_load.py --same-session    # servers in the bench's session (for comparison)
    python bench/http_load.py --variant log-off:SERVING_ACCESS_LOG=false --servers service naive

Servers (2 workers each, on 127.0.0.1):
  service        gunicorn wsgi:app -c gunicorn.conf.py, default settings (access log on)
  naive          bench/naive_app.py under sync workers: predict once per request, one row
  naive-gthread  the same app under gthread workers (16 threads)
  echo           bench/echo_app.py on the service's Gunicorn config: parse JSON, constant answer
plus one service per ``--variant NAME:SERVING_X=Y,SERVING_Z=W`` (tuned settings; also
``--variant before:BENCH_ROOT=/path/to/worktree`` to run another commit's code, its
``gunicorn.conf.py`` included, beside this one, taking turns: Gunicorn puts its working
directory first on ``sys.path``, so a ``PYTHONPATH`` alone ran this commit's code).

**As deployed.** A service runs in its own session (systemd, a container), beside nginx and
other processes on its CPUs. So by default every server, and nginx with ``--nginx``, is
started with ``setsid``: its own session, hence its own CFS autogroup where
``kernel.sched_autogroup_enabled=1``, competing with wrk (pinned to the last CPU) for the
CPUs as a service competes with its neighbours. ``--same-session`` starts them in the
bench's session instead, the condition the bench used to measure (see bench/README.md).

**Rounds taking turns.** Each of ``--rounds`` (3 by default) starts every server afresh,
one after another (each round starting with the next one: the first server of a round
measured worse at one connection, 3 rounds of 3), runs all its cells, and stops it, so a
server that falls into a slow mode on start-up shows it in that round and a burst of load
elsewhere hits the servers alike. Every round is printed and kept: its requests/s and
latency (wrk, one thread), the mean batch (the service's /metrics) and the **server's CPU
per request** (utime + stime of the server's master and workers from /proc, divided by the
requests answered; nginx's CPU apart). Summaries give min/median/max over the rounds and
the ratio to the naive server round by round; never the best run.

The 1,000-instance exercise (one per request vs 8 x 125) runs once, in the first round,
when not --short. Tables go to stdout; a JSON of every run to bench/results/http_load.json.
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

from bench.host import cpu_model  # noqa: E402
from bench.models import RESULTS, batch_totals, model_path, real_rows, write_bodies  # noqa: E402

GUNICORN = Path(sys.executable).parent / "gunicorn"
WORKERS = 2
THREADS = 64  # the service's default: 2 x max_batch_size
NAIVE_GTHREAD_THREADS = 16
TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def cpu_seconds(root_pid: int) -> float:
    """utime + stime, in seconds, of ``root_pid`` and its live children (Gunicorn's master
    and workers; threads are counted in their process's figures)."""
    pids = [root_pid]
    try:
        children = Path(f"/proc/{root_pid}/task/{root_pid}/children").read_text().split()
        pids += [int(pid) for pid in children]
    except OSError:
        pass
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited between the two reads
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total * TICK_S


class Server:
    """One Gunicorn server of the comparison (and its nginx with ``--nginx``)."""

    def __init__(
        self,
        kind: str,
        model: str,
        extra_env: dict[str, str] | None = None,
        name: str = "",
        *,
        own_session: bool = True,
        nginx: bool = False,
    ) -> None:
        self.kind, self.model, self.name = kind, model, name or kind
        self.port = free_port()
        self.metrics_dir = Path(tempfile.mkdtemp(prefix=f"bench-{kind}-"))
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        root = ROOT
        path = str(model_path(model))
        bind = f"127.0.0.1:{self.port}"
        common = ["--no-control-socket"]
        # The other servers read no config: Gunicorn reads ./gunicorn.conf.py by default,
        # and the service's hooks (its pinning, access log, model sharing) ran in the naive
        # and echo servers' workers too until its own worker class refused them.
        plain = ["-c", "/dev/null"]
        if kind == "service":
            env.update(
                SERVING_MODEL_PATH=path,
                SERVING_BIND=bind,
                SERVING_WORKERS=str(WORKERS),
                SERVING_METRICS_DIR=str(self.metrics_dir),
                SERVING_LOG_LEVEL="info",
            )
            env.update(extra_env or {})
            if "BENCH_ROOT" in env:  # another commit's tree: its config, its code
                root = Path(env.pop("BENCH_ROOT"))
                env["PYTHONPATH"] = str(root)
            cmd = [str(GUNICORN), "wsgi:app", "-c", "gunicorn.conf.py", *common]
        elif kind in ("naive", "naive-gthread"):
            env["NAIVE_MODEL_PATH"] = path
            worker = ["-k", "sync"]
            if kind == "naive-gthread":
                worker = ["-k", "gthread", "--threads", str(NAIVE_GTHREAD_THREADS)]
            cmd = [str(GUNICORN), "bench.naive_app:app", *plain, *worker, "-w", str(WORKERS)]
            cmd += ["-b", bind, *common]
        else:
            cmd = [
                str(GUNICORN),
                "bench.echo_app:app",
                *plain,
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
        session = {"start_new_session": True} if own_session else {"process_group": 0}
        self.proc = subprocess.Popen(
            cmd, cwd=root, env=env, stdout=self.log, stderr=subprocess.STDOUT, **session
        )
        self.nginx: Any = None
        self._wait_ready()
        if kind != "service":
            self._pin_like_the_service()
        self.target_port = self.port
        if nginx:
            from tests.deploy.nginx import NginxServer  # the deploy tests' renderer

            upstream = f"127.0.0.1:{self.port}"
            self.nginx = NginxServer(
                Path(tempfile.mkdtemp(prefix=f"bench-nginx-{kind}-")),
                stable=upstream,
                canary=upstream,
                stable_version="1",
                canary_version="2",
            )
            self.nginx.start()  # its own session, as a separate service
            self.nginx.wait_ready()
            self.target_port = self.nginx.port

    def _pin_like_the_service(self) -> None:
        """With SERVING_CPU_AFFINITY=auto the service pins worker k to CPU k: pin the other
        servers' workers alike, so the comparison is on the same CPU layout. Nothing to do
        when the service does not pin (SERVING_CPU_AFFINITY=none)."""
        if os.environ.get("SERVING_CPU_AFFINITY", "adaptive") != "auto":
            return
        cpus = sorted(os.sched_getaffinity(0))
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        for slot, pid in enumerate(sorted(int(p) for p in children.split())):
            for task in Path(f"/proc/{pid}/task").iterdir():
                os.sched_setaffinity(int(task.name), {cpus[slot % len(cpus)]})

    def _wait_ready(self, timeout_s: float = 90) -> None:
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

    def stop(self) -> None:
        if self.nginx is not None:
            self.nginx.stop()
            shutil.rmtree(self.nginx.directory, ignore_errors=True)
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.log.close()
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
    """One wrk run, one thread pinned to the last CPU; the Lua script's JSON summary."""
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
    """One wrk run on ``server``: wrk's figures, the mean batch and the CPU per request."""
    calls0, rows0 = server.batch_stats()
    cpu0 = cpu_seconds(server.proc.pid)
    nginx0 = cpu_seconds(server.nginx.proc.pid) if server.nginx else 0.0
    result = wrk(server.target_port, connections, args.duration, bodies, mode == "close")
    cpu1 = cpu_seconds(server.proc.pid)
    nginx1 = cpu_seconds(server.nginx.proc.pid) if server.nginx else 0.0
    calls1, rows1 = server.batch_stats()
    result["mean_batch"] = (rows1 - rows0) / (calls1 - calls0) if calls1 > calls0 else None
    answered = max(result["requests"], 1)
    result["cpu_us_per_request"] = (cpu1 - cpu0) / answered * 1e6
    result["nginx_cpu_us_per_request"] = (
        (nginx1 - nginx0) / answered * 1e6 if server.nginx else None
    )
    return result


def spread(values: list[float], digits: int = 0) -> str:
    """``min / median / max`` of ``values``."""
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"{low:.{digits}f} / {mid:.{digits}f} / {high:.{digits}f}"


def exercise(server: Server) -> dict[str, float]:
    """1,000 instances: one per request (sequential) vs 8 requests of 125 (sequential)."""
    rows = real_rows()
    instances = [rows[i % len(rows)].tolist() for i in range(1000)]
    conn = http.client.HTTPConnection("127.0.0.1", server.target_port, timeout=60)
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
    """CPU model, cores, the BLAS kernel numpy uses here (threadpoolctl), autogroup and the
    load average: ratios from one run mean something only next to their machine."""
    from threadpoolctl import threadpool_info  # numpy is loaded: bench.models imports it

    cpu = cpu_model()
    blas = ", ".join(
        f"{i.get('internal_api')} {i.get('version')} ({i.get('architecture', '?')}, "
        f"{i.get('num_threads')} threads)"
        for i in threadpool_info()
        if i.get("user_api") == "blas"
    )
    try:
        autogroup = Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip()
    except OSError:
        autogroup = "?"
    return (
        f"{cpu}, {len(os.sched_getaffinity(0))} CPUs, BLAS {blas or 'none found'}, "
        f"sched_autogroup_enabled={autogroup}; load average {os.getloadavg()[0]:.1f} {when}"
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=3, help="rounds taking turns (>= 3)")
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
    parser.add_argument("--nginx", action="store_true", help="every server behind deploy/nginx")
    parser.add_argument(
        "--same-session",
        action="store_true",
        help="start servers in the bench's session (one CFS autogroup with wrk), for comparison",
    )
    parser.add_argument(
        "--short",
        action="store_true",
        help="bounded quick run: light model, 1 and 64 keep-alive connections, 3 s a run",
    )
    args = parser.parse_args()
    if args.short:
        args.duration, args.connections = 3.0, [1, 64]
        args.modes, args.models = ["keepalive"], ["light"]
    return args


def main() -> None:
    args = parse_args()
    if not shutil.which("wrk"):
        raise SystemExit("wrk not found: apt-get install wrk")
    extra_env = dict(item.split("=", 1) for item in args.env)
    plan: list[tuple[str, str, str, dict[str, str]]] = []
    for model in args.models:
        plan += [(k, k, model, extra_env) for k in args.servers if k != "echo"]
        for spec in args.variant:
            name, _, settings = spec.partition(":")
            env = dict(item.split("=", 1) for item in settings.split(",") if item)
            plan.append(("service", name, model, {**extra_env, **env}))
    if "echo" in args.servers:
        plan.append(("echo", "echo", "light", {}))
    bodies = write_bodies(RESULTS / "bodies.txt")
    where = "behind nginx" if args.nginx else "direct"
    session = "the bench's session" if args.same_session else "its own session"
    print(f"machine: {machine()}\neach server in {session}, {where}", flush=True)

    runs: list[dict[str, Any]] = []
    exercises: dict[str, dict[str, float]] = {}
    for round_ in range(1, args.rounds + 1):
        # Each round starts with the next server, so no server always goes first (after
        # the start-up of the bench, or right after another server stopped).
        shift = (round_ - 1) % len(plan)
        for kind, name, model, env in plan[shift:] + plan[:shift]:
            server = Server(
                kind, model, env, name, own_session=not args.same_session, nginx=args.nginx
            )
            try:
                for mode in args.modes:
                    for connections in args.connections:
                        run = run_once(server, connections, mode, args, bodies)
                        run.update(
                            round=round_,
                            server=name,
                            model=model,
                            mode=mode,
                            connections=connections,
                        )
                        runs.append(run)
                        print_run(run)
                if round_ == 1 and kind != "echo" and not args.short:
                    exercises[f"{name}/{model}"] = exercise(server)
            finally:
                server.stop()

    print(f"\nmachine: {machine('at the end')}\neach server in {session}, {where}")
    print_summary(runs, ["service", *(v.partition(":")[0] for v in args.variant)])
    for key, ex in exercises.items():
        print(
            f"  1,000 instances on {key}: one per request {ex['one_per_request_s']:.2f} s, "
            f"8 x 125 {ex['eight_of_125_s']:.3f} s, speed-up {ex['speedup']:.1f}x"
        )
    RESULTS.mkdir(exist_ok=True)
    document = {
        "machine": machine("at the end"),
        "session": session,
        "where": where,
        "runs": runs,
        "exercise": exercises,
    }
    (RESULTS / "http_load.json").write_text(json.dumps(document, indent=1))


def print_run(run: dict[str, Any]) -> None:
    batch = f"{run['mean_batch']:.1f}" if run["mean_batch"] is not None else "-"
    nginx = run["nginx_cpu_us_per_request"]
    print(
        f"round {run['round']} {run['server']:>13} {run['model']:>5} {run['mode']:>9} "
        f"c={run['connections']:<3} {run['rps']:>7.0f} req/s  p50 {run['p50_us'] / 1000:6.2f} "
        f"p99 {run['p99_us'] / 1000:7.2f} ms  errors {run['errors']:<3} batch {batch:>5}  "
        f"cpu {run['cpu_us_per_request']:5.0f} us/req"
        + (f" (+nginx {nginx:.0f})" if nginx is not None else ""),
        flush=True,
    )


def print_summary(runs: list[dict[str, Any]], subjects: list[str]) -> None:
    """Per cell: min/median/max over the rounds; then each subject's ratio to the naive
    server round by round (same round, same cell), min/median/max."""
    cells: dict[tuple[str, str, str, int], list[dict[str, Any]]] = {}
    for run in runs:
        key = (run["server"], run["model"], run["mode"], run["connections"])
        cells.setdefault(key, []).append(run)
    print("\ncells, min / median / max over the rounds:")
    for (server, model, mode, c), cell in cells.items():
        batches = [r["mean_batch"] for r in cell if r["mean_batch"] is not None]
        print(
            f"  {server:>13} {model:>5} {mode:>9} c={c:<3} req/s {spread([r['rps'] for r in cell])}"
            f"  p50 ms {spread([r['p50_us'] / 1000 for r in cell], 2)}"
            f"  cpu us/req {spread([r['cpu_us_per_request'] for r in cell])}"
            + (
                f"  batch {min(batches):.1f}/{statistics.median(batches):.1f}/{max(batches):.1f}"
                if batches
                else ""
            )
            + f"  errors {sum(r['errors'] for r in cell)}"
        )
    print("\nratios to naive, round by round (min / median / max):")
    for (server, model, mode, c), cell in cells.items():
        naive = {r["round"]: r for r in cells.get(("naive", model, mode, c), [])}
        if server not in subjects or not naive:
            continue
        pairs = [(r, naive[r["round"]]) for r in cell if r["round"] in naive]
        for label, key in (("req/s", "rps"), ("p50", "p50_us"), ("cpu/req", "cpu_us_per_request")):
            values = [a[key] / b[key] for a, b in pairs]
            rounds = " ".join(f"{v:.2f}" for v in values)
            low, mid, high = min(values), statistics.median(values), max(values)
            print(
                f"  {server:>13} {model:>5} {mode:>9} c={c:<3} {label:>7}: {rounds}"
                f"  ({low:.2f} / {mid:.2f} / {high:.2f})"
            )


if __name__ == "__main__":
    main()
