"""The access log under the real Gunicorn when nobody reads its stdout: every request is
still answered, each worker queues at most SERVING_ACCESS_LOG_QUEUE_LINES lines (the rest
are dropped and counted in /metrics), and SIGTERM still stops every worker by itself, well
within the graceful timeout."""

from __future__ import annotations

import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import joblib
import numpy as np

from serving.settings import DEMO_MODEL_PATH
from tests.e2e.server import GunicornServer

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
