"""serving/server/heartbeat.py: a gthread worker's heartbeat, written at most once per
interval however often its main loop wakes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from serving.server import heartbeat


def test_heartbeat_is_written_once_per_interval_not_once_per_wake(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr(heartbeat.time, "monotonic", lambda: now[0])
    writes: list[float] = []
    worker = SimpleNamespace(notify=lambda: writes.append(now[0]))
    heartbeat.throttle_heartbeat(worker, timeout_s=30.0)

    for step in range(30):  # a loop waking every 0.1 s for 3 s
        now[0] = 100.0 + step * 0.1
        worker.notify()

    assert writes == pytest.approx([100.0, 101.0, 102.0])


def test_heartbeat_interval_is_a_quarter_of_a_short_timeout_and_off_without_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [0.0]
    monkeypatch.setattr(heartbeat.time, "monotonic", lambda: now[0])
    writes: list[float] = []
    short = SimpleNamespace(notify=lambda: writes.append(now[0]))
    heartbeat.throttle_heartbeat(short, timeout_s=2.0)
    for step in range(12):
        now[0] = step * 0.1
        short.notify()
    assert writes == pytest.approx([0.0, 0.5, 1.0])

    calls: list[int] = []
    untimed = SimpleNamespace(notify=lambda: calls.append(1))
    heartbeat.throttle_heartbeat(untimed, timeout_s=0)
    for _ in range(3):
        untimed.notify()
    assert calls == [1, 1, 1]
