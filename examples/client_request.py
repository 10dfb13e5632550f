"""Send the 569 real breast-cancer rows as single-instance requests from many threads at once.

Prints the accuracy against the true labels, client-side p50/p95/p99 latency, and the
batch-size histogram the server recorded meanwhile (read from /metrics before and after).

    gunicorn wsgi:app -c gunicorn.conf.py &          # serves the bundled demo
    python examples/client_request.py --concurrency 32

Standard library only (plus scikit-learn for the data set), keep-alive per thread.
"""

from __future__ import annotations

import argparse
import http.client
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from sklearn.datasets import load_breast_cancer


def batch_size_buckets(host: str, port: int) -> dict[float, float]:
    """Cumulative ``inference_batch_size`` bucket counts by upper bound, from /metrics."""
    conn = http.client.HTTPConnection(host, port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    buckets: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "inference_batch_size":
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    buckets[float(sample.labels["le"])] = sample.value
    return buckets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    url = urlsplit(args.url)
    host, port = url.hostname or "127.0.0.1", url.port or 80

    X, y = load_breast_cancer(return_X_y=True)
    local = threading.local()

    def predict(index: int) -> tuple[int, float]:
        if not hasattr(local, "conn"):
            local.conn = http.client.HTTPConnection(host, port, timeout=30)
        body = json.dumps({"instances": [X[index].tolist()]})
        started = time.perf_counter()
        local.conn.request("POST", "/predict", body, {"Content-Type": "application/json"})
        response = local.conn.getresponse()
        payload = json.loads(response.read())
        elapsed_ms = (time.perf_counter() - started) * 1000
        if response.status != 200:
            raise SystemExit(f"row {index}: HTTP {response.status}: {payload}")
        return payload["predictions"][0], elapsed_ms

    before = batch_size_buckets(host, port)
    started = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        results = list(pool.map(predict, range(len(X))))
    wall_s = time.perf_counter() - started
    after = batch_size_buckets(host, port)

    predictions = np.array([p for p, _ in results])
    latencies = np.array([ms for _, ms in results])
    p50, p95, p99 = np.percentile(latencies, [50, 95, 99])
    print(
        f"{len(X)} single-instance requests, {args.concurrency} concurrent clients, "
        f"{len(X) / wall_s:.0f} requests/s"
    )
    print(f"accuracy: {np.mean(predictions == y):.4f} against the true labels")
    print(f"latency ms: p50 {p50:.1f}  p95 {p95:.1f}  p99 {p99:.1f}")
    print("predict calls by batch size (this run):")
    previous = 0.0
    lower = 0.0
    for bound in sorted(after):
        count = after[bound] - before.get(bound, 0.0)
        in_bucket = count - previous
        previous = count
        if in_bucket and bound != float("inf"):
            print(f"  {lower + 1:>5.0f}..{bound:<5.0f} {in_bucket:6.0f}")
        lower = bound
    calls = previous
    if calls:
        print(
            f"mean batch size: {len(X) / calls:.1f} instances per predict call ({calls:.0f} calls)"
        )


if __name__ == "__main__":
    main()
