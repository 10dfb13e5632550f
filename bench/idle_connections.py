"""Probe latency beside idle connections: our worker vs Gunicorn's own gthread, taking turns.

    python bench/idle_connections.py              # 3 rounds, 0 / 64 / 1,000 idle: ~2 min
    python bench/idle_connections.py --idle 0 64 1000 4000 --rounds 5

Servers (one worker each, own session, on 127.0.0.1):
  service  gunicorn wsgi:app -c gunicorn.conf.py (serving.server.worker.ServingWorker,
           64 threads): probed on GET /livez
  gthread  bench/echo_app.py under Gunicorn's gthread worker, 64 threads (what this
           service ran on before its own worker): probed on POST /predict

For each number of idle connections (opened, sending nothing, and left open), the bench
times ``--probes`` probes, each on a new connection as a kubelet's is, with a 30 s limit;
a probe past it counts as 30 s. Rounds take turns (each round starts every server afresh,
the first server changing from round to round); every round is printed with the CPU model.
"""

from __future__ import annotations

import argparse
import http.client
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.host import cpu_model  # noqa: E402
from bench.http_load import free_port  # noqa: E402

GUNICORN = Path(sys.executable).parent / "gunicorn"
PROBE_LIMIT_S = 30.0


def start(kind: str, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if kind == "service":
        env.update(
            SERVING_BIND=f"127.0.0.1:{port}",
            SERVING_WORKERS="1",
            SERVING_ACCESS_LOG="false",
            SERVING_METRICS_DIR=tempfile.mkdtemp(prefix="bench-idle-"),
        )
        cmd = [str(GUNICORN), "wsgi:app", "-c", "gunicorn.conf.py"]
    else:
        cmd = [
            # -c /dev/null: not the service's gunicorn.conf.py, which Gunicorn reads from
            # its working directory by default (its hooks refuse another worker class)
            str(GUNICORN), "bench.echo_app:app", "-c", "/dev/null", "-k", "gthread",
            "--threads", "64",
            "-w", "1", "-b", f"127.0.0.1:{port}",
        ]  # fmt: skip
    proc = subprocess.Popen(
        [*cmd, "--no-control-socket"], cwd=ROOT, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if probe(kind, port, timeout_s=1) < 1:
                return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"{kind} did not start")


def probe(kind: str, port: int, timeout_s: float = PROBE_LIMIT_S) -> float:
    """Seconds to one answer on a new connection (``timeout_s`` when past it)."""
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        if kind == "service":
            connection.request("GET", "/livez")
        else:
            body = b'{"instances": [[1.0]]}'
            connection.request("POST", "/predict", body, {"Content-Type": "application/json"})
        connection.getresponse().read()
    except TimeoutError:
        return timeout_s
    finally:
        connection.close()
    return time.perf_counter() - started


def measure(kind: str, idle: int, probes: int) -> list[float]:
    port = free_port()
    proc = start(kind, port)
    try:
        sockets = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(idle)]
        time.sleep(0.5)  # accepted, and handed to threads where the worker does that
        try:
            return [probe(kind, port) for _ in range(probes)]
        finally:
            for s in sockets:
                s.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=int, nargs="+", default=[0, 64, 1000])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--probes", type=int, default=10)
    args = parser.parse_args()
    kinds = ["service", "gthread"]
    print(f"CPU: {cpu_model()} ({len(os.sched_getaffinity(0))} usable)")
    print("probe latency in ms on a new connection: p50 / max of", args.probes, "probes")
    print(f"{'round':>5} {'server':>8} " + " ".join(f"{n:>17} idle" for n in args.idle))
    for round_ in range(args.rounds):
        for kind in kinds[round_ % 2 :] + kinds[: round_ % 2]:
            cells = []
            for idle in args.idle:
                times = measure(kind, idle, args.probes)
                cells.append(f"{statistics.median(times) * 1e3:8.1f} / {max(times) * 1e3:8.1f}")
            print(f"{round_ + 1:>5} {kind:>8} " + " ".join(f"{c:>22}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
