"""Hostile and faulty input against a real Gunicorn: always a 4xx JSON answer, never a 500,
never a dead worker; a failing instance fails only its own request."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

from tests.e2e.server import GunicornServer
from tests.models import FailsOnNegative
from tests.tabular import tier_pipeline

Start = Callable[..., GunicornServer]
Pickled = Callable[[Any, str], Path]

ROW = "[1.0, 2.0, 3.0]"
CORPUS: list[tuple[str, bytes]] = [
    ("deep nesting", b'{"instances": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"),
    ("huge integer", b'{"instances": [[1' + b"0" * 5000 + b", 2, 3]]}"),
    ("1e999", b'{"instances": [[1e999, 2, 3]]}'),
    ("megabyte string", b'{"instances": [["' + b"x" * 1_000_000 + b'", 2, 3]]}'),
    ("duplicate keys", b'{"instances": [[1, 2, 3]], "instances": "no"}'),
    ("wrong top-level type", b'"instances"'),
    ("null instances", b'{"instances": null}'),
    ("object instance", b'{"instances": [{"a": 1}]}'),
    ("numeric strings", b'{"instances": [["1_000", "NaN", "inf"]]}'),
    ("booleans", b'{"instances": [[true, false, true]]}'),
    ("typo field", ('{"instance": [' + ROW + "]}").encode()),
    ("extra field", ('{"instances": [' + ROW + '], "debug": true}').encode()),
    ("invalid utf-8", b'{"instances": [[1, 2, 3]], "model_version": "\xff\xfe"}'),
    ("lone surrogate", b'{"instances": [[1, 2, 3]], "model_version": "\\ud800"}'),
    ("trailing garbage", ('{"instances": [' + ROW + "]} xyz").encode()),
    ("empty body", b""),
    ("too many instances", ('{"instances": [' + ",".join([ROW] * 2000) + "]}").encode()),
]


def test_hostile_bodies_get_4xx_json_and_the_workers_survive(
    gunicorn: Start, pickled: Pickled
) -> None:
    model = pickled(FailsOnNegative(n_features=3), "m.pkl")
    server = gunicorn(model_path=model, max_body_bytes=8 * 1024 * 1024)
    server.wait_ready()
    assert server.proc is not None
    workers_before = server.worker_pids()

    for name, body in CORPUS:
        response = requests.post(
            f"{server.url}/predict",
            data=body,
            headers={"Content-Type": "application/json"},
            timeout=30,
        )
        assert 400 <= response.status_code < 500, (name, response.status_code, response.text[:300])
        error = response.json()["error"]
        assert error["code"] and error["message"], name
        assert "Traceback" not in response.text, name

    # A bad chunk size is the server's to parse; it must still be a 4xx, not a 500.
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(
            b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"
        )
        status_line = sock.recv(200).split(b"\r\n", 1)[0]
    assert status_line.split()[1].startswith(b"4"), status_line

    assert server.worker_pids() == workers_before, "a worker died"
    assert server.predict([[5.0, 0.0, 0.0]]).json()["predictions"] == [5.0]
    assert "Traceback" not in server.output()


def test_a_failing_instance_fails_only_its_own_request_in_a_burst(
    gunicorn: Start, pickled: Pickled
) -> None:
    model = pickled(FailsOnNegative(n_features=1, delay_s=0.02), "m.pkl")
    server = gunicorn(model_path=model)
    server.wait_ready()
    barrier = threading.Barrier(48)

    def call(caller: int) -> requests.Response:
        barrier.wait(30)
        value = -1.0 if caller % 12 == 5 else float(caller)
        return server.predict([[value]])

    with ThreadPoolExecutor(48) as pool:
        responses = list(pool.map(call, range(48)))

    for caller, response in enumerate(responses):
        if caller % 12 == 5:
            assert response.status_code == 500
            assert response.json()["error"]["code"] == "inference_error"
            assert "negative first feature" in response.json()["error"]["message"]
        else:
            assert response.status_code == 200, (caller, response.text)
            assert response.json()["predictions"] == [float(caller)]
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    calls = server.metric("inference_batch_size_count", text)
    assert server.metric('inference_batch_size_bucket{le="1.0"}', text) < calls, "no batching"
    assert server.metric("inference_errors_total", text) >= 4  # each failing call counted


def raw_post(
    port: int, path: str, content_type: str, body: bytes, *, declared: int,
    pause_s: float = 0.0, rest: bytes = b"",
) -> tuple[int, dict[str, Any]]:  # fmt: skip
    """POST ``body`` with Content-Length ``declared``; after ``pause_s`` send ``rest``, then
    half-close. Returns the status and the JSON body of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {declared}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        if pause_s:
            threading.Event().wait(pause_s)
            sock.sendall(rest)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload)


