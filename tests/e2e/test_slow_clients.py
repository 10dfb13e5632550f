"""A client that never finishes its headers holds no worker thread for long."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.e2e.server import GunicornServer
from tests.models import RowOffset

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
        time.sleep(4.0)  # past the header timeout, counted from each accept
        assert requests.get(f"{server.url}/livez", timeout=5).status_code == 200
        closed = 0
        for client in stuck:
            client.settimeout(5)
            try:
                closed += client.recv(1) == b""
            except TimeoutError:
                pass  # still open after 5 s more: not closed
            except OSError:
                closed += 1  # reset: closed too
        assert closed == len(stuck)
    finally:
        for client in stuck:
            client.close()
