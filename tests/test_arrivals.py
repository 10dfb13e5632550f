"""serving.batching.arrivals: the count the batcher's gate reads, per thread and idempotent."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from serving.batching.arrivals import Arrivals
from serving.server.arrivals import count_arrivals
from tests.waiting import until


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
            if conn.kind == "probe":
                return True  # never reached a batcher: uncounted when the thread is done
            arrivals.leave()  # queued by the data plane
            seen.append(arrivals.count)
            raise ConnectionResetError  # and the client went away

    worker = Worker()
    count_arrivals(worker, arrivals)
    with _connection(b"GET /livez HTTP/1.1\r\n\r\n", "probe") as probe:
        assert worker.handle(probe) is True
    with (
        _connection(b"POST /predict HTTP/1.1\r\n", "predict") as predict,
        contextlib.suppress(ConnectionResetError),
    ):
        worker.handle(predict)
    assert seen == [1, 1, 0]
    assert arrivals.count == 0


def test_a_thread_waiting_for_its_clients_bytes_is_not_counted() -> None:
    """Found by the attack: an idle connection, a request line without its headers or a
    trickling body was counted while its thread only waited for the client, and every
    batch of the worker waited SERVING_MAX_BATCH_LATENCY_MS for it."""
    from gunicorn.http.unreader import SocketUnreader  # type: ignore[import-untyped]

    arrivals = Arrivals()
    seen: list[tuple[str, int]] = []
    reads: list[tuple[bytes, int]] = []

    class Worker:
        def handle(self, conn: Any) -> Any:
            seen.append(("taken up", arrivals.count))
            reader = SocketUnreader(conn.sock)
            for _ in range(2):  # each read waits for the client
                reads.append((reader.chunk(), arrivals.count))
            return True

    worker = Worker()
    count_arrivals(worker, arrivals)
    with _connection(b"", "idle") as idle:
        client = idle.client

        def send_slowly() -> None:
            until(lambda: seen, 5, what="the connection taken up")
            client.sendall(b"POST")
            until(lambda: reads, 5, what="the first read")
            try:
                until(lambda: arrivals.count == 0, 2, what="the second read uncounted")
            finally:
                client.sendall(b" /predict")

        sender = threading.Thread(target=send_slowly)
        sender.start()
        assert worker.handle(idle) is True
        sender.join(5)
    assert seen == [("taken up", 0)]  # nothing to read yet: not counted
    assert reads == [(b"POST", 1), (b" /predict", 1)]  # counted again once bytes came
    assert arrivals.count == 0


class _Conn:
    def __init__(self, sock: socket.socket, client: socket.socket, kind: str) -> None:
        self.sock, self.client, self.kind = sock, client, kind


@contextlib.contextmanager
def _connection(sent: bytes, kind: str) -> Iterator[_Conn]:
    """A gthread connection's server end, the client having sent ``sent``."""
    server, client = socket.socketpair()
    with server, client:
        client.sendall(sent)
        yield _Conn(server, client, kind)


def test_a_keep_alive_request_is_counted_without_a_poll_per_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The poller hands a keep-alive connection over readable: its thread counts it at
    once and its first read returns at once, so neither needs a system call to look."""
    from gunicorn.http.unreader import SocketUnreader  # type: ignore[import-untyped]

    from serving.server import arrivals as hooks

    looked: list[Any] = []
    has_bytes = hooks._has_bytes
    monkeypatch.setattr(hooks, "_has_bytes", lambda sock: looked.append(sock) or has_bytes(sock))
    arrivals = Arrivals()
    reads: list[tuple[bytes, int]] = []

    class Worker:
        def handle(self, conn: Any) -> Any:
            reads.append((SocketUnreader(conn.sock).chunk(), arrivals.count))
            return True

    worker = Worker()
    count_arrivals(worker, arrivals)
    with _connection(b"GET /livez HTTP/1.1\r\n\r\n", "keep-alive") as conn:
        conn.initialized = True  # type: ignore[attr-defined]  # a request answered before
        assert worker.handle(conn) is True
    assert reads == [(b"GET /livez HTTP/1.1\r\n\r\n", 1)]
    assert looked == []


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


def test_a_gthread_worker_counts_a_connection_from_its_hand_over_to_the_pool() -> None:
    arrivals = Arrivals()
    seen: list[tuple[int, int]] = []

    class Worker:
        def __init__(self) -> None:
            self.pool: list[Any] = []

        def enqueue_req(self, conn: Any) -> None:  # the main loop hands it over
            self.pool.append(conn)

        def handle(self, conn: Any) -> Any:
            seen.append((arrivals.handed, arrivals.count))
            return True

    worker = Worker()
    count_arrivals(worker, arrivals)
    with _connection(b"GET /livez HTTP/1.1\r\n\r\n", "probe") as conn:
        worker.enqueue_req(conn)
        assert (arrivals.handed, arrivals.count) == (1, 0)  # handed, not taken up yet
        worker.handle(worker.pool.pop())
    assert seen == [(0, 1)]  # taken up: counted on its thread instead
    assert (arrivals.handed, arrivals.count) == (0, 0)


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
