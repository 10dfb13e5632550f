"""A client that never finishes its headers, or its body, holds no worker thread for long."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.e2e.server import GunicornServer
from tests.models import RowEcho, RowOffset
from tests.waiting import until


def _live(server: GunicornServer) -> bool:
    """Whether ``/livez`` answers 200 within a second."""
    try:
        return requests.get(f"{server.url}/livez", timeout=1).status_code == 200
    except requests.RequestException:
        return False


Start = Callable[..., GunicornServer]
Pickled = Callable[[Any, str], Path]


@pytest.mark.usefixtures("cpu_hog")
def test_connections_stuck_in_their_headers_are_closed_and_probes_answer(
    gunicorn: Start, pickled: Pickled
) -> None:
    model = pickled(RowOffset(offset=0.0), "m.pkl")
    server = gunicorn(model_path=model, header_timeout_s=2)
    server.wait_ready()
    stuck = []
    for _ in range(300):  # more than the two workers' threads together
        client = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        client.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        stuck.append(client)
    try:
        # Each is closed past the header timeout (2 s), counted from its accept: wait for
        # the close itself, 10 s at most for all of them.
        deadline = time.monotonic() + 10
        closed = 0
        for client in stuck:
            client.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                closed += client.recv(1) == b""
            except TimeoutError:
                pass  # still open at the deadline: not closed
            except OSError:
                closed += 1  # reset: closed too
        assert closed == len(stuck)
        assert requests.get(f"{server.url}/livez", timeout=5).status_code == 200
    finally:
        for client in stuck:
            client.close()


def test_connections_stuck_in_their_body_get_408_and_free_their_threads(
    gunicorn: Start, pickled: Pickled
) -> None:
    """Headers announcing 100 bytes, 6 of them, then nothing: each such connection held a
    worker thread forever (the body read had no time limit), so with more of them than
    threads /livez stopped answering."""
    model = pickled(RowOffset(offset=0.0), "m.pkl")
    # One worker: with two, the kernel may hand one of them fewer connections than it has
    # threads, and probes reach that one. Default threads: 2 x SERVING_MAX_BATCH_SIZE = 64.
    server = gunicorn(model_path=model, workers=1, request_timeout_ms=3000)
    server.wait_ready(workers=1)
    head = (
        b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n"
    )
    stuck = []
    for _ in range(2 * 64):  # twice the worker's threads
        client = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        client.sendall(head + b'{"ins')  # and never the other 94 bytes
        stuck.append(client)
    try:
        deadline = time.monotonic() + 30
        answered: dict[str, int] = {}
        while len(answered) < 2:
            assert time.monotonic() < deadline, f"only {answered} answered:\n{server.output()}"
            for name, call in (
                ("livez", lambda: requests.get(f"{server.url}/livez", timeout=2)),
                (
                    "predict",
                    lambda: requests.post(
                        f"{server.url}/predict", json={"instances": [[1.0]]}, timeout=2
                    ),
                ),
            ):
                try:
                    response = call()
                except requests.RequestException:
                    continue
                answered[name] = response.status_code
        assert answered == {"livez": 200, "predict": 200}
        outcomes = {"408": 0, "closed": 0, "open": 0}
        deadline = time.monotonic() + 10
        for client in stuck:
            client.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                data = client.recv(64)
            except TimeoutError:
                outcomes["open"] += 1
                continue
            except OSError:
                data = b""  # reset: closed too
            outcomes["408" if data.startswith(b"HTTP/1.1 408") else "closed"] += 1
        assert outcomes["open"] == 0, outcomes
        assert outcomes["408"] > 0, outcomes
    finally:
        for client in stuck:
            client.close()


def test_clients_that_never_close_after_connection_close_do_not_stop_the_worker(
    gunicorn: Start, pickled: Pickled
) -> None:
    """Gunicorn closes a ``Connection: close`` connection gracefully: it half-closes, then
    waits up to 2 s for the client to close first, on the worker's main loop, which
    accepts nothing meanwhile. 10 clients that never close stopped a worker for 20 s."""
    model = pickled(RowOffset(offset=0.0), "m.pkl")
    server = gunicorn(model_path=model, workers=1)
    server.wait_ready(workers=1)
    lingering = []
    for _ in range(30):
        client = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        client.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        lingering.append(client)
    try:
        deadline = time.monotonic() + 15  # 60 s of lingering, one after another, before
        while True:
            try:
                if requests.get(f"{server.url}/livez", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, server.output()
        for client in lingering:  # each got its answer, then the server's end of the stream
            client.settimeout(max(0.1, deadline - time.monotonic()))
            received = b""
            while chunk := client.recv(4096):
                received += chunk
            assert received.startswith(b"HTTP/1.1 200"), received
    finally:
        for client in lingering:
            client.close()


@pytest.mark.usefixtures("cpu_hog")
def test_clients_that_never_read_their_responses_free_their_threads(
    gunicorn: Callable[..., GunicornServer],
) -> None:
    """Found by the attack on this branch: clients that pipeline requests for a large file
    and never read held every thread of the worker, and /livez went unanswered for as long
    as they stayed connected. A write left unread SERVING_HEADER_TIMEOUT_S closes it."""
    server = gunicorn(workers=1, threads=4, header_timeout_s=2)
    server.wait_ready(workers=1)
    request = b"GET /docs/swagger-ui-bundle.js HTTP/1.1\r\nHost: x\r\n\r\n" * 8
    stalled = []
    for _ in range(8):  # twice the threads
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(request)
        stalled.append(sock)
    try:
        until(
            lambda: _live(server),
            20,
            interval_s=0.2,
            what=lambda: f"/livez answered:\n{server.output()}",
        )
        server.wait_for_log("has not read its response", 1, timeout_s=20)
        assert "Traceback" not in server.output()
    finally:
        for sock in stalled:
            sock.close()


@pytest.mark.parametrize(
    "sent",
    [
        b"",  # connected, nothing sent yet (a browser's preconnect)
        b"POST /predict HTTP/1.1\r\nHost: x\r\n",  # headers still coming
        b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n" + b'{"instances": [',  # a slow upload
    ],
    ids=["idle", "headers", "body"],
)
def test_a_client_still_sending_does_not_make_other_requests_wait_for_it(
    gunicorn: Start, pickled: Pickled, sent: bytes
) -> None:
    """Found by the attack: a worker counted a connection as a request on its way to the
    batcher from the moment a thread took it up, also while that thread only waited for
    the client's bytes. One idle TCP connection (5 s per connect), a request line without
    its headers (SERVING_HEADER_TIMEOUT_S) or a trickling body (the request deadline) made
    every other request of the worker wait SERVING_MAX_BATCH_LATENCY_MS more: lone
    requests of a 100 ms model took 200 ms. A thread waiting for its client's bytes is
    not counted; it is again once they come."""
    model = pickled(RowEcho(n_features=3, delay_s=0.1), "echo.pkl")
    server = gunicorn(model_path=model, workers=1, max_batch_latency_ms=100)
    server.wait_ready(workers=1)

    def lone_ms() -> float:
        """The median server-side latency of 5 lone requests, one after another."""
        with requests.Session() as session:
            answers = [
                session.post(
                    f"{server.url}/predict", json={"instances": [[1.0, 2.0, 3.0]]}, timeout=10
                )
                for _ in range(5)
            ]
        assert all(answer.status_code == 200 for answer in answers), answers[0].text
        return sorted(answer.json()["latency_ms"] for answer in answers)[2]

    assert lone_ms() < 150  # alone: 100 ms, no wait
    stalled = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    try:
        stalled.sendall(sent)
        assert lone_ms() < 150  # was 200: 100 ms more waiting for the stalled client
    finally:
        stalled.close()


def test_a_body_left_unread_and_trickling_frees_its_thread_by_the_request_deadline(
    gunicorn: Start,
) -> None:
    """Found by the attack: a request answered without its body being read (413 for a
    declared Content-Length over SERVING_MAX_BODY_BYTES) kept its connection alive, and
    Gunicorn then drained the body in the worker thread, each read of 1 KiB waiting for
    1 KiB: a client trickling a byte a second held the thread for as long as it kept on,
    past both the header and the request deadline. 8 such clients against 4 threads and
    /livez went unanswered for as long as they stayed."""
    server = gunicorn(workers=1, threads=4, request_timeout_ms=2000)
    server.wait_ready(workers=1)
    head = (
        b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 10000000\r\n\r\n"  # over SERVING_MAX_BODY_BYTES: 413 unread
    )
    trickling = []
    for _ in range(8):  # twice the threads
        client = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        client.sendall(head + b'{"instances": [')
        trickling.append(client)
    stop = time.monotonic() + 30

    def trickle() -> None:
        while time.monotonic() < stop:
            for client in trickling:
                with contextlib.suppress(OSError):  # closed by the server: the aim
                    client.send(b" ")
            time.sleep(0.2)

    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    try:
        time.sleep(1)  # every thread drains a trickling body
        until(
            lambda: _live(server),
            15,
            interval_s=0.2,
            what=lambda: f"/livez answered:\n{server.output()}",
        )
    finally:
        stop = 0.0
        trickler.join(5)
        for client in trickling:
            client.close()


def test_a_whole_request_beside_stuck_headers_is_answered_at_once(
    gunicorn: Start, pickled: Pickled
) -> None:
    """Two connections stuck in their headers against one worker of two threads: with
    Gunicorn's gthread they held both threads, and a whole request accepted meanwhile
    waited for one until the header timeout closed them (or was closed unanswered with
    them). Our worker reads heads on its main loop: the stuck ones hold no thread, and the
    request is answered while they are still open."""
    model = pickled(RowOffset(offset=0.0), "m.pkl")
    server = gunicorn(model_path=model, header_timeout_s=5, workers=1, threads=2)
    server.wait_ready(workers=1)
    stuck = []
    for _ in range(2):
        client = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        client.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        stuck.append(client)
    try:
        until(lambda: server.accepted_connections() >= 2, 5, what="2 stuck connections held")
        answer = requests.post(f"{server.url}/predict", json={"instances": [[1.5]]}, timeout=15)
        still_open = []
        for client in stuck:
            client.settimeout(0)
            try:
                still_open.append(client.recv(1) != b"")
            except BlockingIOError:
                still_open.append(True)  # nothing to read: open
    finally:
        for client in stuck:
            client.close()

    assert answer.status_code == 200, answer.text
    assert answer.json()["predictions"] == [1.5]
    assert still_open == [True, True]  # answered before the header timeout closed them


@pytest.mark.usefixtures("cpu_hog")
def test_a_thousand_idle_connections_hold_no_thread(gunicorn: Start, pickled: Pickled) -> None:
    """gthread hands a connection to a thread as soon as it is accepted: 70 idle
    connections took /livez to 5 s on one worker of 64 threads, 130 to 10 s. Our worker
    keeps them on its main loop: with 1,000 open, probes and predictions are answered
    while they are all still held, and each is closed at the header timeout."""
    model = pickled(RowOffset(offset=0.0), "m.pkl")
    server = gunicorn(model_path=model, workers=1, header_timeout_s=20)
    server.wait_ready(workers=1)
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(1000)]
    try:
        until(
            lambda: server.accepted_connections() >= 1000, 15, interval_s=0.2,
            what=lambda: f"1000 idle connections held ({server.accepted_connections()})",
        )  # fmt: skip
        live = requests.get(f"{server.url}/livez", timeout=10)
        predicted = server.predict([[2.5]])
        held = server.accepted_connections()
    finally:
        for client in idle:
            client.close()

    assert live.status_code == 200
    assert predicted.status_code == 200 and predicted.json()["predictions"] == [2.5]
    assert held >= 1000  # none of them was closed to make room


def test_an_answer_gunicorn_writes_itself_is_counted_and_logged(
    gunicorn: Start, pickled: Pickled
) -> None:
    """A malformed request line is answered by Gunicorn (400), before the app: it was in
    neither http_requests_total nor the access log."""
    model = pickled(RowOffset(offset=0.0), "m.pkl")
    server = gunicorn(model_path=model, workers=1)
    server.wait_ready(workers=1)
    answers = []
    for request in (b"GARBAGE\r\n\r\n", b"GET / HTTP/1.1\r\nBad Header\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as client:
            client.sendall(request)
            answers.append(client.recv(64).split(b"\r\n")[0])

    def counted() -> float:
        text = requests.get(f"{server.url}/metrics", timeout=5).text
        name = 'http_requests_total{route="(gunicorn)",status="400"}'
        return server.metric(name, text) if "(gunicorn)" in text else 0.0

    until(lambda: counted() >= 2, 10, what=lambda: f"the 400s in /metrics ({counted()})")
    server.wait_for_log('"route":"(gunicorn)","status":400', 2)

    assert answers == [b"HTTP/1.1 400 Bad Request"] * 2
    assert counted() == 2


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [
        (b"GARBAGE\r\n\r\n", 400, "bad_request"),
        (b"GET / HTTP/1.1\r\nBad Header\r\n\r\n", 400, "bad_request"),
        (
            b"POST /predict HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: foo, chunked\r\n\r\n",
            501,
            "unsupported_transfer_coding",
        ),
        (
            b"POST /predict HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Length: 5\r\n\r\n",
            400,
            "bad_request",
        ),
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", 414, "uri_too_long"),
    ],
    ids=["request-line", "header", "transfer-coding", "chunked-and-length", "long-uri"],
)
def test_an_answer_gunicorn_writes_itself_is_json_in_the_services_error_shape(
    gunicorn: Start, pickled: Pickled, request_bytes: bytes, status: int, code: str
) -> None:
    """Found by the attack: a request Gunicorn refuses before the app (a coding it does
    not know, chunked with a Content-Length, a bad request line) was answered with an
    HTML page; a client reading JSON errors got one it could not parse."""
    server = gunicorn(model_path=pickled(RowOffset(offset=0.0), "m.pkl"), workers=1)
    server.wait_ready(workers=1)
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as client:
        client.sendall(request_bytes)
        answer = b""
        with contextlib.suppress(OSError):
            while chunk := client.recv(65536):
                answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")

    assert lines[0].split(b" ")[1] == str(status).encode(), answer[:200]
    assert status == 400 or b"Bad Request" not in lines[0]  # Gunicorn's reason for a 501
    assert b"Content-Type: application/json" in lines
    request_id = next(line for line in lines if line.startswith(b"X-Request-ID: "))
    server.wait_for_log(f'"request_id":"{request_id[14:].decode()}"', 1)
    assert b"Connection: close" in lines
    error = json.loads(body)["error"]
    assert error["code"] == code
    assert error["message"] and error["details"] == []


def test_a_408_for_a_body_that_stopped_arriving_says_it_closes_the_connection(
    gunicorn: Start, pickled: Pickled
) -> None:
    """A body that stops arriving is answered 408 and its connection closed (where its
    next request would start is unknown). The answer said ``Connection: keep-alive``, so
    a client sent its next request on it and lost it (RFC 9112 section 9.6)."""
    server = gunicorn(model_path=pickled(RowOffset(offset=0.0), "m.pkl"), request_timeout_ms=1000)
    server.wait_ready()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as client:
        client.sendall(
            b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n" + b'{"ins'
        )  # and never the other 95 bytes
        data = b""
        while chunk := client.recv(65536):  # to the end: the server closes the connection
            data += chunk

    head = data.partition(b"\r\n\r\n")[0].split(b"\r\n")
    assert head[0] == b"HTTP/1.1 408 REQUEST TIMEOUT", data
    assert b"Connection: close" in head, data


def test_a_head_longer_than_the_main_loop_reads_is_closed_at_the_header_timeout(
    gunicorn: Start, pickled: Pickled
) -> None:
    """Found by the attack: a head of 70 KB without its blank line went to a thread once
    the main loop had read its share, and the thread read the rest with no deadline: 4
    such connections held the 4 threads of a worker and /livez went unanswered for as long
    as they stayed. The head's deadline goes with it to the thread."""
    model = pickled(RowOffset(offset=0.0), "m.pkl")
    server = gunicorn(model_path=model, workers=1, threads=4, header_timeout_s=2)
    server.wait_ready(workers=1)
    padding = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 7000) for i in range(10))
    stuck = []
    for _ in range(4):
        client = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        client.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\n" + padding)  # no blank line
        stuck.append(client)
    try:
        closed = 0
        for client in stuck:
            try:
                closed += client.recv(1) == b""  # within the 10 s socket timeout
            except TimeoutError:
                pass
            except OSError:
                closed += 1  # reset: closed too
        live = requests.get(f"{server.url}/livez", timeout=5)
    finally:
        for client in stuck:
            client.close()

    assert closed == 4
    assert live.status_code == 200


