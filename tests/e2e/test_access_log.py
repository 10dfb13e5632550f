"""The access log under the real Gunicorn when nobody reads its stdout: every request is
still answered, each worker queues at most SERVING_ACCESS_LOG_QUEUE_LINES lines (the rest
are dropped and counted in /metrics), and SIGTERM still stops every worker by itself, well
within the graceful timeout."""

from __future__ import annotations

import os
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import joblib
import numpy as np
import requests

from serving.settings import DEMO_MODEL_PATH
from tests.e2e.server import GUNICORN, ROOT, GunicornServer
from tests.waiting import until

#: Bytes a pipe holds before a write blocks (Linux's default), with the room for
#: Python's own stdout buffer: the most lines that can leave a worker nobody reads.
PIPE_BYTES = 64 * 1024 + 2 * 8192


class UnreadStdout(GunicornServer):
    """A GunicornServer whose stdout is a pipe nobody reads (stderr goes to the log)."""

    def start(self, stdout: int | None = subprocess.PIPE) -> UnreadStdout:
        super().start(stdout)
        return self

    def kill(self) -> None:
        super().kill()
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()


def test_access_log_stdout_nobody_reads_drops_counted_lines_and_stops_cleanly(
    tmp_path: Path, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    # Reported: stdout on a pipe nobody reads grew a worker by ~0.5 KB per request (an
    # unbounded queue) and made shutdown wait 10 s.
    X, _ = breast_cancer
    expected = joblib.load(DEMO_MODEL_PATH).predict(X[:100]).tolist()
    limit, count = 50, 800
    server = UnreadStdout(tmp_path, access_log_queue_lines=limit, graceful_timeout_s=30)
    server.start()
    try:
        server.wait_ready()
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda i: server.predict([X[i % 100].tolist()]), range(count)))
        assert [a.status_code for a in answers] == [200] * count
        assert [a.json()["predictions"][0] for a in answers] == [
            expected[i % 100] for i in range(count)
        ]
        dropped = server.metric('access_log_dropped_total{reason="queue_full"}')
        # Lines not dropped: each worker's queue and what its writer took, and the pipe.
        assert dropped >= count - 2 * 2 * limit - PIPE_BYTES // 150, dropped
        # Each worker gives its writer 2 s, then goes; past the graceful timeout (30 s)
        # the master would SIGKILL them.
        server.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        assert server.wait_exit(12) == 0
    finally:
        server.kill()
    output = server.output()
    assert "Fatal Python error" not in output, output
    assert output.count("access log lines dropped") <= 2 + 2  # each worker: queue, stop


class UnreadOutput(UnreadStdout):
    """A GunicornServer whose stdout and stderr both go to one pipe nobody reads."""

    def start(self, stdout: int | None = subprocess.PIPE) -> UnreadOutput:
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [str(GUNICORN), "wsgi:app", "-c", "gunicorn.conf.py", "--no-control-socket"],
            cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        return self

    def wait_serving(self, workers: int) -> None:
        """Wait until ``workers`` workers run and /healthz says 200 (the log is unread)."""

        def serving() -> bool:
            assert self.proc is not None and self.proc.poll() is None, "gunicorn exited"
            try:
                healthy = requests.get(f"{self.url}/healthz", timeout=2).status_code == 200
            except requests.RequestException:
                return False
            return healthy and len(self.worker_pids()) == workers

        until(serving, 60, interval_s=0.1, what="gunicorn serving")


def test_stdout_and_stderr_nobody_reads_leave_the_master_handling_signals(
    tmp_path: Path, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    """Found by the attack: with stdout and stderr both on one pipe nobody reads, the
    access log filled it and the master blocked writing its own log line: it ignored
    SIGTERM (still running after 20 s) and replaced no killed worker. Its error log now
    drops lines instead (serving/server/error_log.py)."""
    X, _ = breast_cancer
    server = UnreadOutput(tmp_path, access_log_queue_lines=50, log_level="debug")
    server.start()
    try:
        server.wait_serving(workers=2)
        with ThreadPoolExecutor(8) as pool:  # ~600 access log lines: the pipe is full
            answers = list(pool.map(lambda i: server.predict([X[i % 100].tolist()]), range(600)))
        assert [a.status_code for a in answers] == [200] * 600
        first = server.worker_pids()[0]
        os.kill(first, signal.SIGKILL)  # the master logs its exit, then forks another
        until(
            lambda: first not in server.worker_pids() and len(server.worker_pids()) == 2,
            30, interval_s=0.1, what="a new worker in place of the killed one",
        )  # fmt: skip
        assert server.predict([X[0].tolist()]).status_code == 200
        server.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        assert server.wait_exit(30) == 0
    finally:
        server.kill()
