"""serving.server.respawn: the pause in forking after workers die while loading."""

from __future__ import annotations

import pytest

from serving.server.respawn import FIRST_S, MAX_S, Backoff

pytestmark = pytest.mark.unit


def test_backoff_doubles_after_each_death_up_to_its_maximum_and_settles() -> None:
    now = [100.0]
    backoff = Backoff(clock=lambda: now[0])
    assert not backoff.holding()
    pauses = [backoff.died_loading() for _ in range(9)]
    assert pauses == [1, 2, 4, 8, 16, 32, 60, 60, 60] and pauses[-1] == MAX_S
    assert backoff.holding()
    now[0] += MAX_S - 0.1
    assert backoff.holding()
    now[0] += 0.2
    assert not backoff.holding()
    backoff.settle()
    assert backoff.died_loading() == FIRST_S


def test_backoff_settled_ends_the_pause_at_once() -> None:
    """Found by the second attack: the pause outlived the crash loop (``settle`` only
    reset the doubling), so a healthy worker killed after the fleet served again was not
    replaced for 58 s."""
    now = [0.0]
    backoff = Backoff(clock=lambda: now[0])
    for _ in range(7):
        backoff.died_loading()
    assert backoff.holding()
    backoff.settle()
    assert not backoff.holding()
