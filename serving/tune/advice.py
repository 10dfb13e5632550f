"""Settings for a p99 latency budget from a sweep: batch size and latency, policy,
workers and threads, each with its reason (the rules are ``serving.tune``'s).

Boundary: see README.md beside this file.
"""

from __future__ import annotations

from dataclasses import dataclass

from serving.tune.sweep import KNEE_TOLERANCE, SweepPoint, knee, monotone, plateau_start

__all__ = ["UTILISATION", "Recommendation", "recommend"]

#: The share of measured capacity to plan for (M/D/1 waiting grows as rho / (1 - rho)).
UTILISATION = 0.7


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
