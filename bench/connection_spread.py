"""How keep-alive connections spread over a server's workers, with and without Gunicorn's
``reuse_port``, taking turns.

    python bench/connection_spread.py             # 64 connections, 2 workers, 3 rounds: ~1 min

Each round starts the service (default settings, light model) once with Gunicorn's defaults
and once with ``--reuse-port``, runs wrk (pinned to the last CPU) with ``--connections``
keep-alive connections for ``--duration`` seconds, and reads mid-run how many of them each
worker holds (established sockets on the port among each worker's descriptors, from
/proc). Printed per round: requests/s and the split, largest share first.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.host import cpu_model  # noqa: E402
from bench.http_load import free_port, wrk  # noqa: E402
from bench.models import RESULTS, write_bodies  # noqa: E402

GUNICORN = Path(sys.executable).parent / "gunicorn"


def held_per_worker(master: int, port: int) -> list[int]:
    """Established client connections on ``port`` each worker of ``master`` holds."""
    established = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].rpartition(":")[2], 16) == port and fields[3] == "01":
            established.add(f"socket:[{fields[9]}]")
    children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
    counts = []
    for pid in children:
        fds = Path(f"/proc/{pid}/fd")
        counts.append(sum(os.readlink(fd) in established for fd in fds.iterdir()))
    return sorted(counts, reverse=True)


def one(reuse_port: bool, connections: int, duration_s: float, bodies: Path) -> str:
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SERVING_BIND": f"127.0.0.1:{port}",
        "SERVING_WORKERS": "2",
        "SERVING_ACCESS_LOG": "false",
        "SERVING_METRICS_DIR": tempfile.mkdtemp(prefix="bench-spread-"),
    }
    cmd = [str(GUNICORN), "wsgi:app", "-c", "gunicorn.conf.py", "--no-control-socket"]
    if reuse_port:
        cmd.append("--reuse-port")
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        import requests

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=1).ok:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.2)
        with ThreadPoolExecutor(1) as pool:
            load = pool.submit(wrk, port, connections, duration_s, bodies, False)
            time.sleep(duration_s / 2)
            split = held_per_worker(proc.pid, port)
            rate = load.result(duration_s + 60)["rps"]
        return f"{rate:>8.0f} req/s  connections per worker {split}"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    bodies = write_bodies(RESULTS / "bodies.txt")
    print(f"CPU: {cpu_model()} ({len(os.sched_getaffinity(0))} usable); 2 workers")
    for round_ in range(1, args.rounds + 1):
        order = [False, True] if round_ % 2 else [True, False]
        for reuse_port in order:
            line = one(reuse_port, args.connections, args.duration, bodies)
            name = "reuse_port" if reuse_port else "default"
            print(f"round {round_} {name:>10}: {line}", flush=True)


if __name__ == "__main__":
    main()
