"""``python -m serving.tune --model PATH [--p99-ms 50]``: measure, then recommend settings.

Runs the batch-size sweep (``predict_batch`` in-process at 1, 2, 4, ..., 1024 instances,
rows drawn from the model's input schema, typed columns included) on this machine and
prints recommended ``SERVING_MAX_BATCH_SIZE``,
``SERVING_BATCH_POLICY``/``SERVING_MAX_BATCH_LATENCY_MS``, workers and threads for the p99
latency budget, with the reasoning:

- **plateau start**: the smallest batch size within 10 % of the best rows/s. Past it a
  bigger batch buys almost no throughput and only adds latency.
- **concurrency**: a worker can only batch the requests in flight in it, so no batch
  larger than (concurrent clients / workers) ever forms; bigger settings are no use.
- **queueing budget**: under the adaptive policy a request waits at most for the predict
  call running when it arrives, then its own: about ``2 x t(b)`` for a call of ``b``
  instances taking ``t(b)``. Keep that under half the p99 budget; the other half is
  headroom for HTTP, parsing and bursts.
- **Little's law**: instances in flight per worker = arrival rate x time in system; a
  batch of ``b`` can only form with ``b`` requests waiting, so threads = 2 x b (one batch
  filling while the previous runs).
- **utilisation**: plan for at most 70 % of measured capacity, where queueing delay is
  still small (M/D/1 waiting time grows as rho / (1 - rho)).
- **when no setting meets the budget** (even two calls of one instance exceed half of
  it): the tool says so and recommends the *knee*, the largest batch whose call costs at
  most 25 % more than a call of one instance: the most capacity for about the latency
  that cannot be avoided anyway (a 300-tree forest costs ~the same for 1 and 64 rows).

Measurement: every size is first called a few times (warmup: lazy initialisation, caches,
the allocator), then timed in several rounds interleaved over the sizes, so a burst of
noise from another process spreads over sizes instead of landing on one; each size's cost
is the median of its calls. The recommendation then reads the costs through a monotone
envelope (a batch never costs more than a bigger one), which absorbs a slow outlier that
survives the median.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from serving.model.loaders import ModelHandle
from serving.model.schema import Feature, structured_dtype

__all__ = [
    "Recommendation",
    "SweepPoint",
    "knee",
    "schema_rows",
    "monotone",
    "plateau_start",
    "recommend",
    "sweep",
]

SIZES = tuple(2**k for k in range(11))  # 1 .. 1024
PLATEAU_FRACTION = 0.9  # "within 10 % of the best rows/s"
UTILISATION = 0.7
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
    them, else standard normal floats, integers 0-99, ``"a"`` for strings, random booleans.
    Varied so that a tree walks different paths, as on real traffic."""
    rng = np.random.default_rng(seed)
    batch = np.zeros(n, dtype=structured_dtype(features))
    for f in features:
        if f.categories:
            known = sorted(f.categories, key=repr)
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


@dataclass(frozen=True)
class Recommendation:
    """Settings for a p99 budget. ``expected_p99_ms``: the model's share of p99 at the chosen
    batch (two calls, milliseconds, before HTTP); ``meets_budget``: whether that fits in half
    the budget."""

    max_batch_size: int
    max_batch_latency_ms: float
    workers: int
    threads: int
    capacity_rps: float
    reasons: list[str]
    expected_p99_ms: float = 0.0
    meets_budget: bool = True


