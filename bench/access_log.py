"""What the JSON access log costs: ``serving.observe.access_log`` vs the ``logging`` design
it replaced.

    python bench/access_log.py [--lines 20000] [--rounds 3]

Two ways to write the same line (the access record's fields, as ``serving.app`` makes them):

  logging       a ``logging`` record through a ``QueueHandler``, formatted and written by a
                ``QueueListener`` thread woken for every record (python-json-logger's
                orjson formatter): the service until this change
  AccessLog     ``serving.observe.access_log``: the fields put on a queue; a writer thread woken
                for the first line lingers 20 ms, then formats every queued line with
                orjson and writes them at once

Two loops: ``burst`` logs back to back (the caller's own cost, and the CPU of both threads
per line, measured until everything is written); ``paced`` is a request at a time, as one
keep-alive connection makes them: ~200 us of Python work, the log call, then ~300 us
waiting with the GIL released (the network), reporting the loop's time per request minus
the same loop without logging. Both write to a temporary file. Needs the ``bench`` extra
(python-json-logger).
"""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import queue
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pythonjsonlogger.orjson import OrjsonFormatter

from serving.observe.access_log import AccessLog

FIELDS = {
    "request_id": "0123456789abcdef0123456789abcdef",
    "method": "POST",
    "route": "/predict",
    "status": 200,
    "latency_ms": 1.234,
    "model": "breast_cancer",
    "model_version": "1",
    "instances": 1,
    "batch_size": 7,
}


class _AsIs(logging.handlers.QueueHandler):
    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record


def install(kind: str, out: Any) -> tuple[Callable[[], None], Callable[[], None]]:
    """(log one line, stop and write what is queued) for ``kind`` writing to ``out``."""
    if kind == "AccessLog":
        writer = AccessLog().start()
        return (lambda: writer.write(FIELDS)), writer.stop
    if kind == "none":
        return (lambda: None), (lambda: None)
    logger = logging.getLogger("bench.access")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        OrjsonFormatter(
            "{asctime}{levelname}{message}",
            style="{",
            rename_fields={"asctime": "time", "levelname": "level"},
        )
    )
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    logger.handlers = [_AsIs(records)]
    listener = logging.handlers.QueueListener(records, handler)
    listener.start()
    return (lambda: logger.info("request", extra=FIELDS)), listener.stop


def burst(kind: str, lines: int) -> tuple[float, float]:
    """(us per line on the caller, us CPU per line in all)."""
    with tempfile.TemporaryFile("w") as out:
        sys.stdout = out
        try:
            write, stop = install(kind, out)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for _ in range(lines):
                write()
            caller = time.perf_counter() - wall0
            stop()  # waits until every queued line is written
            cpu = time.process_time() - cpu0
        finally:
            sys.stdout = sys.__stdout__
    return caller / lines * 1e6, cpu / lines * 1e6


def paced(kind: str, requests: int) -> float:
    """Seconds per paced request (work, log call, GIL-free wait)."""
    network = threading.Lock()
    network.acquire()
    with tempfile.TemporaryFile("w") as out:
        sys.stdout = out
        try:
            write, stop = install(kind, out)
            started = time.perf_counter()
            for _ in range(requests):
                sum(range(2000))  # ~200 us of Python on the slow CPUs here
                write()
                network.acquire(timeout=0.0003)
            elapsed = time.perf_counter() - started
            stop()
        finally:
            sys.stdout = sys.__stdout__
    return elapsed / requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    kinds = ("logging", "AccessLog")
    bursts: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    paces: dict[str, list[float]] = {k: [] for k in ("none", *kinds)}
    for _ in range(args.rounds):  # taking turns, so drift in the host's load hits all alike
        for kind in kinds:
            bursts[kind].append(burst(kind, args.lines))
        for kind, values in paces.items():
            values.append(paced(kind, args.lines // 10))
    print("burst (back to back), medians:")
    for kind, values in bursts.items():
        caller = statistics.median(v[0] for v in values)
        cpu = statistics.median(v[1] for v in values)
        print(f"  {kind:>10}: {caller:6.1f} us per line on the caller, {cpu:6.1f} us CPU in all")
    base = statistics.median(paces["none"])
    print(f"paced (one request at a time, {base * 1e6:.0f} us per request without a log):")
    for kind in kinds:
        extra = statistics.median(paces[kind]) - base
        print(f"  {kind:>10}: +{extra * 1e6:6.1f} us per request ({extra / base:+.1%})")


if __name__ == "__main__":
    main()
