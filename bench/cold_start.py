"""Cold start: seconds from ``gunicorn wsgi:app -c gunicorn.conf.py`` to the first 200 from
/healthz (every worker loaded and warmed up its model), for each model and worker count.

    python bench/cold_start.py                          # demo joblib and ONNX, 1 and 2 workers
    python bench/cold_start.py --runs 3 --models joblib --workers 2

What a scale-from-zero or a new replica pays on top of scheduling and image pull
(docs/operations.md). Each run is a fresh server on 127.0.0.1; the file cache is warm
after the first run (a new pod's first start also reads the image from disk).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GUNICORN = Path(sys.executable).parent / "gunicorn"
DEMO = ROOT / "serving" / "demo" / "breast_cancer"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def cold_start_s(model: Path, workers: int, timeout_s: float = 120.0) -> float:
    """Seconds from spawning Gunicorn to the first 200 from /healthz (polled every 10 ms).

    :raises RuntimeError: when the server exits or is not ready within ``timeout_s``.
    """
    port = free_port()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "SERVING_MODEL_PATH": str(model),
        "SERVING_BIND": f"127.0.0.1:{port}",
        "SERVING_WORKERS": str(workers),
        "SERVING_METRICS_DIR": tempfile.mkdtemp(prefix="cold-start-"),
    }
    started = time.perf_counter()
    proc = subprocess.Popen(
        [str(GUNICORN), "wsgi:app", "-c", "gunicorn.conf.py"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        process_group=0,
    )
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited {proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                    if r.status == 200:
                        return time.perf_counter() - started
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.01)
        raise RuntimeError(f"not ready after {timeout_s} s")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--models", nargs="+", default=["joblib", "onnx"])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    print(f"{'model':8} {'workers':>7} {'median s':>9} {'min s':>7} {'max s':>7}")
    for suffix in args.models:
        for workers in args.workers:
            times = [
                cold_start_s(DEMO.with_suffix(f".{suffix}"), workers) for _ in range(args.runs)
            ]
            print(
                f"{suffix:8} {workers:>7} {statistics.median(times):>9.2f} "
                f"{min(times):>7.2f} {max(times):>7.2f}"
            )


if __name__ == "__main__":
    main()
