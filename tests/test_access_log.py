"""The access log's writer in-process, its stdout replaced by one that blocks (a pipe
nobody reads): it holds at most twice ``max_lines``, drops are counted, stop() waits a
bounded time."""

from __future__ import annotations

import io
import threading
from collections import Counter

import pytest

from serving.observe.access_log import AccessLog


class BlockedStdout(io.StringIO):
    """A stdout whose writes block until ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.entered = threading.Event()

    def write(self, text: str) -> int:
        self.entered.set()
        self.release.wait(30)
        return super().write(text)


def test_access_log_blocked_stdout_holds_at_most_max_lines_and_counts_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = BlockedStdout()
    monkeypatch.setattr("sys.stdout", out)
    dropped: Counter[str] = Counter()
    access = AccessLog(max_lines=10, on_drop=lambda reason, n: dropped.update({reason: n}))
    access.start()

    access.write({"i": 0})
    assert out.entered.wait(10)  # the writer is stuck in its first write
    for i in range(1, 1000):
        access.write({"i": i})

    assert access.pending <= 2 * 10  # queued, and taken by the stuck writer
    assert dropped["queue_full"] >= 1000 - 2 * 10
    access.stop(timeout_s=0.2)  # the writer is still stuck: give up on what it holds
    assert dropped["stopped"] >= 1
    out.release.set()  # the write under way ends, and the writer with it
    access.stop(timeout_s=10)
    written = len(out.getvalue().splitlines())
    assert 1 <= written <= 2 * 10
    assert sum(dropped.values()) + written == 1000  # each line written or counted


def test_access_log_writes_every_line_when_stdout_keeps_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = io.StringIO()
    monkeypatch.setattr("sys.stdout", out)
    dropped: Counter[str] = Counter()
    access = AccessLog(max_lines=10_000, on_drop=lambda reason, n: dropped.update({reason: n}))
    access.start()
    for i in range(500):
        access.write({"i": i})
    access.stop(timeout_s=10)
    lines = out.getvalue().splitlines()
    assert len(lines) == 500 and not dropped