def test_a_body_shorter_than_its_content_length_is_400_never_parsed(
    gunicorn: Start, pickled: Pickled
) -> None:
    server = gunicorn(model_path=pickled(FailsOnNegative(n_features=3), "m.pkl"))
    server.wait_ready()
    complete = b'{"instances": [[1, 2, 3]]}'
    csv = b"a,b,c\n1,2,3\n4,5,6\n"

    for path, kind, body in [
        ("/predict", "application/json", complete),
        ("/invocations", "text/csv", csv),  # cut between rows: would lose rows silently
    ]:
        status, answer = raw_post(server.port, path, kind, body, declared=len(body) + 500)
        assert status == 400, (path, answer)
        text = json.dumps(answer)
        assert "unreadable_body" in text and f"sent {len(body)} of the {len(body) + 500}" in text


def test_a_request_slower_to_arrive_than_the_deadline_is_408(
    gunicorn: Start, pickled: Pickled
) -> None:
    server = gunicorn(
        model_path=pickled(FailsOnNegative(n_features=3), "m.pkl"), request_timeout_ms=500
    )
    server.wait_ready()
    body = b'{"instances": [[1, 2, 3]]}'

    status, answer = raw_post(
        server.port, "/predict", "application/json", body[:10], declared=len(body),
        pause_s=1.0, rest=body[10:],
    )  # fmt: skip

    assert status == 408, answer
    assert answer["error"]["code"] == "request_timeout"
    assert "past SERVING_REQUEST_TIMEOUT_MS (500 ms)" in answer["error"]["message"]
    assert "-" not in answer["error"]["message"].split("took")[1].split("ms")[0]


def _peak_rss_kb(pid: int) -> int:
    """The process's peak resident set (``VmHWM``), in KiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])


def test_a_small_request_declaring_a_huge_tensor_costs_the_worker_nothing(
    gunicorn: Start, pickled: Pickled
) -> None:
    """The issue's 121-byte V2 request, BYTES of a huge shape with one element (2**28 took
    2.6 GB; 2**24 here, a 128 MB object array): refused before anything of that size
    exists, so the worker's peak RSS stays where it was."""
    server = gunicorn(model_path=pickled(FailsOnNegative(n_features=1), "m.pkl"), workers=1)
    server.wait_ready(workers=1)
    (worker,) = server.worker_pids()
    before = _peak_rss_kb(worker)

    for shape in ([2**24], [1, 2**24]):
        parameters = {"binary_data_size": 9}
        tensor = {"name": "input-0", "shape": shape, "datatype": "BYTES", "parameters": parameters}
        header = json.dumps({"inputs": [tensor]}).encode()
        response = requests.post(
            f"{server.url}/v2/models/m/infer",
            data=header + b"\x05\0\0\0basic",
            headers={"Inference-Header-Content-Length": str(len(header))},
            timeout=60,
        )
        assert response.status_code in (400, 413), response.text[:300]

    assert _peak_rss_kb(worker) - before < 32 * 1024, "the worker allocated the declared shape"
    assert server.worker_pids() == [worker]


def _tensor(name: str, datatype: str, data: list[Any]) -> dict[str, Any]:
    return {"name": name, "shape": [len(data)], "datatype": datatype, "data": data}


