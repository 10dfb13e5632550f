"""Soak: ~70 % of capacity for 10 minutes; RSS per worker, p99 drift and errors per minute.

    python bench/soak.py [--minutes 10] [--connections 8]

Starts the service (light model, 2 workers) and runs wrk one minute at a time at a fixed
number of keep-alive connections (8 gives ~65-70 % of the 64-connection throughput on the
2-core development machine; the first line prints both so the share is visible). After
each minute it prints requests/s, p99, errors and each worker's resident memory (VmRSS).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.http_load import Server, wrk  # noqa: E402
from bench.models import RESULTS, write_bodies  # noqa: E402


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def worker_pids(server: Server) -> list[int]:
    pid = server.proc.pid
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=10)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--model", default="light")
    args = parser.parse_args()
    bodies = write_bodies(RESULTS / "bodies.txt")
    server = Server("service", args.model)
    try:
        capacity = wrk(server.port, 64, 10, bodies, close=False)["rps"]
        print(
            f"capacity (64 connections, 10 s): {capacity:.0f} requests/s; soaking at "
            f"{args.connections} connections for {args.minutes} min",
            flush=True,
        )
        first: list[float] = []
        p99s = []
        errors = 0
        for minute in range(1, args.minutes + 1):
            result = wrk(server.port, args.connections, 60, bodies, close=False)
            rss = [rss_mib(pid) for pid in worker_pids(server)]
            first = first or rss
            p99s.append(result["p99_us"] / 1000)
            errors += result["errors"]
            print(
                f"min {minute:>2}: {result['rps']:6.0f} req/s ({result['rps'] / capacity:4.0%}) "
                f"p99 {p99s[-1]:6.2f} ms errors {result['errors']} "
                f"RSS MiB {' / '.join(f'{r:.1f}' for r in rss)}",
                flush=True,
            )
        print(
            f"RSS start {' / '.join(f'{r:.1f}' for r in first)} MiB, end "
            f"{' / '.join(f'{r:.1f}' for r in rss)} MiB; p99 first {p99s[0]:.2f} ms, last "
            f"{p99s[-1]:.2f} ms, max {max(p99s):.2f} ms; errors {errors}"
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