@pytest.mark.parametrize(
    "framing",
    [
        b'Content-Length: 100\r\n\r\n{"instance',
        b'Transfer-Encoding: chunked\r\n\r\nA\r\n{"instance',
    ],
    ids=["content-length", "chunked"],
)
def test_bodies_that_stop_arriving_hold_no_thread_until_their_408(
    gunicorn: Start, pickled: Pickled, framing: bytes
) -> None:
    """Found by the attacks: a head and 10 bytes of a 100-byte body, then nothing, held a
    thread until SERVING_REQUEST_TIMEOUT_MS (30 s by default): 4 such clients and /livez
    went unanswered on a worker of 4 threads; chunked, the same (after the Content-Length
    fix, 200 such chunked clients took /healthz to 17 s). The main loop now reads bodies
    of either framing: probes and predictions are answered while the stuck bodies wait,
    and each of those still gets its 408 at its deadline."""
    model = pickled(RowOffset(offset=0.0), "m.pkl")
    server = gunicorn(model_path=model, workers=1, threads=4, request_timeout_ms=8000)
    server.wait_ready(workers=1)
    head = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    stuck = []
    for _ in range(8):  # twice the worker's threads
        client = socket.create_connection(("127.0.0.1", server.port), timeout=20)
        client.sendall(head + framing)  # and never the rest
        stuck.append(client)
    try:
        until(lambda: server.accepted_connections() >= 8, 5, what="the stuck bodies held")
        live = requests.get(f"{server.url}/livez", timeout=3)
        predicted = server.predict([[3.5]])
        answers = [client.recv(64) for client in stuck]  # their 408, at the deadline
    finally:
        for client in stuck:
            client.close()

    assert live.status_code == 200
    assert predicted.status_code == 200 and predicted.json()["predictions"] == [3.5]
    assert all(a.startswith(b"HTTP/1.1 408") for a in answers), answers


