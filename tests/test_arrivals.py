"""serving.batching.arrivals: the count the batcher's gate reads, per thread and idempotent."""

from __future__ import annotations

import socket
import threading
from concurrent.futures import ThreadPoolExecutor

from serving.batching.arrivals import Arrivals


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


def test_a_request_is_coming_while_handed_to_a_thread_or_ready_in_the_poller() -> None:
    arrivals = Arrivals()
    assert not arrivals.coming()
    arrivals.hand()  # the main loop gave a connection to the pool; no thread runs it yet
    assert arrivals.coming() and arrivals.count == 0
    arrivals.taken()
    waiting = [True]
    arrivals.waiting = lambda: waiting[0]  # a client's next request ready in the poller
    assert arrivals.coming()
    waiting[0] = False
    assert not arrivals.coming()


def test_the_poller_probe_sees_a_ready_connection_and_takes_nothing_from_the_main_loop() -> None:
    import selectors

    from serving.server.arrivals import ready_in_poller

    class Worker:
        poller: selectors.BaseSelector | None = None

    worker = Worker()
    ready = ready_in_poller(worker)
    assert ready() is False  # before init_process: no poller yet
    worker.poller = selectors.DefaultSelector()
    server, client = socket.socketpair()
    with server, client:
        worker.poller.register(server, selectors.EVENT_READ)
        assert ready() is False  # an idle keep-alive connection
        client.sendall(b"GET /predict HTTP/1.1\r\n\r\n")
        assert ready() is True
        assert ready() is True
        assert [key.fileobj for key, _ in worker.poller.select(0)] == [server]  # still there
        worker.poller.close()


def test_the_poller_probe_says_nothing_where_the_poller_is_not_epoll() -> None:
    import selectors

    from serving.server.arrivals import ready_in_poller

    class Worker:
        poller = selectors.SelectSelector()  # as on a host without epoll

    server, client = socket.socketpair()
    with server, client:
        Worker.poller.register(server, selectors.EVENT_READ)
        client.sendall(b"GET / HTTP/1.1\r\n\r\n")
        assert ready_in_poller(Worker())() is False  # the count alone decides, no error
        Worker.poller.close()