def recommend(
    points: list[SweepPoint], p99_ms: float, cpus: int, clients: int = 64
) -> Recommendation:
    """Settings for a p99 budget of ``p99_ms`` milliseconds on ``cpus`` cores with about
    ``clients`` concurrent requests in flight (see the module doc for the rules).

    ``points`` as :func:`sweep` returns them (sorted by batch size); their costs are read
    through :func:`monotone`.

    :raises ValueError: when ``points`` is empty.
    """
    if not points:
        raise ValueError("recommend: no sweep points")
    measured = points
    points = monotone(sorted(points, key=lambda p: p.batch_size))
    plateau = plateau_start(points)
    budget_s = p99_ms / 1000 / 2
    workers = max(1, cpus)
    per_worker = max(1, clients // workers)
    limit = min(plateau.batch_size, per_worker)
    fitting = [p for p in points if p.batch_size <= limit and 2 * p.seconds_per_call <= budget_s]
    reasons = _curve_reasons(
        measured, points, plateau, clients=clients, workers=workers, per_worker=per_worker
    )
    if fitting:
        chosen = fitting[-1]
        reasons.append(
            f"batch {chosen.batch_size} takes {chosen.seconds_per_call * 1000:.2f} ms; 2 calls "
            f"= {2 * chosen.seconds_per_call * 1000:.2f} ms <= half the p99 budget "
            f"({budget_s * 1000:.1f} ms)"
        )
    else:
        chosen = _over_budget(points, p99_ms, budget_s, per_worker, reasons)
    window_ms = max(0.0, round((budget_s - 2 * chosen.seconds_per_call) * 1000, 1))
    threads = 2 * chosen.batch_size
    capacity = workers * chosen.rows_per_s
    reasons += [
        f"adaptive policy needs no window; with the window policy use at most {window_ms} ms "
        "(what is left of half the budget after two calls)",
        f"{workers} workers: one per core, each with 1 BLAS thread",
        f"{threads} threads per worker: one batch filling while one runs (Little's law)",
        f"model capacity about {capacity:,.0f} instances/s at that batch size, before HTTP "
        f"costs; plan for at most {UTILISATION:.0%} of what bench/http_load.py measures",
    ]
    return Recommendation(
        chosen.batch_size,
        window_ms,
        workers,
        threads,
        capacity,
        reasons,
        expected_p99_ms=2 * chosen.seconds_per_call * 1000,
        meets_budget=bool(fitting),
    )


def _curve_reasons(
    measured: list[SweepPoint],
    points: list[SweepPoint],
    plateau: SweepPoint,
    *,
    clients: int,
    workers: int,
    per_worker: int,
) -> list[str]:
    """What the cost curve says before any choice: where the plateau starts, which
    measured costs were read as noise (``monotone``), and whether the clients in flight
    per worker cap the batch below the plateau."""
    reasons = [
        f"plateau starts at batch {plateau.batch_size} "
        f"({plateau.rows_per_s:,.0f} rows/s, {plateau.us_per_row:.1f} us/row)"
    ]
    smoothed = [
        f"{m.batch_size} ({m.seconds_per_call * 1000:.2f} -> {p.seconds_per_call * 1000:.2f} ms)"
        for m, p in zip(sorted(measured, key=lambda p: p.batch_size), points, strict=True)
        if p.seconds_per_call < m.seconds_per_call
    ]
    if smoothed:
        reasons.append(
            "read as costing no more than a bigger batch (noise): batch " + ", ".join(smoothed)
        )
    if per_worker < plateau.batch_size:
        reasons.append(
            f"{clients} concurrent clients over {workers} workers put at most {per_worker} "
            "requests in flight per worker: no bigger batch can form"
        )
    return reasons


def _over_budget(
    points: list[SweepPoint], p99_ms: float, budget_s: float, per_worker: int, reasons: list[str]
) -> SweepPoint:
    """When no batch size fits half the budget in two calls: the knee (most capacity at
    the least latency), capped at ``per_worker``, saying so loudly in ``reasons``."""
    bend = knee(points)
    chosen = max(
        (p for p in points if p.batch_size <= min(bend.batch_size, per_worker)),
        key=lambda p: p.batch_size,
    )
    reasons.append(
        f"NO SETTING MEETS p99 <= {p99_ms:g} ms: even batch {points[0].batch_size} takes "
        f"{points[0].seconds_per_call * 1000:.2f} ms, and two calls "
        f"({2 * points[0].seconds_per_call * 1000:.2f} ms) exceed half the budget "
        f"({budget_s * 1000:.1f} ms: the other half is kept for HTTP and the queue under "
        f"load); the predict calls alone would then take about "
        f"{2 * chosen.seconds_per_call * 1000:.0f} ms of a request's p99"
    )
    reasons.append(
        f"batch {chosen.batch_size} ({chosen.seconds_per_call * 1000:.2f} ms/call) gives the "
        f"most capacity at the least latency: {chosen.rows_per_s / points[0].rows_per_s:.1f}x "
        f"the rows/s of batch {points[0].batch_size} (the largest batch costing at most "
        f"{KNEE_TOLERANCE:.2f}x a call of {points[0].batch_size}"
        + (
            f", capped at the {per_worker} requests in flight per worker)"
            if bend.batch_size > per_worker
            else ")"
        )
    )
    return chosen


def plot(points: list[SweepPoint], path: Path, title: str) -> None:
    """rows/s and us/row against batch size, plateau start marked, saved as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plateau = plateau_start(points)
    fig, left = plt.subplots(figsize=(7, 4))
    sizes = [p.batch_size for p in points]
    left.plot(sizes, [p.rows_per_s for p in points], "o-", label="rows/s")
    left.set_xscale("log", base=2)
    left.set_xlabel("batch size (instances per predict call)")
    left.set_ylabel("rows/s")
    left.axvline(plateau.batch_size, color="grey", linestyle="--", label="plateau start")
    right = left.twinx()
    right.plot(sizes, [p.us_per_row for p in points], "s:", color="tab:red", label="us/row")
    right.set_yscale("log")
    right.set_ylabel("us/row")
    left.set_title(title)
    left.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def load_as_served(
    path: Path, fmt: str | None = None, model_class: str | None = None
) -> ModelHandle:
    """The model at ``path`` loaded exactly as the server loads it (``load_artifact``): a
    directory's one artifact (an MLflow folder's ``model.skops``), its owner, mode and
    SHA-256 checked, the loaders the ``SERVING_*`` environment configures
    (``SERVING_SKOPS_TRUSTED_TYPES``, ``SERVING_ONNX_PROVIDERS``, ...), your own class.

    :raises SettingsError: when those settings are invalid, naming the variable.
    :raises ModelLoadError: naming the path and the cause.
    """
    from pydantic import ValidationError

    from serving.errors import SettingsError
    from serving.loading import load_artifact
    from serving.settings import Settings

    where = {"model_dir": path} if path.is_dir() else {"model_path": path}
    try:
        settings = Settings(**where, model_format=fmt, model_class=model_class, workers=1)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise SettingsError("--model/--format/--class", str(exc.errors()[0]["msg"])) from None
    return load_artifact(settings.model_settings()[0])


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m serving.tune", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--model", type=Path, required=True,
        help="model to measure: a file, or a directory holding one (an MLflow folder)",
    )  # fmt: skip
    parser.add_argument(
        "--format", default=None,
        help="pickle, joblib, skops, onnx or python (default: from the extension)",
    )  # fmt: skip
    parser.add_argument(
        "--class", dest="model_class", default=None,
        help="package.module:ClassName of your own model class (as SERVING_MODEL_CLASS)",
    )  # fmt: skip
    parser.add_argument("--p99-ms", type=float, default=50.0, help="p99 latency budget in ms")
    parser.add_argument(
        "--clients", type=int, default=64, help="concurrent requests expected (default: 64)"
    )
    parser.add_argument(
        "--plot", type=Path, default=Path("tune.png"), help="where to save the plot"
    )
    return parser.parse_args(argv)


def _sweep_rows(handle: ModelHandle) -> npt.NDArray[Any]:
    """Rows to time ``handle`` on: typed rows from its schema; the breast cancer data set
    for a model of 30 numbers (the demo's); else normal noise of its width."""
    from sklearn.datasets import load_breast_cancer

    n_features = handle.n_features or 30
    if handle.features is not None and handle.matrix_dtype is None:  # typed columns
        return schema_rows(handle.features, 1024)
    data: npt.NDArray[Any] = load_breast_cancer().data
    if n_features == data.shape[1]:
        return data
    return np.random.default_rng(0).normal(size=(1024, n_features))


def _print_sweep(points: list[SweepPoint]) -> None:
    print(
        f"{'batch':>6} {'ms/call':>9} {'p10-p90 ms':>17} {'calls':>5} {'rows/s':>12} {'us/row':>9}"
    )
    plateau = plateau_start(points)
    for p in points:
        mark = "  <- plateau start" if p is plateau else ""
        ms = p.seconds_per_call * 1000
        low, high = np.percentile(p.samples, [10, 90]) * 1000
        print(
            f"{p.batch_size:>6} {ms:>9.3f} {low:>8.3f}-{high:<8.3f} {len(p.samples):>5} "
            f"{p.rows_per_s:>12,.0f} {p.us_per_row:>9.1f}{mark}"
        )
    print("(median of the calls after a warmup, sizes timed in interleaved rounds)")


def _print_recommendation(rec: Recommendation, p99_ms: float, clients: int) -> None:
    verdict = "" if rec.meets_budget else " (cannot be met: see below)"
    load = f"{clients} concurrent clients (--clients)"
    print(f"\nfor p99 <= {p99_ms} ms on {os.cpu_count()} cores, {load}{verdict}:")
    print(f"  SERVING_MAX_BATCH_SIZE={rec.max_batch_size}")
    print("  SERVING_BATCH_POLICY=adaptive")
    print(f"  SERVING_MAX_BATCH_LATENCY_MS={rec.max_batch_latency_ms}  (window policy only)")
    print(f"  SERVING_WORKERS={rec.workers}")
    print(f"  SERVING_THREADS={rec.threads}")
    print("because:")
    for reason in rec.reasons:
        print(f"  - {reason}")


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m serving.tune``: time the model's predict call per batch size, print the
    sweep and the settings it recommends, save the plot.

    :param argv: the arguments (default: ``sys.argv[1:]``).
    :raises SystemExit: with a one-line reason when the model cannot be loaded.
    """
    args = _arguments(argv)
    from serving.errors import ModelLoadError, SettingsError

    try:
        handle = load_as_served(args.model, args.format, args.model_class)
    except (ModelLoadError, SettingsError) as exc:
        raise SystemExit(f"serving.tune: {exc}") from None
    points = sweep(handle, _sweep_rows(handle))
    _print_sweep(points)
    rec = recommend(points, args.p99_ms, os.cpu_count() or 1, args.clients)
    _print_recommendation(rec, args.p99_ms, args.clients)
    try:
        plot(points, args.plot, f"{handle.name}: predict_batch sweep")
        print(f"plot saved to {args.plot}")
    except ImportError:
        print("no plot: matplotlib is not installed (pip install -e '.[bench]')")


if __name__ == "__main__":
    main()
