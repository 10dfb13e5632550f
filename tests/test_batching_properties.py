"""Property-based tests of ThreadedBatcher (hypothesis): random request sizes, thread counts,
failing instances, deadlines, batch sizes and policies."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving.batching.batcher import ThreadedBatcher
from serving.errors import InferenceError, InferenceTimeout

request_spec = st.tuples(
    st.integers(min_value=1, max_value=6),  # rows
    st.booleans(),  # holds a failing instance
    st.sampled_from([None, None, None, 0.0005]),  # timeout_s (a tiny one sometimes)
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=st.lists(request_spec, min_size=1, max_size=24),
    threads=st.integers(min_value=1, max_value=12),
    max_batch_size=st.integers(min_value=1, max_value=16),
    policy=st.sampled_from(["adaptive", "window"]),
)
def test_every_caller_gets_its_own_rows_or_its_own_error(
    requests: list[tuple[int, bool, float | None]],
    threads: int,
    max_batch_size: int,
    policy: str,
) -> None:
    computed: list[float] = []  # row ids in calls that succeeded
    lock = threading.Lock()

    def model(rows: np.ndarray) -> dict[str, np.ndarray]:
        if (rows[:, 0] < 0).any():
            raise ValueError("failing instance")
        with lock:
            computed.extend(rows[:, 0].tolist())
        return {"predictions": rows[:, 0] * 2}

    batcher = ThreadedBatcher(
        model,
        max_batch_size=max_batch_size,
        max_batch_latency_ms=1,
        policy=policy,  # type: ignore[arg-type]
    ).start()

    def call(index: int) -> Any:
        n, failing, timeout_s = requests[index]
        rows = np.zeros((n, 2))
        rows[:, 0] = index * 100 + np.arange(n) + 1
        if failing:
            rows[n - 1, 0] = -1.0
        try:
            return batcher.submit_many(rows, timeout_s=timeout_s if timeout_s else 10.0)
        except (InferenceError, InferenceTimeout) as exc:
            return exc

    try:
        with ThreadPoolExecutor(threads) as pool:
            results = list(pool.map(call, range(len(requests))))
    finally:
        batcher.stop(timeout_s=10)

    for index, ((n, failing, timeout_s), result) in enumerate(zip(requests, results, strict=True)):
        if isinstance(result, InferenceTimeout):
            assert timeout_s is not None  # only a caller with a deadline times out
        elif failing:
            assert isinstance(result, InferenceError) and "failing instance" in result.message
        else:
            assert isinstance(result, dict), result
            expected = (index * 100 + np.arange(n) + 1) * 2
            np.testing.assert_array_equal(result["predictions"], expected)
    # No instance is computed twice by calls that succeeded (retries happen only when
    # isolating a failure, and a failed call computes nothing).
    assert len(computed) == len(set(computed))
    assert batcher.queue_depth == 0
