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
