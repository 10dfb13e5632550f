"""Why a model call in a gthread request thread could cost more than in a sync worker: a
minimal reproduction, without HTTP.

    python bench/thread_cost.py [--model light] [--calls 3000]

Times one single-row ``predict`` (joblib model, as bench/naive_app.py calls it) four ways,
taking turns round by round so load from elsewhere on the host hits each alike:

  main          on the main thread (a sync worker)
  thread        on one other thread, the main thread joined (BLAS from a non-main thread)
  thread+poll   on one other thread while the main thread sits in ``selectors.select``
                with a 1 s timeout (gthread's poller loop, idle)
  handoff       submitted to a ``ThreadPoolExecutor`` and waited for from the main thread,
                one call at a time (gthread: the poller hands each request to a pool
                thread and gets the connection back: two thread wake-ups per request)

and prints the median microseconds per call and the ratio to ``main``.
"""

from __future__ import annotations

import argparse
import selectors
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import joblib

from bench.models import model_path, real_rows


def timed(call: Callable[[], object], calls: int) -> list[float]:
    out = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        out.append(time.perf_counter() - started)
    return out


def on_thread(call: Callable[[], object], calls: int, poll: bool) -> list[float]:
    result: list[float] = []
    done = threading.Event()
    a, b = socket.socketpair()

    def work() -> None:
        result.extend(timed(call, calls))
        done.set()
        b.send(b"x")  # wake the poller

    thread = threading.Thread(target=work)
    thread.start()
    if poll:
        with selectors.DefaultSelector() as selector:
            selector.register(a, selectors.EVENT_READ)
            while not done.is_set():
                selector.select(1.0)
    thread.join()
    a.close()
    b.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="light")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    model = joblib.load(model_path(args.model))
    row = real_rows()[:1]

    def call() -> object:
        return model.predict(row)

    pool = ThreadPoolExecutor(1)
    per_round = args.calls // args.rounds
    ways: dict[str, Callable[[], list[float]]] = {
        "main": lambda: timed(call, per_round),
        "thread": lambda: on_thread(call, per_round, poll=False),
        "thread+poll": lambda: on_thread(call, per_round, poll=True),
        "handoff": lambda: timed(lambda: pool.submit(call).result(), per_round),
    }
    samples: dict[str, list[float]] = {name: [] for name in ways}
    timed(call, 200)  # warmup
    for _ in range(args.rounds):
        for name, way in ways.items():
            samples[name] += way()
    base = statistics.median(samples["main"])
    for name, values in samples.items():
        median = statistics.median(values)
        print(f"{name:>12}: {median * 1e6:8.1f} us per call  ({median / base:.2f}x main)")
    pool.shutdown()


if __name__ == "__main__":
    main()
