"""Fixtures that run real Gunicorn servers; each is killed (whole process group) afterwards."""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.server import GunicornServer


@pytest.fixture
def gunicorn(tmp_path: Path) -> Iterator[Callable[..., GunicornServer]]:
    """``gunicorn(**settings)`` starts a server (not yet ready) with SERVING_* settings."""
    servers: list[GunicornServer] = []

    def start(**settings: Any) -> GunicornServer:
        server = GunicornServer(tmp_path, **settings).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.kill()


@pytest.fixture
def pickled(tmp_path: Path) -> Callable[[Any, str], Path]:
    """``pickled(model, name)`` writes ``model`` to ``tmp_path/name`` and returns the path."""

    def write(model: Any, name: str) -> Path:
        path = tmp_path / name
        path.write_bytes(pickle.dumps(model))
        return path

    return write


@pytest.fixture
def cpu_hog() -> Iterator[None]:
    """A Python busy loop per core for the test's duration (each ends by itself after 300 s
    at the latest): lifecycle tests must pass on a busy machine, as production is."""
    import os
    import subprocess
    import sys

    loop = "import time\nend = time.monotonic() + 300\nwhile time.monotonic() < end: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(os.cpu_count() or 1)]
    yield
    for hog in hogs:
        hog.kill()
        hog.wait(10)
