"""``until``: the one way a test waits for something to happen. It polls a condition
against a ``time.monotonic()`` deadline and fails naming what it waited for: no sleep that
stands for an event, no hand-written poll loop."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["until"]

T = TypeVar("T")


def until(
    condition: Callable[[], T],
    timeout_s: float = 30.0,
    *,
    interval_s: float = 0.02,
    what: str | Callable[[], str] = "the condition",
) -> T:
    """Call ``condition`` every ``interval_s`` seconds until it returns something truthy,
    and return that; after ``timeout_s`` seconds, fail.

    :param what: what is waited for, or a callable giving it (called once, on failure:
        a server's output, the last value seen).
    :raises AssertionError: ``"not <what> after <timeout_s> s"``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            shown = what() if callable(what) else what
            raise AssertionError(f"not {shown} after {timeout_s} s")
        time.sleep(interval_s)
