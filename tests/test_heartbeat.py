"""serving/server/heartbeat.py: a worker's heartbeat, written at most once per interval
however often its main loop wakes."""

from __future__ import annotations

import pytest

from serving.server import heartbeat
from serving.server.heartbeat import Heartbeat


def _writes(beat: Heartbeat, now: list[float], wakes: int, step_s: float) -> list[float]:
    written = []
    start = now[0]
    for wake in range(wakes):
        now[0] = start + wake * step_s
        if beat.due():
            written.append(now[0])
    return written


def test_heartbeat_is_written_once_per_interval_not_once_per_wake(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(heartbeat.time, "monotonic", lambda: now[0])

    written = _writes(Heartbeat(timeout_s=30.0), now, wakes=30, step_s=0.1)  # 3 s of wakes

    assert written == pytest.approx([100.0, 101.0, 102.0])


def test_heartbeat_interval_is_a_quarter_of_a_short_timeout_and_off_without_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [0.0]
    monkeypatch.setattr(heartbeat.time, "monotonic", lambda: now[0])

    assert _writes(Heartbeat(timeout_s=2.0), now, wakes=10, step_s=0.1) == pytest.approx([0.0, 0.5])
    now[0] = 0.0
    assert len(_writes(Heartbeat(timeout_s=0), now, wakes=10, step_s=0.1)) == 10