def test_unknown_integer_category_is_422_on_every_protocol_and_the_model_starts(
    gunicorn: Start, tmp_path: Path
) -> None:
    """A DataFrame pipeline whose int column ``tier`` (1..3, never 0) feeds a OneHotEncoder
    that refuses unknown values: warm-up fed 0 and the model never started; ``tier: 7``
    reached the model (500 on every protocol, the batch retried in halves)."""
    import joblib

    model, frame = tier_pipeline()
    joblib.dump(model, tmp_path / "tier.joblib")
    server = gunicorn(model_path=tmp_path / "tier.joblib", workers=1)
    server.wait_ready(workers=1)
    known = frame.head(4).to_dict("records")
    rows = [*known, {"tier": 7, "plan": "pro", "usage": 3.5}]
    csv = frame.head(4).assign(tier=[1, 2, 7, 3]).to_csv(index=False)
    v2 = [_tensor("tier", "INT64", [1, 7]), _tensor("plan", "BYTES", ["pro", "pro"]),
          _tensor("usage", "FP64", [1.0, 2.0])]  # fmt: skip
    url = server.url

    answer = requests.post(f"{url}/predict", json={"instances": known}, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["predictions"] == model.predict(frame.head(4)).tolist()

    refusals = [
        ("instances[4].tier", "/predict", {"json": {"instances": rows}}),
        ("instances[4].tier", "/v1/models/tier:predict", {"json": {"instances": rows}}),
        ("dataframe_records[4].tier", "/invocations", {"json": {"dataframe_records": rows}}),
        ("csv[2].tier", "/invocations", {"data": csv, "headers": {"Content-Type": "text/csv"}}),
        ("inputs[0].data[1]", "/v2/models/tier/infer", {"json": {"inputs": v2}}),
    ]
    for where, path, body in refusals:
        response = requests.post(f"{url}{path}", timeout=30, **body)
        assert response.status_code in (400, 422), (path, response.status_code, response.text)
        assert where in response.text and "unknown category 7" in response.text, response.text
    text = requests.get(f"{url}/metrics", timeout=10).text
    errors = "inference_errors_total{" in text and server.metric("inference_errors_total", text)
    assert not errors, "an unknown category reached the model"  # and was retried in halves
    assert "Traceback" not in server.output()


def test_a_body_answered_unread_says_connection_close_when_it_is_not_drained(
    gunicorn: Start, pickled: Pickled
) -> None:
    """A body refused before it is read (413 for its declared length, 415, a wrong model)
    is drained before the next request on the connection, but at most 64 KiB: past that
    Gunicorn closes the connection. The answer said ``Connection: keep-alive``, so the
    client sent its next request on it and lost it (``RemoteDisconnected``: 3 of 4 after
    a 3 MB body against the default 2 MiB limit); a chunked body not read to its end
    (413 past the limit) is of unknown length, so it closes the connection too."""
    server = gunicorn(
        model_path=pickled(FailsOnNegative(n_features=3), "m.pkl"), max_body_bytes=1024
    )
    server.wait_ready()
    big = b'{"instances": [[1, 2, 3]]}' + b" " * 200_000
    small = b'{"instances": [[1, 2, 3]]}' + b" " * 20_000
    json_type = {"Content-Type": "application/json"}
    for path, headers, body, status, kept in [
        ("/predict", json_type, big, 413, False),
        ("/predict", {"Content-Type": "text/plain"}, small + small, 415, True),
        ("/predict/nope", json_type, big, 404, False),
        ("/predict", {"Content-Type": "text/plain"}, big, 415, False),
        ("/predict", json_type, (part for part in [big[:1000]] * 200), 413, False),  # chunked
        ("/predict", json_type, (part for part in [big[:26]]), 200, True),  # chunked, read
    ]:
        with requests.Session() as session:
            refused = session.post(f"{server.url}{path}", data=body, headers=headers, timeout=30)
            following = [server.predict([[1, 2, 3]]).status_code]
            following += [
                session.post(
                    f"{server.url}/predict", json={"instances": [[1, 2, 3]]}, timeout=30
                ).status_code
                for _ in range(3)
            ]

        assert refused.status_code == status, (path, refused.text)
        assert refused.headers["Connection"] == ("keep-alive" if kept else "close"), path
        assert following == [200] * 4, path
