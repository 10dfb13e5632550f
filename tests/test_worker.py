"""serving/server/worker.py and seams.py: what our worker refuses at start, what it needs
of Gunicorn, and a listening socket that completes no handshake any more."""

from __future__ import annotations

import logging
import socket
import sys

import pytest
from gunicorn.config import Config  # type: ignore[import-untyped]

from serving.server import seams
from serving.server.worker import ServingWorker


def _config(**settings: object) -> Config:
    cfg = Config()
    for name, value in settings.items():
        cfg.set(name, value)
    return cfg


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"certfile": "/etc/ssl/cert.pem", "keyfile": "/etc/ssl/key.pem"}, "terminate TLS"),
        ({"protocol": "uwsgi"}, "not the uwsgi protocol"),
    ],
)
def test_the_worker_refuses_at_start_what_it_does_not_serve(
    settings: dict[str, object], named: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR), pytest.raises(SystemExit):
        ServingWorker.check_config(_config(**settings), logging.getLogger("test"))

    assert named in caplog.text


def test_the_worker_serves_plain_http() -> None:
    ServingWorker.check_config(_config(), logging.getLogger("test"))  # no exit


def test_this_gunicorn_has_every_seam_the_worker_builds_on() -> None:
    assert seams.missing_seam() is None


def test_a_missing_seam_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from gunicorn.workers import gthread  # type: ignore[import-untyped]

    monkeypatch.delattr(gthread.ThreadWorker, "murder_pending")

    assert seams.missing_seam() == (
        "this Gunicorn has no ThreadWorker.murder_pending; install gunicorn>=27,<28"
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a Linux socket filter")
def test_a_refusing_listener_completes_no_handshake_but_keeps_its_backlog() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        address = listener.getsockname()
        waiting = socket.create_connection(address, timeout=5)  # in the backlog already
        waiting.sendall(b"GET / HTTP/1.1\r\n\r\n")

        assert seams.refuse_new_connections(listener)

        late = socket.socket()
        late.settimeout(0.5)
        with pytest.raises(TimeoutError):  # its SYN goes unanswered
            late.connect(address)
        late.close()
        accepted, _ = listener.accept()
        with accepted, waiting:
            assert accepted.recv(64) == b"GET / HTTP/1.1\r\n\r\n"
