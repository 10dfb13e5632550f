"""Overload: at about 3x capacity the service answers fast 503s and keeps accepted latency.

    python bench/overload.py [--seconds 10] [--max-queue-depth 32]

Starts the service (heavy model, 2 workers, SERVING_MAX_QUEUE_DEPTH per worker), drives it
with wrk at 64 connections (about its capacity: closed-loop clients keep ~32 requests in
flight per worker) and at 192 (3x), and meanwhile sends one request at a time from a
probe client to time accepted (200) and refused (503) answers separately, which wrk's
latency histogram cannot. Prints requests/s, the share of 503s, and the probe's p50/p99
for each status.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.http_load import Server, wrk  # noqa: E402
from bench.models import RESULTS, real_rows, write_bodies  # noqa: E402


def probe(port: int, stop: threading.Event, out: dict[int, list[float]]) -> None:
    body = json.dumps({"instances": [real_rows()[0].tolist()]})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    while not stop.is_set():
        started = time.perf_counter()
        conn.request("POST", "/predict", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        out.setdefault(response.status, []).append((time.perf_counter() - started) * 1000)
        time.sleep(0.01)
    conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--max-queue-depth", type=int, default=32)
    parser.add_argument("--model", default="heavy")
    args = parser.parse_args()
    bodies = write_bodies(RESULTS / "bodies.txt")
    env = {"SERVING_MAX_QUEUE_DEPTH": str(args.max_queue_depth)}
    server = Server("service", args.model, env)
    try:
        print(f"{args.model} model, SERVING_MAX_QUEUE_DEPTH={args.max_queue_depth} per worker")
        for connections, label in ((64, "~capacity"), (192, "3x")):
            latencies: dict[int, list[float]] = {}
            stop = threading.Event()
            thread = threading.Thread(target=probe, args=(server.port, stop, latencies))
            thread.start()
            result = wrk(server.port, connections, args.seconds, bodies, close=False)
            stop.set()
            thread.join(60)
            share = result["status_errors"] / max(result["requests"], 1)
            line = (
                f"c={connections:<4} ({label:>9}): {result['rps']:7.0f} answers/s, "
                f"{share:6.1%} 503 overloaded, other errors "
                f"{result['errors'] - result['status_errors']}"
            )
            for status, values in sorted(latencies.items()):
                p50, p99 = np.percentile(values, [50, 99])
                line += f" | probe {status}: n={len(values)} p50 {p50:.1f} ms p99 {p99:.1f} ms"
            print(line, flush=True)
    finally:
        server.stop()


if __name__ == "__main__":
    main()
