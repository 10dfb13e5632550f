"""Fixtures: two real Gunicorn replicas (stable and canary versions of the demo model) and
the shipped nginx configuration in front of them. Every process is killed afterwards."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.deploy.nginx import NginxServer
from tests.deploy.tools import require
from tests.e2e.server import GunicornServer

STABLE_VERSION = "stable-1"
CANARY_VERSION = "canary-2"


@dataclass
class Deployment:
    """nginx, the stable replica and the canary replica, all started and ready."""

    proxy: NginxServer
    stable: GunicornServer
    canary: GunicornServer


def start_deployment(directory: Path, canary_percent: str = "10") -> Deployment:
    """Both replicas (one worker each: the machine is small) and nginx, ready to serve."""
    require("nginx")
    require("envsubst")
    stable = GunicornServer(directory, workers=1, model_version=STABLE_VERSION).start()
    canary = GunicornServer(directory, workers=1, model_version=CANARY_VERSION).start()
    proxy = NginxServer(
        directory / "nginx",
        stable=f"127.0.0.1:{stable.port}",
        canary=f"127.0.0.1:{canary.port}",
        stable_version=STABLE_VERSION,
        canary_version=CANARY_VERSION,
        canary_percent=canary_percent,
    )
    deployment = Deployment(proxy, stable, canary)
    try:
        stable.wait_ready(workers=1)
        canary.wait_ready(workers=1)
        proxy.start().wait_ready()
    except BaseException:
        stop_deployment(deployment)
        raise
    return deployment


def stop_deployment(deployment: Deployment) -> None:
    deployment.proxy.kill()
    for server in (deployment.stable, deployment.canary):
        if server.proc is not None:
            server.kill()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """One deployment shared by a module's tests that do not stop any of its processes."""
    started = start_deployment(tmp_path_factory.mktemp("deployment"))
    yield started
    stop_deployment(started)


@pytest.fixture
def fresh_deployment(tmp_path: Path) -> Iterator[Deployment]:
    """A deployment of its own, for a test that kills part of it."""
    started = start_deployment(tmp_path)
    yield started
    stop_deployment(started)
