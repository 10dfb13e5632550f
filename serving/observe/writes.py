"""A labelled metric child's write as one bound call, for the request path.

prometheus-client's ``Counter.inc``, ``Histogram.observe``, ``Summary.observe`` and
``Gauge.set`` check on every call what a child already is (observable, a non-negative
amount, an exemplar), and a histogram walks its bounds one by one; under Gunicorn a
request pays about fifteen such writes. These functions take a child once (after
``labels()``) and return the write of its values: the same ``inc``/``set`` of the same
value objects (the service's ``MultiProcessValue`` in multiprocess mode, prometheus-client's
``MutexValue`` otherwise), so the
exposition is what the library's own methods give (``tests/test_metrics.py`` compares
them). A child without those values (another prometheus-client layout) gets its public
method instead.

Under multiprocess mode, the writes of one observation (a histogram's sum and bucket, a
summary's count and sum, a predict call's stage counters) take the value class's lock
once (``serving.observe.metric_files.inc_pair``, ``inc_each``).

Also ``never_raises``, which drops a failed write (said once a minute), and ``DepthGauge``.

Boundary: prometheus-client, the standard library, ``serving.observe.metric_files`` and
``serving.observe.complaint``.
"""

from __future__ import annotations

import functools
import logging
from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec

from serving.observe.complaint import Complaint
from serving.observe.metric_files import MultiProcessValue, inc_each, inc_pair

__all__ = [
    "DepthGauge",
    "Write",
    "WriteEach",
    "counter_inc",
    "counters_inc",
    "gauge_set",
    "histogram_observe",
    "never_raises",
    "summary_observe",
]

log = logging.getLogger(__name__)

Write = Callable[[float], None]
#: ``write(amounts)``: each of several counters by its amount, in order.
WriteEach = Callable[[Sequence[float]], None]


def _fused(*values: Any) -> bool:
    """Whether ``values`` are the service's multiprocess values, written under one lock
    (``serving.observe.metric_files``)."""
    return all(type(value) is MultiProcessValue for value in values)


def counter_inc(child: Any) -> Write:
    """``child.inc(amount)``, ``amount >= 0`` (the caller's promise: not checked)."""
    value: Any = getattr(child, "_value", None)
    return value.inc if hasattr(value, "inc") else child.inc  # type: ignore[no-any-return]


def gauge_set(child: Any) -> Write:
    """``child.set(value)``."""
    value: Any = getattr(child, "_value", None)
    return value.set if hasattr(value, "set") else child.set  # type: ignore[no-any-return]


def summary_observe(child: Any) -> Write:
    """``child.observe(amount)``: its count by one, its sum by ``amount``."""
    count, total = getattr(child, "_count", None), getattr(child, "_sum", None)
    if not (hasattr(count, "inc") and hasattr(total, "inc")):
        return child.observe  # type: ignore[no-any-return]
    if _fused(count, total):

        def observe_fused(amount: float) -> None:
            inc_pair(count, 1.0, total, amount)  # type: ignore[arg-type]

        return observe_fused
    count_inc, total_inc = count.inc, total.inc  # type: ignore[union-attr]

    def observe(amount: float) -> None:
        count_inc(1)
        total_inc(amount)

    return observe


def histogram_observe(child: Any) -> Write:
    """``child.observe(amount)``: its sum by ``amount`` and the count of the first bucket
    whose upper bound is at least ``amount`` by one (the bounds end with ``+Inf``), found
    by bisection. ``amount`` is never NaN (durations, sizes): a NaN would count in the
    first bucket where the library counts it in none."""
    total = getattr(child, "_sum", None)
    buckets = getattr(child, "_buckets", None)
    bounds = getattr(child, "_upper_bounds", None)
    if not (hasattr(total, "inc") and buckets and bounds and len(buckets) == len(bounds)):
        return child.observe  # type: ignore[no-any-return]
    upper = list(bounds)
    if _fused(total, *buckets):

        def observe_fused(amount: float) -> None:
            inc_pair(total, amount, buckets[bisect_left(upper, amount)], 1.0)  # type: ignore[arg-type]

        return observe_fused
    total_inc, counts = total.inc, [bucket.inc for bucket in buckets]  # type: ignore[union-attr]

    def observe(amount: float) -> None:
        total_inc(amount)
        counts[bisect_left(upper, amount)](1)

    return observe


def counters_inc(children: Sequence[Any]) -> WriteEach:
    """``child.inc(amount)`` for each child and amount, in order (amounts >= 0)."""
    values = [getattr(child, "_value", None) for child in children]
    if _fused(*values):
        return lambda amounts: inc_each(values, amounts)  # type: ignore[arg-type]
    incs = [counter_inc(child) for child in children]

    def write(amounts: Sequence[float]) -> None:
        for inc, amount in zip(incs, amounts, strict=True):
            inc(amount)

    return write


_P = ParamSpec("_P")
#: Said in the log when metric writes fail, at most once a minute.
_DROPPED = Complaint(log, "metric writes", "no metric (is PROMETHEUS_MULTIPROC_DIR full?)")


def never_raises(write: Callable[_P, None]) -> Callable[_P, None]:
    """``write``, a metric write on the request path, dropped (and said, at most once a
    minute) when it fails: with ``PROMETHEUS_MULTIPROC_DIR`` full a write that needs a
    new key cannot grow its file (``OSError``, ``serving.observe.metric_files``). The
    request is answered; its metrics are lost, not it."""

    @functools.wraps(write)
    def guarded(*args: _P.args, **kwargs: _P.kwargs) -> None:
        try:
            write(*args, **kwargs)
        except OSError as exc:
            _DROPPED.drop(f"{type(exc).__name__}: {exc}")

    return guarded


class DepthGauge:
    """A queue depth gauge child that skips writing the value it holds already (a request
    answered on its caller's thread leaves the depth at 0: no mmap write per call)."""

    __slots__ = ("_child", "_value")

    def __init__(self, child: Any) -> None:
        self._child, self._value = gauge_set(child), -1

    def set(self, depth: int) -> None:
        if depth != self._value:
            self._value = depth
            self._child(depth)
