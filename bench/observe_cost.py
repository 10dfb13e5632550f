"""The cost of payload logging and tracing, side by side in one run: requests/s of the
light (demo) model at 64 keep-alive connections with each switched on, beside off.

    python bench/observe_cost.py                       # 5 s per cell, 2 rounds
    python bench/observe_cost.py --duration 3 --rounds 1

Configurations (each ``gunicorn wsgi:app -c gunicorn.conf.py``, 2 workers, access log off
as in bench/http_load.py): ``off``; ``payload-file`` (SERVING_PAYLOAD_LOG=all to a
``file://`` JSON-lines sink in a temporary directory); ``payload-http`` (all, binary
CloudEvents to a receiver on loopback in this process that parses nothing and answers
202); ``tracing`` (OTLP/HTTP to a loopback receiver that answers 200, every request traced);
``tracing-1%`` (the same, ``OTEL_TRACES_SAMPLER=parentbased_traceidratio`` at 0.01).
Rounds repeat the configurations in order so a drift of the shared machine hits each.
Prints the CPU model, each cell's requests/s, p99 and payload records dropped, and each
configuration's median requests/s over ``off``'s.
The receivers share the machine's CPUs with the server: their cost is in the numbers.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.host import cpu_model  # noqa: E402
from bench.http_load import Server, request, wrk  # noqa: E402
from bench.models import RESULTS, write_bodies  # noqa: E402


class Receiver:
    """An HTTP endpoint on loopback that reads each POST and answers ``status``."""

    def __init__(self, status: int) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def configurations(tmp: Path, events: Receiver, otlp: Receiver) -> dict[str, dict[str, str]]:
    return {
        "off": {},
        "payload-file": {
            "SERVING_PAYLOAD_LOG": "all",
            "SERVING_PAYLOAD_LOG_URL": f"file://{tmp}/payloads.jsonl",
        },
        "payload-http": {"SERVING_PAYLOAD_LOG": "all", "SERVING_PAYLOAD_LOG_URL": events.url},
        "tracing": {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url, "OTEL_SERVICE_NAME": "bench"},
        "tracing-1%": {
            "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.url,
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.01",
        },
    }


def dropped(port: int) -> float:
    """payload_log_dropped_total summed over its reasons, from /metrics."""
    _, text = request(port, "GET", "/metrics")
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("payload_log_dropped_total")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per cell")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=64)
    args = parser.parse_args()
    bodies = write_bodies(RESULTS / "bodies-light.txt")
    tmp = Path(tempfile.mkdtemp(prefix="bench-observe-"))
    events, otlp = Receiver(202), Receiver(200)
    configs = configurations(tmp, events, otlp)
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    print(f"CPU: {cpu_model()} x{len(__import__('os').sched_getaffinity(0))}")
    for round_ in range(args.rounds):
        for name, env in configs.items():
            server = Server("service", "light", extra_env=env)
            try:
                result = wrk(server.port, args.connections, args.duration, bodies, close=False)
                lost = dropped(server.port)
            finally:
                server.stop()
            results[name].append(result)
            print(
                f"round {round_ + 1} {name:13s} {result['rps']:8.0f} req/s  "
                f"p99 {result['p99_us'] / 1000:7.1f} ms  errors {result['errors']}  "
                f"payload records dropped {lost:.0f}",
                flush=True,
            )
    base = statistics.median(r["rps"] for r in results["off"])
    print(f"\nmedian req/s at {args.connections} connections, ratio to off:")
    for name, runs in results.items():
        rps = statistics.median(r["rps"] for r in runs)
        print(f"  {name:13s} {rps:8.0f}  {rps / base:5.2f}")


if __name__ == "__main__":
    main()