def test_pipelined_chunked_requests_are_each_answered_in_order(
    gunicorn: Start, pickled: Pickled
) -> None:
    """Two chunked predictions and a probe sent at once on one connection: each is
    answered, in order (the main loop reads the next one's body after the last)."""
    model = pickled(RowOffset(offset=0.0), "m.pkl")
    server = gunicorn(model_path=model, workers=1)
    server.wait_ready(workers=1)

    def chunked(value: float) -> bytes:
        body = json.dumps({"instances": [[value]]}).encode()
        chunks = b"".join(
            b"%x\r\n%s\r\n" % (len(body[i : i + 7]), body[i : i + 7])
            for i in range(0, len(body), 7)
        )
        return (
            b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
        )

    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as client:
        client.sendall(chunked(1.5) + chunked(2.5) + b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        received = b""
        while received.count(b"HTTP/1.1 200") < 3 or not received.endswith(b"}"):
            data = client.recv(65536)
            assert data, received
            received += data

    bodies = [part.split(b"\r\n\r\n", 1)[1] for part in received.split(b"HTTP/1.1 ")[1:]]
    assert [json.loads(b).get("predictions") for b in bodies] == [[1.5], [2.5], None]
    assert json.loads(bodies[2]) == {"status": "alive"}


@pytest.mark.parametrize(
    "size",
    [b"%x" % (5 * 1024 * 1024), b"f" * 20, b"0" * 12 + b"500000"],
    ids=["5MiB", "20f", "zeros"],
)
def test_a_chunk_declaring_more_than_the_body_limit_is_413_at_once(
    gunicorn: Start, pickled: Pickled, size: bytes
) -> None:
    """Found by the attack: a chunk size over SERVING_MAX_BODY_BYTES, its data never
    sent in full, held a thread until the 408 (30 s by default) for a body the server
    would refuse anyway. The main loop reads the size: 413 at once, connection closed.
    (Found by the next attack: a size of more than eight hex digits still waited.)"""
    model = pickled(RowOffset(offset=0.0), "m.pkl")
    server = gunicorn(model_path=model, workers=1, request_timeout_ms=20000)
    server.wait_ready(workers=1)
    head = (
        b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as client:
        started = time.monotonic()
        client.sendall(head + size + b"\r\n" + b"x" * 1000)
        answer = b""
        while data := client.recv(65536):  # to the end: the server closes it
            answer += data
        waited = time.monotonic() - started

    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"payload_too_large" in answer and b"SERVING_MAX_BODY_BYTES" in answer
    assert waited < 10  # not the 20 s deadline


def test_a_stopping_worker_gives_bodies_still_arriving_a_short_linger_not_their_deadline(
    gunicorn: Start, pickled: Pickled
) -> None:
    """Found by the attack: 50 connections that sent a head announcing 1,000 bytes and no
    body made SIGTERM take the whole request deadline (30.6 s), each client answered 408
    only then. A stopping worker waits for a body as long as for an idle connection's
    next request (STOP_LINGER_S), then answers 408: the server exits in seconds."""
    model = pickled(RowOffset(offset=0.0), "m.pkl")
    server = gunicorn(model_path=model, workers=1, request_timeout_ms=30000)
    server.wait_ready(workers=1)
    head = (
        b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n"
    )
    stuck = []
    try:
        for _ in range(20):
            client = socket.create_connection(("127.0.0.1", server.port), timeout=40)
            client.sendall(head + b'{"inst')
            stuck.append(client)
        until(lambda: server.accepted_connections() >= 20, 5, what="the stuck bodies held")
        started = time.monotonic()
        status = server.terminate()
        took = time.monotonic() - started
        answers = [client.recv(64) for client in stuck]
    finally:
        for client in stuck:
            client.close()
        server.kill()

    assert status == 0
    assert took < 15, server.output()  # was the 30 s deadline
    assert all(a.startswith(b"HTTP/1.1 408") for a in answers), answers


def _read_until(client: socket.socket, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        chunk = client.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


@pytest.mark.usefixtures("cpu_hog")
def test_bodies_sent_after_100_continue_hold_no_thread_and_are_answered_once(
    gunicorn: Start, pickled: Pickled
) -> None:
    """Found by the attack: 64 connections sending ``Expect: 100-continue`` and then no
    body held every thread (their bodies were read on the threads) and /livez waited
    9.5 s. The main loop now answers the expectation and reads the body."""
    model = pickled(RowOffset(offset=0.0), "m.pkl")
    server = gunicorn(model_path=model, workers=1, threads=4, request_timeout_ms=8000)
    server.wait_ready(workers=1)
    head = (
        b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 20\r\nExpect: 100-continue\r\n\r\n"
    )
    stuck = []
    for _ in range(8):  # twice the worker's threads; each sends no body
        client = socket.create_connection(("127.0.0.1", server.port), timeout=20)
        client.sendall(head)
        stuck.append(client)
    try:
        continues = [_read_until(client, b"\r\n\r\n") for client in stuck]
        live = requests.get(f"{server.url}/livez", timeout=3)
        good = socket.create_connection(("127.0.0.1", server.port), timeout=20)
        good.sendall(head)
        interim = _read_until(good, b"\r\n\r\n")
        good.sendall(b'{"instances":[[3]]}\n')
        answer = _read_until(good, b"}")
        good.close()
        answers = [client.recv(64) for client in stuck]  # their 408, at the deadline
    finally:
        for client in stuck:
            client.close()

    assert continues == [b"HTTP/1.1 100 Continue\r\n\r\n"] * 8
    assert live.status_code == 200
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert answer.startswith(b"HTTP/1.1 200"), answer  # one 100, then the answer
    assert b'"predictions":[3.0]' in answer
    assert all(a.startswith(b"HTTP/1.1 408") for a in answers), answers
