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

Boundary: prometheus-client, the standard library and ``serving.observe.metric_files``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Sequence
from typing import Any

from serving.observe.metric_files import MultiProcessValue, inc_each, inc_pair

__all__ = [
    "Write",
    "WriteEach",
    "counter_inc",
    "counters_inc",
    "gauge_set",
    "histogram_observe",
    "summary_observe",
]

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
