"""Start the real ``gunicorn wsgi:app -c gunicorn.conf.py`` on 127.0.0.1 for a test.

As in Gunicorn's own integration tests: a free port, a new process group, readiness
polled against a monotonic deadline (``tests.waiting.until``), the server's own output
printed when start-up fails, and the exit status checked after SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import requests

from tests.waiting import until

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
        last: list[requests.Response] = []

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"gunicorn exited {self.proc.returncode}:\n{self.output()}")
            if self.output().count("ready to serve") < workers:
                return False
            # A worker logs "ready to serve", then publishes it to the board /healthz
            # reads: on a busy machine the first probe may still see it loading.
            last[:] = [requests.get(f"{self.url}/healthz", timeout=5)]
            return last[0].status_code == 200

        def seen() -> str:
            probe = f"/healthz: {last[0].status_code} {last[0].text}" if last else ""
            return f"gunicorn ready: {probe}\n{self.output()}"

        until(ready, timeout_s, interval_s=0.05, what=seen)

    def wait_for_log(self, text: str, count: int, timeout_s: float = 30.0) -> None:
        """Wait until ``text`` has appeared ``count`` times in the server's output."""
        until(
            lambda: self.output().count(text) >= count, timeout_s, interval_s=0.1,
            what=lambda: f"{text!r} x{count} seen:\n{self.output()}",
        )  # fmt: skip

    def worker_pids(self) -> list[int]:
        """The master's live children (its workers), from /proc."""
        assert self.proc is not None
        pid = self.proc.pid
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]

    def wait_replaced(self, killed: int, ready: int = 2, timeout_s: float = 30) -> None:
        """Wait until worker ``killed`` is gone and ``ready`` workers are ready again
        (``/healthz``): the master forked its replacement and it loaded."""
        until(
            lambda: killed not in self.worker_pids()
            and requests.get(f"{self.url}/healthz", timeout=5).json()["workers"]["ready"]
            == ready,
            timeout_s, interval_s=0.1, what=lambda: f"a replacement ready:\n{self.output()}",
        )  # fmt: skip

    def accepted_connections(self) -> int:
        """Client connections the workers have accepted and hold open (an established TCP
        socket on our port among their file descriptors; one in the backlog is in none)."""
        return sum(self.connections_per_worker().values())

    def connections_per_worker(self) -> dict[int, int]:
        """``accepted_connections`` of each live worker, by pid."""
        established = set()
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rpartition(":")[2], 16) == self.port and fields[3] == "01":
                established.add(f"socket:[{fields[9]}]")
        held = {}
        for pid in self.worker_pids():
            with contextlib.suppress(FileNotFoundError):  # a worker that just exited
                held[pid] = sum(
                    os.readlink(fd) in established for fd in Path(f"/proc/{pid}/fd").iterdir()
                )
        return held

    def answered(self, route: str = "/predict") -> float:
        """Requests to ``route`` answered so far, over every worker (0 before the first)."""
        text = requests.get(f"{self.url}/metrics", timeout=10).text
        label = f'http_requests_total{{route="{route}"}}'
        # the counter's own line: another series of the route (its in-flight gauge, its
        # duration) can show before the first answer is counted
        counted = any(
            line.startswith("http_requests_total{") and f'route="{route}"' in line
            for line in text.splitlines()
        )
        return self.metric(label, text) if counted else 0.0

    def wait_answered(self, count: float, timeout_s: float = 30.0) -> None:
        """Wait until ``count`` /predict requests have been answered in all."""
        until(
            lambda: self.answered() >= count, timeout_s, interval_s=0.1,
            what=lambda: f"{count} requests answered ({self.answered()})",
        )  # fmt: skip

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
        """SIGKILL to the server's whole process group, even when its first master has
        exited: a SIGUSR2 upgrade's new master, or orphaned workers, live on in it (one
        outlived a failed test and held its CPU claims and port)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
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
