"""The batch-size sweep: ``predict_batch`` in-process at 1, 2, 4, ..., 1024 instances on
rows drawn from the model's input schema, warmed up, then timed in rounds interleaved
over the sizes; the median per size, read through a monotone envelope; the plateau start
and the knee (``serving.tune`` says why each).

Boundary: see README.md beside this file.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from serving.model.handle import ModelHandle
from serving.model.schema import Feature, structured_dtype

__all__ = [
    "KNEE_TOLERANCE",
    "PLATEAU_FRACTION",
    "SIZES",
    "SweepPoint",
    "knee",
    "monotone",
    "plateau_start",
    "schema_rows",
    "sweep",
]

SIZES = tuple(2**k for k in range(11))  # 1 .. 1024
PLATEAU_FRACTION = 0.9  # "within 10 % of the best rows/s"
KNEE_TOLERANCE = 1.25  # "costs about what a batch of 1 costs": at most 25 % more


@dataclass(frozen=True)
class SweepPoint:
    """One batch size: ``seconds_per_call`` is the median wall time of a predict call, in
    seconds; ``samples`` the timed calls it is the median of (empty for a recorded cost)."""

    batch_size: int
    seconds_per_call: float
    samples: tuple[float, ...] = ()

    @classmethod
    def from_samples(cls, batch_size: int, samples: list[float]) -> SweepPoint:
        """The median of ``samples`` (seconds per call).

        :raises ValueError: when ``samples`` is empty.
        """
        if not samples:
            raise ValueError(f"batch {batch_size}: no timed calls")
        return cls(batch_size, float(np.median(samples)), tuple(samples))

    @property
    def rows_per_s(self) -> float:
        return self.batch_size / self.seconds_per_call

    @property
    def us_per_row(self) -> float:
        return self.seconds_per_call / self.batch_size * 1e6


def schema_rows(features: Sequence[Feature], n: int, seed: int = 0) -> npt.NDArray[Any]:
    """``n`` valid, varied instances of a typed model as the batcher hands them (a record
    array, one field per feature): a known category drawn at random where the schema lists
    them (the only ones taken, or a LightGBM/XGBoost model's pandas categories), else
    standard normal floats, integers 0-99, ``"a"`` for strings, random booleans. Varied so
    that a tree walks different paths, as on real traffic."""
    rng = np.random.default_rng(seed)
    batch = np.zeros(n, dtype=structured_dtype(features))
    for f in features:
        if f.categories or f.pandas_categories:
            known = sorted(f.categories or f.pandas_categories or (), key=repr)
            batch[f.name] = [known[i] for i in rng.integers(0, len(known), n)]
        elif f.kind == "float":
            batch[f.name] = rng.normal(size=n)
        elif f.kind == "integer":
            batch[f.name] = rng.integers(0, 100, n)
        elif f.kind == "boolean":
            batch[f.name] = rng.integers(0, 2, n).astype(bool)
        elif f.dtype.kind == "O":
            batch[f.name] = "a"
    return batch


def sweep(
    handle: ModelHandle,
    rows: npt.NDArray[np.float64],
    sizes: tuple[int, ...] = SIZES,
    *,
    min_time_s: float = 0.2,
    rounds: int = 3,
    warmup_calls: int = 2,
    min_calls: int = 7,
) -> list[SweepPoint]:
    """Time ``handle.predict_batch`` at each size (rows tiled from ``rows``: a matrix
    ``(n, n_features)`` or a record array ``(n,)`` of typed columns, as the batcher merges)
    with ``time.perf_counter``.

    Every size is called ``warmup_calls`` times untimed first; then ``rounds`` passes over
    all sizes each time a size for at least ``min_time_s / rounds`` seconds, so each size
    gets at least ``min_time_s`` seconds and ``min_calls`` calls in all. A size's cost is
    the median of its calls (:meth:`SweepPoint.from_samples`).

    :raises ValueError: when ``sizes`` is empty or ``rounds`` < 1.
    """
    if not sizes or rounds < 1:
        raise ValueError("sweep: give at least one size and one round")
    # rows.shape[1:]: a matrix (n, n_features) or a record array (n,) of typed columns
    batches = {
        size: np.ascontiguousarray(np.resize(rows, (size, *rows.shape[1:]))) for size in sizes
    }
    for batch in batches.values():
        for _ in range(warmup_calls):
            handle.predict_batch(batch)
    samples: dict[int, list[float]] = {size: [] for size in sizes}
    per_round_calls = -(-min_calls // rounds)  # ceiling
    for _ in range(rounds):
        for size, batch in batches.items():
            spent = 0.0
            calls = 0
            while spent < min_time_s / rounds or calls < per_round_calls:
                started = time.perf_counter()
                handle.predict_batch(batch)
                samples[size].append(time.perf_counter() - started)
                spent += samples[size][-1]
                calls += 1
    return [SweepPoint.from_samples(size, samples[size]) for size in sizes]


def monotone(points: list[SweepPoint]) -> list[SweepPoint]:
    """The costs read through a monotone envelope: each size costs at most what any bigger
    size measured (a bigger batch does at least the work of a smaller one, so a smaller
    batch measuring slower is noise: a cold first call, another process's burst).

    ``points`` sorted by batch size; returns new points (samples kept), same order.
    """
    out: list[SweepPoint] = []
    cheapest = float("inf")
    for p in reversed(points):
        cheapest = min(cheapest, p.seconds_per_call)
        out.append(SweepPoint(p.batch_size, cheapest, p.samples))
    return out[::-1]


def knee(points: list[SweepPoint], tolerance: float = KNEE_TOLERANCE) -> SweepPoint:
    """The largest batch whose call costs at most ``tolerance`` x the smallest batch's call:
    the most rows per call for about the latency of one. Read it on :func:`monotone` points."""
    limit = tolerance * points[0].seconds_per_call
    return [p for p in points if p.seconds_per_call <= limit][-1]


def plateau_start(points: list[SweepPoint]) -> SweepPoint:
    """The smallest batch size whose rows/s is within 10 % of the best."""
    best = max(p.rows_per_s for p in points)
    return next(p for p in points if p.rows_per_s >= PLATEAU_FRACTION * best)
