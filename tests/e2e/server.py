"""Start the real ``gunicorn wsgi:app -c gunicorn.conf.py`` on 127.0.0.1 for a test.

As in Gunicorn's own integration tests: a free port, a new process group, readiness
polled against a monotonic deadline, the server's own output printed when start-up
fails, and the exit status checked after SIGTERM.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parents[2]
GUNICORN = Path(sys.executable).parent / "gunicorn"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class GunicornServer:
    """One Gunicorn master and its workers, configured by SERVING_* variables."""

    def __init__(self, tmp_path: Path, **settings: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.metrics_dir = tmp_path / f"metrics-{self.port}"
        self.log_path = tmp_path / f"gunicorn-{self.port}.log"
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(tmp_path),
            "SERVING_BIND": f"127.0.0.1:{self.port}",
            "SERVING_WORKERS": "2",
            "SERVING_METRICS_DIR": str(self.metrics_dir),
            "SERVING_GRACEFUL_TIMEOUT_S": "20",
        }
        self.env.update({f"SERVING_{k.upper()}": str(v) for k, v in settings.items()})
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, stdout: int | None = None) -> GunicornServer:
        """Start it in its own session; its output goes to ``log_path``, or with
        ``stdout=subprocess.PIPE`` stdout to a pipe (``proc.stdout``) and stderr there."""
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [str(GUNICORN), "wsgi:app", "-c", "gunicorn.conf.py", "--no-control-socket"],
            cwd=ROOT,
            env=self.env,
            stdout=self._log if stdout is None else stdout,
            stderr=subprocess.STDOUT if stdout is None else self._log,
            start_new_session=True,
        )
        return self

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout_s: float = 60.0, workers: int = 2) -> None:
        """Wait until every worker logged that its model is ready and /healthz says 200."""
        deadline = time.monotonic() + timeout_s
        last: requests.Response | None = None
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"gunicorn exited {self.proc.returncode}:\n{self.output()}")
            if self.output().count("ready to serve") >= workers:
                # A worker logs "ready to serve", then publishes it to the board /healthz
                # reads: on a busy machine the first probe may still see it loading.
                last = requests.get(f"{self.url}/healthz", timeout=5)
                if last.status_code == 200:
                    return
            time.sleep(0.05)
        seen = f"/healthz: {last.status_code} {last.text}" if last is not None else ""
        raise AssertionError(f"gunicorn not ready after {timeout_s}s: {seen}\n{self.output()}")

    def wait_for_log(self, text: str, count: int, timeout_s: float = 30.0) -> None:
        """Wait until ``text`` has appeared ``count`` times in the server's output."""
        deadline = time.monotonic() + timeout_s
        while self.output().count(text) < count:
            assert time.monotonic() < deadline, f"{text!r} x{count} not seen:\n{self.output()}"
            time.sleep(0.1)

    def worker_pids(self) -> list[int]:
        """The master's live children (its workers), from /proc."""
        assert self.proc is not None
        pid = self.proc.pid
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]

    def wait_exit(self, timeout_s: float = 60.0) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"gunicorn still running after {timeout_s}s:\n{self.output()}"
            ) from None

    def terminate(self) -> int:
        """SIGTERM to the master (graceful shutdown); its exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait_exit()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._log.close()

    def predict(self, instances: Any, **kwargs: Any) -> requests.Response:
        return requests.post(
            f"{self.url}/predict", json={"instances": instances}, timeout=30, **kwargs
        )

    def metric(self, name: str, text: str | None = None) -> float:
        """The sum of the samples of ``name`` over its model and version labels in a
        /metrics scrape: ``metric('inference_batch_size_bucket{le="1.0"}')`` matches
        ``inference_batch_size_bucket{le="1.0",model="m",version="1"}``."""
        text = text if text is not None else requests.get(f"{self.url}/metrics", timeout=10).text
        base, _, wanted = name.partition("{")
        wanted_labels = set(wanted.rstrip("}").split(",")) - {""}
        values = []
        for line in text.splitlines():
            sample, _, value = line.rpartition(" ")
            metric, _, labels = sample.partition("{")
            if metric == base and wanted_labels <= set(labels.rstrip("}").split(",")):
                values.append(float(value))
        if not values:
            raise AssertionError(f"{name} not in /metrics:\n{text}")
        return sum(values)
