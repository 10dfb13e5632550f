"""serving.tune: the sweep on a tiny real model and the recommendation rules."""

from __future__ import annotations

import time

import numpy as np

from serving.loaders import ModelHandle
from serving.tune import SweepPoint, plateau_start, recommend, sweep


def test_sweep_times_every_batch_size_on_the_model() -> None:
    seen: list[int] = []

    def model(rows: np.ndarray) -> np.ndarray:
        seen.append(len(rows))
        return rows[:, 0]

    handle = ModelHandle.from_callable(model, name="m", version="1", n_features=2)
    points = sweep(handle, np.ones((3, 2)), sizes=(1, 4, 16), min_time_s=0.001)

    assert [p.batch_size for p in points] == [1, 4, 16]
    assert set(seen) == {1, 4, 16}
    assert all(p.seconds_per_call > 0 for p in points)


def test_sweep_sees_a_fixed_cost_model_plateau_late() -> None:
    def fixed_cost(rows: np.ndarray) -> np.ndarray:
        time.sleep(0.002)  # like a forest: the same cost whatever the batch size
        return rows[:, 0]

    handle = ModelHandle.from_callable(fixed_cost, name="m", version="1", n_features=1)
    points = sweep(handle, np.ones((1, 1)), sizes=(1, 2, 4, 8), min_time_s=0.01)

    assert plateau_start(points).batch_size == 8
    assert points[-1].rows_per_s > 4 * points[0].rows_per_s


def curve(costs_ms: dict[int, float]) -> list[SweepPoint]:
    return [SweepPoint(size, ms / 1000) for size, ms in costs_ms.items()]


def test_plateau_start_is_the_smallest_size_within_ten_percent_of_the_best() -> None:
    # rows/s: 1000, 1800, 3000, 3300, 3400 -> 3300 >= 0.9 * 3400 -> plateau at 32.
    points = curve({4: 4.0, 8: 4.444, 16: 5.333, 32: 9.697, 64: 18.82})
    assert plateau_start(points).batch_size == 32


def test_recommend_caps_the_batch_by_latency_budget_and_concurrency() -> None:
    points = curve({1: 1.0, 2: 1.0, 4: 1.1, 8: 1.2, 16: 2.0, 32: 4.0, 64: 8.0, 128: 16.0})

    roomy = recommend(points, p99_ms=100, cpus=2, clients=256)
    assert roomy.max_batch_size == 16  # plateau start: 16 rows/2 ms beats 8/1.2 by > 10 %
    assert roomy.threads == 32 and roomy.workers == 2

    tight = recommend(points, p99_ms=7, cpus=2, clients=256)
    assert tight.max_batch_size == 8  # 2 x 2.0 ms > 3.5 ms (half the budget); 2 x 1.2 fits

    few_clients = recommend(points, p99_ms=100, cpus=2, clients=8)
    assert few_clients.max_batch_size == 4  # 8 clients / 2 workers
    assert any("no bigger batch can form" in r for r in few_clients.reasons)
