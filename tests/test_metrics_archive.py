"""Folding dead workers' metric files into the archive keeps totals and bounds the files."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from serving.server.metrics_archive import archive_dead_worker

WORKER = """
from serving.observe.metrics import ServingMetrics
m = ServingMetrics()
for status in (200, 200, 503):
    m.observe_request("POST", "/predict", status, 0.003)
import os; print(os.getpid())
"""


def scrape(directory: Path) -> dict[str, float]:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
    samples = {}
    for line in generate_latest(registry).decode().splitlines():
        if line.startswith(("http_requests_total", "http_request_duration_seconds_count")):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def test_archive_dead_worker_keeps_counter_and_histogram_totals(tmp_path: Path) -> None:
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    pids = []
    for _ in range(5):
        run = subprocess.run(
            [sys.executable, "-c", WORKER],
            check=False,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 0, run.stderr
        pids.append(int(run.stdout))
    before = scrape(tmp_path)

    for pid in pids:
        archive_dead_worker(tmp_path, pid, "1")

    assert scrape(tmp_path) == before
    total = 'http_requests_total{method="POST",route="/predict",status="200"}'
    assert before[total] == 10.0
    assert sorted(p.name for p in tmp_path.glob("*.db")) == [
        "counter_archive-1.db",
        "histogram_archive-1.db",
    ]


def test_archive_dead_worker_refuses_to_grow_on_a_full_filesystem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a full tmpfs the master's fold wrote through an mmap past what the filesystem
    could hold: SIGBUS killed the master and the server with it (found by the attack).
    With too little room it now raises ENOSPC and leaves the worker's files alone."""
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    run = subprocess.run(
        [sys.executable, "-c", WORKER], check=True, env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    pid = int(run.stdout)
    before = scrape(tmp_path)
    files = sorted(p.name for p in tmp_path.glob("*.db"))
    real = os.statvfs(tmp_path)

    class Full:
        f_bavail, f_frsize = 4, real.f_frsize  # a few blocks: less than 192 KiB

    monkeypatch.setattr(os, "statvfs", lambda path: Full())
    with pytest.raises(OSError) as refused:
        archive_dead_worker(tmp_path, pid, "1")

    assert refused.value.errno == errno.ENOSPC and "needed to fold" in str(refused.value)
    assert sorted(p.name for p in tmp_path.glob("*.db")) == files  # nothing touched
    assert scrape(tmp_path) == before


def test_archive_dead_worker_removes_an_empty_file(tmp_path: Path) -> None:
    """A worker killed between creating a metric file and sizing it (prometheus-client
    opens it, then truncates it to 64 KiB) leaves it empty: the master's fold raised
    struct.error on it out of child_exit, which ended the master. It holds no samples."""
    (tmp_path / "counter_7.db").touch()

    assert archive_dead_worker(tmp_path, 7, "1") == 0

    assert list(tmp_path.glob("*.db")) == []
    assert scrape(tmp_path) == {}
