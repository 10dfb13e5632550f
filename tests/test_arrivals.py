"""serving.batching.arrivals: the count the batcher's gate reads, per thread and idempotent."""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from serving.batching.arrivals import Arrivals
from serving.server.hooks import count_arrivals


def test_a_thread_counts_once_however_often_it_enters_or_leaves() -> None:
    arrivals = Arrivals()
    arrivals.enter()
    arrivals.enter()  # the app's hook after the server's: still one request
    assert arrivals.count == 1
    arrivals.leave()
    arrivals.leave()  # queued, then the request's end: nothing more to uncount
    assert arrivals.count == 0


def test_each_thread_carries_its_own_request() -> None:
    arrivals = Arrivals()
    entered, release = threading.Barrier(9), threading.Event()

    def carry() -> None:
        arrivals.enter()
        entered.wait(10)
        assert release.wait(10)
        arrivals.leave()

    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(carry) for _ in range(8)]
        entered.wait(10)
        assert arrivals.count == 8
        arrivals.leave()  # this thread carries nothing: no change
        assert arrivals.count == 8
        release.set()
        for future in futures:
            future.result(10)
    assert arrivals.count == 0


def test_a_gthread_worker_counts_each_request_from_its_thread_taking_it_up() -> None:
    arrivals = Arrivals()
    seen: list[int] = []

    class Worker:  # the one attribute count_arrivals wraps
        def handle(self, conn: Any) -> Any:
            seen.append(arrivals.count)
            if conn == "probe":
                return True  # never reached a batcher: uncounted when the thread is done
            arrivals.leave()  # queued by the data plane
            seen.append(arrivals.count)
            raise ConnectionResetError  # and the client went away

    worker = Worker()
    count_arrivals(worker, arrivals)
    assert worker.handle("probe") is True
    with contextlib.suppress(ConnectionResetError):
        worker.handle("predict")
    assert seen == [1, 1, 0]
    assert arrivals.count == 0
