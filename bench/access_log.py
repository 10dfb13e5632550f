"""What the JSON access log costs the request thread: written in place vs queued.

    python bench/access_log.py [--lines 20000]

Times ``serving.access`` ``info`` calls with the access record's fields, as
``serving.app`` makes them, through three handlers:

  in place      python-json-logger formatting and a write, on the calling thread (the
                service before this change)
  SimpleQueue   ``hooks.configure_access_log`` (the service): the record put on a
                ``queue.SimpleQueue``; a ``QueueListener`` thread blocked in ``get`` wakes
                for each record, formats and writes it
  polled        a rejected alternative: the record appended to a deque, the
                ``QueueListener`` thread polling it every 50 ms (no wake-up per record,
                but each drain holds the GIL for up to a switch interval)

Two loops: ``burst`` logs back to back (the request thread's own cost, and the CPU of both
threads per line, measured until everything is written); ``paced`` is a request at a
time, as one keep-alive connection makes them: ~200 us of Python work, the log call,
then ~300 us waiting with the GIL released (the network), reporting the loop's time per
request minus the same loop without logging. All write to a temporary file.
"""

from __future__ import annotations

import argparse
import collections
import logging
import logging.handlers
import queue
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pythonjsonlogger.orjson import OrjsonFormatter

from serving import hooks
from serving.settings import Settings

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
ACCESS = logging.getLogger("serving.access")


class PolledQueue:
    """``put_nowait`` appends to a deque and wakes nobody; ``get`` polls every 50 ms."""

    def __init__(self) -> None:
        self.items: collections.deque[Any] = collections.deque()

    def put_nowait(self, item: Any) -> None:
        self.items.append(item)

    def get(self, block: bool = True) -> Any:
        while True:
            try:
                return self.items.popleft()
            except IndexError:
                if not block:
                    raise queue.Empty from None
                time.sleep(0.05)


def writer(stream: Any) -> logging.Handler:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        OrjsonFormatter(
            "{asctime}{levelname}{message}",
            style="{",
            rename_fields={"asctime": "time", "levelname": "level"},
        )
    )
    return handler


def install(kind: str, out: Any) -> logging.handlers.QueueListener | None:
    """Point serving.access at ``kind``'s handler writing to ``out``."""
    ACCESS.setLevel(logging.INFO)
    ACCESS.propagate = False
    if kind == "in place":
        ACCESS.handlers = [writer(out)]
    elif kind == "SimpleQueue":
        hooks.configure_access_log(Settings(access_log=True))
    elif kind == "polled":
        polled = PolledQueue()
        ACCESS.handlers = [hooks._RecordQueueHandler(polled)]  # type: ignore[arg-type]
        listener = logging.handlers.QueueListener(polled, writer(out))  # type: ignore[arg-type]
        listener.start()
        return listener
    else:
        ACCESS.handlers = [logging.NullHandler()]
    return None


def uninstall(listener: logging.handlers.QueueListener | None) -> None:
    if listener is not None:
        listener.stop()
    hooks.stop_access_log()


def burst(kind: str, lines: int) -> tuple[float, float]:
    """(us per line on the caller, us CPU per line in all)."""
    with tempfile.TemporaryFile("w") as out:
        sys.stdout = out
        try:
            listener = install(kind, out)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for _ in range(lines):
                ACCESS.info("request", extra=FIELDS)
            caller = time.perf_counter() - wall0
            uninstall(listener)  # waits until every queued line is written
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
            listener = install(kind, out)
            started = time.perf_counter()
            for _ in range(requests):
                sum(range(2000))  # ~200 us of Python on the slow CPUs here
                if kind != "none":
                    ACCESS.info("request", extra=FIELDS)
                network.acquire(timeout=0.0003)
            elapsed = time.perf_counter() - started
            uninstall(listener)
        finally:
            sys.stdout = sys.__stdout__
    return elapsed / requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    kinds = ("in place", "SimpleQueue", "polled")
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
        print(f"  {kind:>12}: {caller:6.1f} us per line on the caller, {cpu:6.1f} us CPU in all")
    base = statistics.median(paces["none"])
    print(f"paced (one request at a time, {base * 1e6:.0f} us per request without a log):")
    for kind in kinds:
        extra = statistics.median(paces[kind]) - base
        print(f"  {kind:>12}: +{extra * 1e6:6.1f} us per request ({extra / base:+.1%})")


if __name__ == "__main__":
    main()
