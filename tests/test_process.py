"""serving.observe.process: this process's id without a system call per request."""

from __future__ import annotations

import os

import pytest

from serving.observe import process, tracing


def test_process_id_is_the_forked_childs_own() -> None:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write_end, f"{process.pid()} {os.getpid()}".encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        seen, actual = pipe.read().decode().split()
    os.waitpid(pid, 0)

    assert seen == actual == str(pid)
    assert process.pid() == os.getpid()


def test_tracing_asks_no_process_id_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    tracing.start_request({}, "POST", "/predict")  # sets up this process's tracer, once
    calls = []
    real = os.getpid
    monkeypatch.setattr(os, "getpid", lambda: calls.append(1) or real())

    for _ in range(10):
        assert tracing.start_request({}, "POST", "/predict") is None  # OTLP not configured

    assert calls == []
