"""One model shared by every worker (``SERVING_SHARE_MODEL=auto``) vs a copy per worker (``off``).

    python bench/share_memory.py [--workers 1 4 16] [--requests 800] [--kills 3]

For each setting and worker count: start the service on the ``big`` forest
(``bench/models.py``: 300 trees of unlimited depth), wait until every worker is ready, send
``--requests`` requests of 4 rows from 8 client threads, check every answer equals the
forest's ``predict_proba`` in-process, then sum the PSS (``/proc/<pid>/smaps_rollup``) of
the master and every worker (``--compile on``: with the forest compiled to ONNX Runtime in
each worker, as ``SERVING_COMPILE=on``). With 4 workers it also SIGKILLs a worker ``--kills`` times
and times each replacement from the kill to ``/healthz`` saying every worker is ready
again (its pid new), and sends one HUP, the model file unchanged (the master's busy time
is in its log: ``loaded N model(s) in the master in X s``), then sums the PSS again; with
``--deploys N``, N deploys of a new file follow (a copy renamed over the served file, then
HUP), the PSS summed after each once the old workers are gone. The
CPU model and the table go to stdout, the figures to ``bench/results/share_memory.json``.
Memory is what is measured: the requests/s column is only a same-run sanity check (16
workers on a 2-core machine are oversubscribed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.host import cpu_model  # noqa: E402
from bench.http_load import free_port  # noqa: E402
from bench.models import RESULTS, big_rows, model_path  # noqa: E402

GUNICORN = Path(sys.executable).parent / "gunicorn"


def pss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"no Pss for {pid}")


def children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


class Server:
    def __init__(self, share: str, workers: int, path: Path, compile: str = "auto") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.workers = workers
        self.log = RESULTS / f"share_memory-{share}-{workers}-compile-{compile}.log"
        self.compiled = compile == "on"  # the big forest is over what auto compiles
        env = {
            **os.environ,
            "SERVING_MODEL_PATH": str(path),
            "SERVING_WORKERS": str(workers),
            "SERVING_SHARE_MODEL": share,
            "SERVING_COMPILE": compile,
            "SERVING_BIND": f"127.0.0.1:{self.port}",
            "SERVING_ACCESS_LOG": "false",
            "SERVING_METRICS_DIR": tempfile.mkdtemp(),
            "SERVING_LOAD_TIMEOUT_S": "600",
            "SERVING_TIMEOUT_S": "600",
        }
        command = [str(GUNICORN), "wsgi:app", "-c", "gunicorn.conf.py", "--no-control-socket"]
        self._out = self.log.open("wb")
        self.proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=self._out,
                                     stderr=self._out, process_group=0)  # fmt: skip

    def all_ready(self, avoid: int | None = None) -> bool:
        pids = children(self.proc.pid)
        if len(pids) != self.workers or avoid in pids:
            return False
        try:
            body = requests.get(f"{self.url}/healthz", timeout=5).json()
        except (requests.RequestException, ValueError):
            return False
        return bool(body.get("workers") == {"ready": self.workers, "total": self.workers})

    def wait(self, timeout_s: float = 900, avoid: int | None = None, poll_s: float = 0.2) -> float:
        started = time.perf_counter()
        while not self.all_ready(avoid):
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited; see {self.log}")
            if time.perf_counter() - started > timeout_s:
                raise RuntimeError(f"not ready after {timeout_s} s; see {self.log}")
            time.sleep(poll_s)
        return time.perf_counter() - started

    def total_pss(self) -> tuple[float, list[float]]:
        workers = [pss_mib(pid) for pid in children(self.proc.pid)]
        return pss_mib(self.proc.pid) + sum(workers), workers

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._out.close()


def traffic(server: Server, rows: np.ndarray, expected: np.ndarray, n: int) -> float:
    """``n`` requests of 4 rows from 8 threads, each answer checked; requests/s."""
    session_rows = [(i * 4) % (len(rows) - 4) for i in range(n)]

    def one(start: int) -> None:
        body = {"instances": rows[start : start + 4].tolist()}
        answer = requests.post(f"{server.url}/predict", json=body, timeout=120).json()
        got, want = np.asarray(answer["probabilities"]), expected[start : start + 4]
        # compiled: within SERVING_COMPILE_TOLERANCE's default, as the server checked
        same = np.allclose(got, want, rtol=0, atol=1e-6) if server.compiled else (
            np.array_equal(got, want)
        )  # fmt: skip
        if not same:
            raise AssertionError(f"answer differs from in-process predict at row {start}")

    started = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, session_rows))
    return n / (time.perf_counter() - started)


def replacement_s(server: Server) -> float:
    """SIGKILL one worker; seconds until a new one makes every worker ready again."""
    victim = children(server.proc.pid)[0]
    started = time.perf_counter()
    os.kill(victim, signal.SIGKILL)
    server.wait(avoid=victim, poll_s=0.01)
    return time.perf_counter() - started


def compare(path: Path, rows: np.ndarray, expected: np.ndarray, workers: int, n: int) -> None:
    """Requests/s of ``auto`` and ``off`` side by side, rounds taking turns; medians."""
    servers = {share: Server(share, workers, path) for share in ("auto", "off")}
    try:
        for server in servers.values():
            server.wait()
        rates: dict[str, list[float]] = {share: [] for share in servers}
        for _ in range(6):
            for share, server in servers.items():
                rates[share].append(traffic(server, rows, expected, n))
    finally:
        for server in servers.values():
            server.stop()
    for share, got in rates.items():
        shown = ", ".join(f"{r:.1f}" for r in got)
        print(f"{share}: {workers} workers, median {np.median(got):.1f} requests/s ({shown})")


def deploy(server: Server, path: Path, served: Path, rows: np.ndarray, expected: Any) -> float:
    """A new file renamed over the served one (a new inode: the master loads it again),
    then HUP; the total PSS once every worker is new, answers right, and the old are gone."""
    before = set(children(server.proc.pid))
    fresh = served.with_name(f".{served.name}.new")
    shutil.copy(path, fresh)
    os.replace(fresh, served)
    server.proc.send_signal(signal.SIGHUP)
    while set(children(server.proc.pid)) & before or not server.all_ready():
        time.sleep(0.2)
    traffic(server, rows, expected, 80)
    time.sleep(2.0)
    return round(server.total_pss()[0], 1)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--requests", type=int, default=800)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument(
        "--deploys", type=int, default=0,
        help="with 4 workers, after the HUP: this many deploys of a new file (a copy renamed "
        "over the served one, then HUP), the total PSS after each",
    )  # fmt: skip
    parser.add_argument(
        "--compile", default="auto", choices=["auto", "on", "off"],
        help="SERVING_COMPILE of every server (on: the forest compiled to ONNX Runtime in "
        "each worker, whose own copy of the trees is then in every worker's PSS)",
    )  # fmt: skip
    parser.add_argument(
        "--compare", type=int, metavar="WORKERS",
        help="only requests/s: both settings' servers at once with WORKERS workers each, "
        "taking turns for 6 rounds of --requests (for a shared, noisy host)",
    )  # fmt: skip
    return parser.parse_args()


def main() -> None:
    args = parse_args()

    RESULTS.mkdir(exist_ok=True)
    path = model_path("big")
    forest = joblib.load(path)
    rows = big_rows()[:2000]
    expected = forest.predict_proba(rows)
    cpu = cpu_model()
    print(f"CPU: {cpu}, {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f}")
    print(f"model: {path.name}, {path.stat().st_size / 2**20:.0f} MiB file, 300 trees")
    if args.compare:
        compare(path, rows, expected, args.compare, args.requests)
        return
    results: list[dict[str, Any]] = []
    served = Path(tempfile.mkdtemp()) / path.name  # a copy a deploy may replace
    shutil.copy(path, served)
    for workers in args.workers:
        for share in ("auto", "off"):
            server = Server(share, workers, served, args.compile)
            try:
                start_s = server.wait()
                per_s = traffic(server, rows, expected, args.requests)
                total, each = server.total_pss()
                row: dict[str, Any] = {
                    "share": share, "compile": args.compile, "workers": workers,
                    "start_s": round(start_s, 2),
                    "total_pss_mib": round(total, 1),
                    "master_pss_mib": round(pss_mib(server.proc.pid), 1),
                    "worker_pss_mib": [round(w, 1) for w in each],
                    "requests_per_s": round(per_s, 1),
                }  # fmt: skip
                if workers == 4:
                    row["replacement_s"] = [
                        round(replacement_s(server), 3) for _ in range(args.kills)
                    ]
                    server.proc.send_signal(signal.SIGHUP)
                    loads = 2 if share == "auto" else 0  # at start-up and for the HUP
                    while len(re.findall("in the master in", server.log.read_text())) < loads:
                        time.sleep(0.1)
                    time.sleep(1.0)
                    server.wait()
                    busy = re.findall(r"in the master in ([\d.]+) s", server.log.read_text())
                    row["master_busy_s"] = [float(b) for b in busy]
                    traffic(server, rows, expected, 80)  # the reloaded workers answer right
                    time.sleep(2.0)  # the old workers gone
                    row["total_pss_after_hup_mib"] = round(server.total_pss()[0], 1)
                    row["total_pss_after_deploys_mib"] = [
                        deploy(server, path, served, rows, expected) for _ in range(args.deploys)
                    ]
            finally:
                server.stop()
            results.append(row)
            print(json.dumps(row), flush=True)

    one = {r["share"]: r["total_pss_mib"] for r in results if r["workers"] == 1}
    print("\n| setting | workers | total PSS MiB | x 1 worker | per worker MiB | req/s |"
          " replacement s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in results:
        ratio = r["total_pss_mib"] / one[r["share"]] if r["share"] in one else float("nan")
        per = np.median(r["worker_pss_mib"])
        repl = ", ".join(f"{s:.2f}" for s in r.get("replacement_s", [])) or "-"
        print(f"| {r['share']} | {r['workers']} | {r['total_pss_mib']:,.0f} | {ratio:.2f} |"
              f" {per:,.0f} | {r['requests_per_s']:.0f} | {repl} |")  # fmt: skip
    (RESULTS / "share_memory.json").write_text(json.dumps({"cpu": cpu, "runs": results}))


if __name__ == "__main__":
    main()
