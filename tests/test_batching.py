"""ThreadedBatcher with many threads: triggers, merging, errors, draining. Every wait is bounded."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from serving.batching.arrivals import Arrivals
from serving.batching.batcher import FlushStats, ThreadedBatcher, split_outputs
from serving.errors import InferenceError, InferenceTimeout, InvalidInput, NotReady, Overloaded
from tests.models import FailsOnNegative, ReusedBuffer, RowEcho, WrongLength
from tests.waiting import until

WAIT_S = 10.0


def wait_while(condition: Any) -> None:
    """Poll ``condition()`` until it is false; fail the test after WAIT_S seconds."""
    until(lambda: not condition(), WAIT_S, interval_s=0.001, what="done waiting")


def outputs_of(model: Any) -> Any:
    return lambda rows: {"predictions": model.predict(rows)}


def rows_for(caller: int, n: int = 1, width: int = 3) -> np.ndarray:
    """Rows whose first feature encodes (caller, row): caller * 1000 + row."""
    rows = np.zeros((n, width))
    rows[:, 0] = caller * 1000 + np.arange(n)
    return rows


def run_callers(batcher: ThreadedBatcher, n_callers: int, n_rows: int = 1) -> list[Any]:
    """Submit from n_callers threads released at once; each result or exception, in order."""
    barrier = threading.Barrier(n_callers)

    def call(caller: int) -> Any:
        barrier.wait(WAIT_S)
        try:
            return batcher.submit_many(rows_for(caller, n_rows), timeout_s=WAIT_S)
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(n_callers) as pool:
        return list(pool.map(call, range(n_callers)))


class on_another_thread:
    """A request counted in ``arrivals`` by a thread of its own, until ``leave()``."""

    def __init__(self, arrivals: Arrivals) -> None:
        self._leave = threading.Event()
        entered = threading.Event()

        def carry() -> None:
            arrivals.enter()
            entered.set()
            self._leave.wait(WAIT_S)
            arrivals.leave()

        self._thread = threading.Thread(target=carry, daemon=True)
        self._thread.start()
        assert entered.wait(WAIT_S)
        self._arrivals = arrivals

    def leave(self) -> None:
        count = self._arrivals.count
        self._leave.set()
        self._thread.join(WAIT_S)
        assert self._arrivals.count == count - 1


@pytest.fixture
def stop_after() -> Any:
    batchers: list[ThreadedBatcher] = []
    yield batchers.append
    for batcher in batchers:
        batcher.stop(timeout_s=WAIT_S)


def test_batcher_merges_concurrent_requests_and_returns_each_its_own_rows(stop_after: Any) -> None:
    model = RowEcho(delay_s=0.005)
    batcher = ThreadedBatcher(
        outputs_of(model), max_batch_size=16, max_batch_latency_ms=50, policy="window"
    ).start()
    stop_after(batcher)

    results = run_callers(batcher, 64, n_rows=3)

    for caller, result in enumerate(results):
        np.testing.assert_array_equal(result["predictions"], caller * 1000 + np.arange(3))
    assert max(model.batch_sizes) > 3, "rows of different requests were never merged"
    assert sum(model.batch_sizes) == 64 * 3


def test_batcher_flushes_when_batch_is_full_before_the_latency_window(stop_after: Any) -> None:
    model = RowEcho()
    batcher = ThreadedBatcher(
        outputs_of(model), max_batch_size=4, max_batch_latency_ms=60_000, policy="window"
    )
    stop_after(batcher.start())

    results = run_callers(batcher, 8)

    assert all(isinstance(r, dict) for r in results)
    assert model.batch_sizes == [4, 4]


def test_batcher_flushes_a_partial_batch_when_the_first_instance_has_waited(
    stop_after: Any,
) -> None:
    model = RowEcho()
    batcher = ThreadedBatcher(
        outputs_of(model), max_batch_size=100, max_batch_latency_ms=30, policy="window"
    )
    stop_after(batcher.start())

    result = batcher.submit_many(rows_for(7, 2), timeout_s=WAIT_S)

    np.testing.assert_array_equal(result["predictions"], [7000, 7001])
    assert model.batch_sizes == [2]


def test_batcher_runs_a_request_larger_than_max_batch_size_in_one_call(stop_after: Any) -> None:
    model = RowEcho()
    batcher = ThreadedBatcher(outputs_of(model), max_batch_size=4, max_batch_latency_ms=1)
    stop_after(batcher.start())

    result = batcher.submit_many(rows_for(1, 10), timeout_s=WAIT_S)

    np.testing.assert_array_equal(result["predictions"], 1000 + np.arange(10))
    assert model.batch_sizes == [10]


def test_batcher_never_splits_a_request_that_does_not_fit(stop_after: Any) -> None:
    model = RowEcho()
    batcher = ThreadedBatcher(
        outputs_of(model), max_batch_size=4, max_batch_latency_ms=200, policy="window"
    )
    stop_after(batcher.start())
    with ThreadPoolExecutor(3) as pool:
        small = pool.submit(batcher.submit_many, rows_for(1, 3), WAIT_S)
        wait_while(lambda: batcher.queue_depth < 3)
        large = pool.submit(batcher.submit_many, rows_for(2, 3), WAIT_S)

        np.testing.assert_array_equal(small.result(WAIT_S)["predictions"], 1000 + np.arange(3))
        np.testing.assert_array_equal(large.result(WAIT_S)["predictions"], 2000 + np.arange(3))
    assert model.batch_sizes == [3, 3]


def test_batcher_never_merges_rows_of_different_widths(stop_after: Any) -> None:
    seen: list[tuple[int, ...]] = []

    def predict(rows: np.ndarray) -> dict[str, np.ndarray]:
        seen.append(rows.shape)
        return {"predictions": rows[:, 0]}

    batcher = ThreadedBatcher(
        predict, max_batch_size=32, max_batch_latency_ms=100, policy="window"
    ).start()
    stop_after(batcher)
    with ThreadPoolExecutor(2) as pool:
        narrow = pool.submit(batcher.submit_many, rows_for(1, 2, width=3), WAIT_S)
        wide = pool.submit(batcher.submit_many, rows_for(2, 2, width=5), WAIT_S)
        np.testing.assert_array_equal(narrow.result(WAIT_S)["predictions"], [1000, 1001])
        np.testing.assert_array_equal(wide.result(WAIT_S)["predictions"], [2000, 2001])
    assert sorted(seen) == [(2, 3), (2, 5)]


def test_batcher_isolates_a_failing_request_and_answers_the_others(stop_after: Any) -> None:
    model = FailsOnNegative()
    stats: list[FlushStats] = []
    batcher = ThreadedBatcher(
        outputs_of(model),
        max_batch_size=8,
        max_batch_latency_ms=60_000,
        policy="window",
        on_flush=stats.append,
    )
    stop_after(batcher.start())
    barrier = threading.Barrier(8)

    def call(caller: int) -> Any:
        rows = rows_for(caller)
        if caller == 3:
            rows[0, 0] = -1.0
        barrier.wait(WAIT_S)
        try:
            return batcher.submit_many(rows, timeout_s=WAIT_S)
        except InferenceError as exc:
            return exc

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(call, range(8)))

    failed = [c for c, r in enumerate(results) if isinstance(r, InferenceError)]
    assert failed == [3]
    assert "negative first feature" in results[3].message
    assert isinstance(results[3].__cause__, ValueError)
    for caller, result in enumerate(results):
        if caller != 3:
            assert result["predictions"][0] == caller * 1000
    assert stats[0].batch_size == 8 and isinstance(stats[0].error, ValueError)
    # Bisection: 8 -> 4+4 -> 2+2 -> 1+1: a handful of extra calls, each instance answered once.
    assert len(stats) <= 1 + 2 * 3
    assert sum(s.batch_size for s in stats if s.error is None) == 7
    # The batcher survives: the next (full) batch is answered.
    following = batcher.submit_many(rows_for(9, 8), timeout_s=WAIT_S)
    np.testing.assert_array_equal(following["predictions"], 9000 + np.arange(8))


@pytest.mark.parametrize("bad", [0, 5, 12])
def test_a_failing_request_names_the_instance_the_model_fails_on(stop_after: Any, bad: int) -> None:
    calls: list[int] = []
    model = FailsOnNegative()

    def predict(rows: np.ndarray) -> dict[str, np.ndarray]:
        calls.append(len(rows))
        return {"predictions": model.predict(rows)}

    batcher = ThreadedBatcher(predict, max_batch_latency_ms=0)
    stop_after(batcher.start())
    rows = rows_for(1, 13)
    rows[bad, 0] = -1.0

    with pytest.raises(InferenceError) as caught:
        batcher.submit_many(rows, timeout_s=WAIT_S)

    message = caught.value.message
    assert message.startswith(f"model failed on instances[{bad}] of 13: ValueError: "), message
    assert calls[0] == 13 and len(calls) <= 1 + 2 * 4, calls  # bisection: log2(13) levels
    assert sum(n > 1 for n in calls[1:]) <= 2 * 3, calls  # never the whole request again


def test_a_request_failing_only_as_a_whole_names_no_instance(stop_after: Any) -> None:
    def predict(rows: np.ndarray) -> dict[str, np.ndarray]:
        if len(rows) > 2:
            raise MemoryError("too many rows at once")
        return {"predictions": rows[:, 0]}

    batcher = ThreadedBatcher(predict, max_batch_latency_ms=0).start()
    stop_after(batcher)

    with pytest.raises(InferenceError) as caught:
        batcher.submit_many(rows_for(1, 8), timeout_s=WAIT_S)

    assert caught.value.message == "model failed on 8 instances: MemoryError: too many rows at once"


def test_values_the_model_cannot_compute_name_their_instance(stop_after: Any) -> None:
    def predict(rows: np.ndarray) -> dict[str, np.ndarray]:
        if (rows[:, 1] > 1e300).any():
            raise InvalidInput("the model cannot compute with these values", [
                {"loc": "instances", "msg": "overflow", "type": "model_overflow"}
            ])  # fmt: skip
        return {"predictions": rows[:, 0]}

    batcher = ThreadedBatcher(predict, max_batch_latency_ms=0).start()
    stop_after(batcher)
    rows = rows_for(1, 4)
    rows[2, 1] = 1.7e308

    with pytest.raises(InvalidInput) as caught:
        batcher.submit_many(rows, timeout_s=WAIT_S)

    assert caught.value.message == "instances[2]: the model cannot compute with these values"
    assert caught.value.details == [
        {"loc": "instances[2]", "msg": "overflow", "type": "model_overflow"}
    ]


def test_batcher_survives_a_model_raising_system_exit(stop_after: Any) -> None:
    calls = []

    def predict(rows: np.ndarray) -> dict[str, np.ndarray]:
        calls.append(len(rows))
        if len(calls) == 1:
            raise SystemExit("model called exit()")
        return {"predictions": rows[:, 0]}

    batcher = ThreadedBatcher(predict, max_batch_latency_ms=0).start()
    stop_after(batcher)
    with pytest.raises(InferenceError, match="SystemExit"):
        batcher.submit_many(rows_for(1), timeout_s=WAIT_S)
    assert batcher.running
    assert batcher.submit_many(rows_for(2), timeout_s=WAIT_S)["predictions"][0] == 2000


def test_batcher_answers_its_batch_even_when_its_own_code_fails(
    stop_after: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import serving.batching.calls

    real_concatenate = np.concatenate
    failures = [MemoryError("no room to merge")]

    def flaky_concatenate(*args: Any, **kwargs: Any) -> Any:
        if failures:
            raise failures.pop()
        return real_concatenate(*args, **kwargs)

    monkeypatch.setattr(serving.batching.calls.np, "concatenate", flaky_concatenate)
    batcher = ThreadedBatcher(
        outputs_of(RowEcho()), max_batch_size=3, max_batch_latency_ms=60_000, policy="window"
    )
    stop_after(batcher.start())

    results = run_callers(batcher, 3)

    assert all(isinstance(r, InferenceError) for r in results), results
    assert batcher.running
    assert batcher.submit_many(rows_for(5, 3), timeout_s=WAIT_S)["predictions"][0] == 5000


def test_batcher_reports_how_long_the_model_has_been_busy(stop_after: Any) -> None:
    model = ReusedBuffer()
    model.gate.clear()  # the model runs until the test opens the gate
    batcher = ThreadedBatcher(outputs_of(model), max_batch_latency_ms=0).start()
    stop_after(batcher)
    assert batcher.busy_for_s == 0.0
    with ThreadPoolExecutor(1) as pool:
        submitted = time.monotonic()
        future = pool.submit(batcher.submit_many, rows_for(1), WAIT_S)
        assert model.entered.wait(WAIT_S)
        busy_s = until(lambda: batcher.busy_for_s >= 0.05 and batcher.busy_for_s, WAIT_S)
        assert busy_s <= time.monotonic() - submitted  # this call's time, no more
        until(lambda: batcher.busy_for_s > busy_s, WAIT_S, what="busy_for_s growing")
        model.gate.set()
        future.result(WAIT_S)
    assert batcher.busy_for_s == 0.0


def test_batcher_fails_the_batch_when_the_model_returns_the_wrong_number_of_rows(
    stop_after: Any,
) -> None:
    batcher = ThreadedBatcher(outputs_of(WrongLength()), max_batch_size=4, max_batch_latency_ms=1)
    stop_after(batcher.start())

    with pytest.raises(InferenceError, match="3 rows for a batch of 4"):
        batcher.submit_many(rows_for(1, 4), timeout_s=WAIT_S)


def test_batcher_stop_answers_everything_queued_then_refuses(stop_after: Any) -> None:
    model, gate = RowEcho(delay_s=0.02), threading.Event()

    def held(rows: np.ndarray) -> dict[str, np.ndarray]:
        outputs = {"predictions": model.predict(rows)}
        assert gate.wait(WAIT_S)  # the first call holds the model until every caller queued
        return outputs

    batcher = ThreadedBatcher(held, max_batch_size=2, max_batch_latency_ms=0).start()
    with ThreadPoolExecutor(20) as pool:
        futures = [pool.submit(batcher.submit_many, rows_for(c), WAIT_S) for c in range(20)]
        # Every caller is in (a busy machine starts threads late: one submitting after
        # stop() would be refused, as it should): the rest of them queued.
        wait_while(lambda: batcher.queue_depth + sum(model.batch_sizes) < 20)
        assert batcher.queue_depth >= 10, "callers never queued up behind the slow model"
        gate.set()

        batcher.stop(timeout_s=WAIT_S)

        for caller, future in enumerate(futures):
            assert future.result(WAIT_S)["predictions"][0] == caller * 1000
    assert sum(model.batch_sizes) == 20
    assert batcher.queue_depth == 0
    assert not batcher.running
    with pytest.raises(NotReady):
        batcher.submit_many(rows_for(1), timeout_s=WAIT_S)


def test_batcher_refuses_work_before_start() -> None:
    batcher = ThreadedBatcher(outputs_of(RowEcho()))
    with pytest.raises(NotReady):
        batcher.submit_many(rows_for(1))


def test_batcher_submit_times_out_when_the_model_is_slower_than_the_caller(
    stop_after: Any,
) -> None:
    batcher = ThreadedBatcher(outputs_of(RowEcho(delay_s=0.5)), max_batch_latency_ms=0).start()
    stop_after(batcher)
    with pytest.raises(InferenceTimeout):
        batcher.submit_many(rows_for(1), timeout_s=0.05)


def test_batcher_rejects_empty_or_one_dimensional_input(stop_after: Any) -> None:
    batcher = ThreadedBatcher(outputs_of(RowEcho())).start()
    stop_after(batcher)
    with pytest.raises(ValueError, match="n_instances"):
        batcher.submit_many(np.zeros((0, 3)))
    with pytest.raises(ValueError, match="n_instances"):
        batcher.submit_many(np.zeros(3))


def test_batcher_reports_queue_depth_and_flush_stats(stop_after: Any) -> None:
    stats: list[FlushStats] = []
    batcher = ThreadedBatcher(
        outputs_of(RowEcho()),
        max_batch_size=8,
        max_batch_latency_ms=60_000,
        policy="window",
        on_flush=stats.append,
    )
    stop_after(batcher.start())

    run_callers(batcher, 4, n_rows=2)

    assert [(s.batch_size, s.n_requests, s.error) for s in stats] == [(8, 4, None)]
    assert stats[0].duration_s >= 0 and stats[0].queue_depth == 0


def test_split_outputs_cuts_rows_in_order_and_refuses_mismatches() -> None:
    parts = split_outputs({"p": np.arange(5), "q": np.arange(10).reshape(5, 2)}, [2, 3])
    np.testing.assert_array_equal(parts[0]["p"], [0, 1])
    np.testing.assert_array_equal(parts[1]["q"], [[4, 5], [6, 7], [8, 9]])
    with pytest.raises(InferenceError, match="a scalar"):
        split_outputs({"p": np.float64(1.0)}, [1])
    with pytest.raises(InferenceError, match="4 rows for a batch of 5"):
        split_outputs({"p": np.arange(4)}, [2, 3])


def test_split_outputs_hands_out_copies_not_views_of_the_batch_output() -> None:
    batch = {"p": np.arange(5.0), "q": np.arange(10.0).reshape(5, 2)}
    parts = split_outputs(batch, [2, 3])
    for part in parts:
        for name, array in part.items():
            assert not np.shares_memory(array, batch[name])


def test_batcher_answers_each_caller_its_own_values_from_a_model_reusing_its_output_buffer(
    stop_after: Any,
) -> None:
    """Two batches in sequence: the second overwrites the model's buffer after the first
    caller got its answer and before it reads it (the issue's 1 in 13,802 responses)."""
    model = ReusedBuffer()
    batcher = ThreadedBatcher(outputs_of(model), max_batch_size=8).start()
    stop_after(batcher)
    answered, overwritten = threading.Event(), threading.Event()

    def first() -> list[float]:
        outputs = batcher.submit_many(rows_for(1), timeout_s=WAIT_S)
        answered.set()
        assert overwritten.wait(WAIT_S)
        return list(outputs["predictions"].tolist())

    def second() -> list[float]:
        assert answered.wait(WAIT_S)
        outputs = batcher.submit_many(rows_for(2), timeout_s=WAIT_S)
        overwritten.set()
        return list(outputs["predictions"].tolist())

    with ThreadPoolExecutor(2) as pool:
        one, two = pool.submit(first), pool.submit(second)
        assert (one.result(WAIT_S), two.result(WAIT_S)) == ([1000.0], [2000.0])
    assert model.batch_sizes == [1, 1]


def test_batcher_answers_merged_callers_their_own_values_from_a_reused_output_buffer(
    stop_after: Any,
) -> None:
    model = ReusedBuffer()
    model.gate.clear()
    batcher = ThreadedBatcher(outputs_of(model), max_batch_size=8).start()
    stop_after(batcher)
    with ThreadPoolExecutor(5) as pool:
        first = pool.submit(batcher.submit_many, rows_for(0), WAIT_S)
        assert model.entered.wait(WAIT_S)  # the first call holds the model
        merged = [pool.submit(batcher.submit_many, rows_for(c), WAIT_S) for c in range(1, 5)]
        wait_while(lambda: batcher.queue_depth < 4)
        model.gate.set()
        answers = [future.result(WAIT_S) for future in [first, *merged]]

    batcher.submit_many(np.full((5, 3), -1.0), timeout_s=WAIT_S)  # overwrites out[:5]

    assert model.batch_sizes == [1, 4, 5]
    assert [a["predictions"].tolist() for a in answers] == [[c * 1000.0] for c in range(5)]


def test_adaptive_policy_sends_a_lone_request_at_once_whatever_the_window(
    stop_after: Any,
) -> None:
    model = RowEcho()
    batcher = ThreadedBatcher(outputs_of(model), max_batch_size=32, max_batch_latency_ms=60_000)
    stop_after(batcher.start())

    # With the window policy this would wait 60 s (and time out after WAIT_S).
    result = batcher.submit_many(rows_for(4), timeout_s=WAIT_S)

    assert result["predictions"][0] == 4000
    assert batcher.policy == "adaptive" and model.batch_sizes == [1]


def test_adaptive_policy_batches_what_arrives_while_the_model_is_busy(stop_after: Any) -> None:
    model = RowEcho(delay_s=0.2)
    batcher = ThreadedBatcher(outputs_of(model), max_batch_size=32, policy="adaptive")
    stop_after(batcher.start())
    with ThreadPoolExecutor(11) as pool:
        first = pool.submit(batcher.submit_many, rows_for(0), WAIT_S)
        wait_while(lambda: not model.batch_sizes)  # the first call is running now
        rest = [pool.submit(batcher.submit_many, rows_for(c), WAIT_S) for c in range(1, 11)]
        wait_while(lambda: batcher.queue_depth < 10)

        results = [first.result(WAIT_S)] + [f.result(WAIT_S) for f in rest]

    assert [r["predictions"][0] for r in results] == [c * 1000 for c in range(11)]
    assert model.batch_sizes == [1, 10]


def test_batcher_refuses_an_unknown_policy() -> None:
    with pytest.raises(ValueError, match="policy"):
        ThreadedBatcher(outputs_of(RowEcho()), policy="greedy")  # type: ignore[arg-type]


def test_batcher_drops_instances_whose_caller_gave_up_before_computing_them(
    stop_after: Any,
) -> None:
    model = RowEcho(delay_s=0.3)
    batcher = ThreadedBatcher(outputs_of(model), max_batch_size=4, max_batch_latency_ms=0)
    stop_after(batcher.start())
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(batcher.submit_many, rows_for(1), WAIT_S)
        wait_while(lambda: not model.batch_sizes)
        impatient = pool.submit(batcher.submit_many, rows_for(2), 0.05)
        with pytest.raises(InferenceTimeout):
            impatient.result(WAIT_S)
        assert first.result(WAIT_S)["predictions"][0] == 1000
    # The impatient caller's row was never computed; the batcher goes on.
    assert batcher.submit_many(rows_for(3), timeout_s=WAIT_S)["predictions"][0] == 3000
    assert model.batch_sizes == [1, 1]
    assert batcher.queue_depth == 0


def test_batcher_refuses_at_once_when_the_queue_would_overflow(stop_after: Any) -> None:
    model = RowEcho(delay_s=0.3)
    batcher = ThreadedBatcher(
        outputs_of(model), max_batch_size=1, max_batch_latency_ms=0, max_queue_depth=3
    )
    stop_after(batcher.start())
    with ThreadPoolExecutor(4) as pool:
        running = pool.submit(batcher.submit_many, rows_for(0), WAIT_S)
        wait_while(lambda: not model.batch_sizes)
        queued = pool.submit(batcher.submit_many, rows_for(1, 3), WAIT_S)
        wait_while(lambda: batcher.queue_depth < 3)

        started = time.monotonic()
        with pytest.raises(Overloaded, match="SERVING_MAX_QUEUE_DEPTH"):
            batcher.submit_many(rows_for(2), timeout_s=WAIT_S)
        assert time.monotonic() - started < 0.2  # refused at once, not after waiting

        assert running.result(WAIT_S)["predictions"][0] == 0
        np.testing.assert_array_equal(queued.result(WAIT_S)["predictions"], [1000, 1001, 1002])
    # A request larger than the limit is still taken when the queue is empty.
    assert len(batcher.submit_many(rows_for(3, 5), timeout_s=WAIT_S)["predictions"]) == 5


def recording(calls: list[tuple[str, int]], delay_s: float = 0.0) -> Any:
    """A model echoing the first feature that records (thread name, batch size) per call."""

    def model(rows: np.ndarray) -> dict[str, np.ndarray]:
        calls.append((threading.current_thread().name, len(rows)))
        time.sleep(delay_s)
        return {"predictions": rows[:, 0]}

    return model


def second_call_held(
    calls: list[tuple[str, int]], started: threading.Event, release: threading.Event
) -> Any:
    """A ``recording`` model whose second call (a caller's own, after the first measured
    one) sets ``started`` and waits for ``release``."""
    record = recording(calls)

    def model(rows: np.ndarray) -> dict[str, np.ndarray]:
        if len(calls) == 1:
            started.set()
            assert release.wait(WAIT_S)
        return record(rows)

    return model


def test_adaptive_policy_runs_a_lone_request_on_its_callers_thread_at_low_load(
    stop_after: Any,
) -> None:
    calls: list[tuple[str, int]] = []
    batcher = ThreadedBatcher(recording(calls), name="the-batcher")
    stop_after(batcher.start())
    answered = [batcher.submit(rows_for(c), WAIT_S) for c in range(3)]
    answers = [answer.outputs["predictions"] for answer in answered]

    assert [a.tolist() for a in answers] == [[0.0], [1000.0], [2000.0]]
    me = threading.current_thread().name
    # The first call's duration is unknown, so it goes to the batcher thread; then no hand-off.
    assert calls == [("the-batcher", 1), (me, 1), (me, 1)]
    assert answered[-1].batch_size == 1 and answered[-1].infer_s > 0


def test_adaptive_policy_batches_what_arrives_while_a_caller_runs_its_own_rows(
    stop_after: Any,
) -> None:
    started, release = threading.Event(), threading.Event()
    calls: list[tuple[str, int]] = []
    model = second_call_held(calls, started, release)

    batcher = ThreadedBatcher(model, max_batch_size=8, name="the-batcher")
    stop_after(batcher.start())
    batcher.submit_many(rows_for(9), timeout_s=WAIT_S)  # measures a call on the batcher thread
    with ThreadPoolExecutor(6) as pool:
        leader = pool.submit(batcher.submit_many, rows_for(0), WAIT_S)
        assert started.wait(WAIT_S)
        followers = [pool.submit(batcher.submit_many, rows_for(i), WAIT_S) for i in range(1, 6)]
        wait_while(lambda: batcher.queue_depth < 5)
        release.set()
        assert leader.result(WAIT_S)["predictions"].tolist() == [0.0]
        answers = [f.result(WAIT_S)["predictions"].tolist() for f in followers]

    assert answers == [[1000.0], [2000.0], [3000.0], [4000.0], [5000.0]]
    assert calls[1][0] != "the-batcher" and calls[1][1] == 1
    assert calls[2:] == [("the-batcher", 5)]  # one batch, on the batcher thread


def test_adaptive_policy_hands_a_request_off_while_another_is_on_its_way(
    stop_after: Any,
) -> None:
    arrivals = Arrivals()
    calls: list[tuple[str, int]] = []
    batcher = ThreadedBatcher(recording(calls), name="the-batcher", arrivals=arrivals)
    stop_after(batcher.start())
    batcher.submit_many(rows_for(0), timeout_s=WAIT_S)  # measures a call
    me = threading.current_thread().name

    other = on_another_thread(arrivals)  # another request taken up, still being decoded
    batcher.submit_many(rows_for(1), timeout_s=WAIT_S)
    other.leave()
    batcher.submit_many(rows_for(2), timeout_s=WAIT_S)

    assert calls[1:] == [("the-batcher", 1), (me, 1)]


def test_adaptive_policy_hands_a_request_off_while_others_wait_to_be_taken_up(
    stop_after: Any,
) -> None:
    """Requests ready in the server's poller, or handed to its thread pool, are on their way
    too: counted only from a thread taking them up, a request finding none counted ran
    alone, one after the other (batches of 1.3 in 4 rounds of 5 at 64 connections)."""
    arrivals = Arrivals()
    waiting = [True]
    arrivals.waiting = lambda: waiting[0]
    calls: list[tuple[str, int]] = []
    batcher = ThreadedBatcher(recording(calls), name="the-batcher", arrivals=arrivals)
    stop_after(batcher.start())
    batcher.submit_many(rows_for(0), timeout_s=WAIT_S)  # measures a call

    batcher.submit_many(rows_for(1), timeout_s=WAIT_S)
    waiting[0] = False
    arrivals.hand()
    batcher.submit_many(rows_for(2), timeout_s=WAIT_S)
    arrivals.taken()
    batcher.submit_many(rows_for(3), timeout_s=WAIT_S)

    me = threading.current_thread().name
    assert calls[1:] == [("the-batcher", 1), ("the-batcher", 1), (me, 1)]


def test_adaptive_gate_cannot_lock_in_after_a_quiet_spell(stop_after: Any) -> None:
    """A recorded pattern (issue 19): lone requests for a while, then 30 in flight at once
    in this worker, then lone again. The gate that averaged past batch sizes kept running
    requests one by one on their callers' threads once batches had collapsed; this one
    hands off whenever others are on their way, and runs lone requests inline again."""
    arrivals = Arrivals()
    started, release = threading.Event(), threading.Event()
    calls: list[tuple[str, int]] = []
    record = recording(calls)

    def model(rows: np.ndarray) -> dict[str, np.ndarray]:
        if not release.is_set() and len(calls) == 21:  # the burst's first call: hold it
            started.set()
            assert release.wait(WAIT_S)
        return record(rows)

    batcher = ThreadedBatcher(model, max_batch_size=32, name="the-batcher", arrivals=arrivals)
    stop_after(batcher.start())
    me = threading.current_thread().name
    for c in range(21):  # quiet: one at a time
        batcher.submit_many(rows_for(c), timeout_s=WAIT_S)
    assert calls[1:] == [(me, 1)] * 20

    entered = threading.Barrier(31)

    def request(i: int) -> list[float]:
        arrivals.enter()  # the burst: 30 requests taken up at once
        entered.wait(WAIT_S)
        if i:
            assert started.wait(WAIT_S)  # after the first one's call has begun
        arrivals.leave()  # as DataPlane.infer does just before it queues
        return batcher.submit_many(rows_for(100 + i), WAIT_S)["predictions"].tolist()  # type: ignore[no-any-return]

    with ThreadPoolExecutor(30) as pool:
        first = pool.submit(request, 0)
        rest = [pool.submit(request, i) for i in range(1, 30)]
        entered.wait(WAIT_S)
        assert started.wait(WAIT_S)
        wait_while(lambda: batcher.queue_depth < 29)
        release.set()
        answers = [first.result(WAIT_S), *(f.result(WAIT_S) for f in rest)]

    assert answers == [[(100 + i) * 1000.0] for i in range(30)]
    assert calls[21:] == [("the-batcher", 1), ("the-batcher", 29)]
    batcher.submit_many(rows_for(9), timeout_s=WAIT_S)  # quiet again
    assert calls[-1] == (me, 1)


def test_adaptive_policy_waits_for_a_request_on_its_way(stop_after: Any) -> None:
    arrivals = Arrivals()
    calls: list[tuple[str, int]] = []
    batcher = ThreadedBatcher(
        recording(calls), max_batch_latency_ms=5000, name="the-batcher", arrivals=arrivals
    )
    stop_after(batcher.start())
    other = on_another_thread(arrivals)  # a request taken up, still being decoded
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(batcher.submit_many, rows_for(1), WAIT_S)
        # taken off the queue, not answered: the batcher is waiting for the other one
        wait_while(lambda: batcher._queue.qsize() or not batcher.queue_depth)
        other.leave()
        second = batcher.submit_many(rows_for(2), timeout_s=WAIT_S)
        assert first.result(WAIT_S)["predictions"].tolist() == [1000.0]
    assert second["predictions"].tolist() == [2000.0]
    assert calls == [("the-batcher", 2)]  # one call for both (nobody on the way: no wait,
    # test_adaptive_policy_sends_a_lone_request_at_once_whatever_the_window)


def test_adaptive_policy_keeps_a_slow_call_off_a_caller_with_little_time(stop_after: Any) -> None:
    calls: list[tuple[str, int]] = []
    batcher = ThreadedBatcher(recording(calls, delay_s=0.3), name="the-batcher")
    stop_after(batcher.start())
    batcher.submit_many(rows_for(0), timeout_s=WAIT_S)  # a call takes 0.3 s

    # Run here, the caller could not stop waiting at its deadline: it goes to the batcher.
    with pytest.raises(InferenceTimeout):
        batcher.submit_many(rows_for(1), timeout_s=0.1)
    assert [thread for thread, _ in calls] == ["the-batcher", "the-batcher"]


def test_a_call_on_the_callers_thread_that_ends_past_its_deadline_answers_a_timeout(
    stop_after: Any,
) -> None:
    """The inline path honours the deadline as the queued path does: a call that was
    expected to fit but ended past the caller's deadline gives InferenceTimeout, not
    its outputs (the issue: 200 after 8 s with a 5 s timeout)."""
    calls: list[tuple[str, int]] = []
    record = recording(calls)
    timeout_s = 0.2

    def model(rows: np.ndarray) -> dict[str, np.ndarray]:
        if calls:  # the second call: outlast the caller's deadline, which began before it
            started = time.monotonic()
            wait_while(lambda: time.monotonic() <= started + timeout_s)
        return record(rows)

    batcher = ThreadedBatcher(model, name="the-batcher")
    stop_after(batcher.start())
    batcher.submit_many(rows_for(0), timeout_s=WAIT_S)  # a quick call, measured

    with pytest.raises(InferenceTimeout, match="no prediction within 200 ms"):
        batcher.submit_many(rows_for(1), timeout_s=timeout_s)
    assert calls == [("the-batcher", 1), (threading.current_thread().name, 1)]
    assert batcher.submit_many(rows_for(2), timeout_s=WAIT_S)["predictions"].tolist() == [2000.0]


def test_window_policy_never_runs_a_request_on_its_callers_thread(stop_after: Any) -> None:
    calls: list[tuple[str, int]] = []
    batcher = ThreadedBatcher(
        recording(calls), policy="window", max_batch_latency_ms=1, name="the-batcher"
    )
    stop_after(batcher.start())
    for c in range(3):
        batcher.submit_many(rows_for(c), timeout_s=WAIT_S)
    assert calls == [("the-batcher", 1)] * 3


def test_a_request_run_on_its_callers_thread_fails_alone(stop_after: Any) -> None:
    batcher = ThreadedBatcher(outputs_of(FailsOnNegative())).start()
    stop_after(batcher)
    batcher.submit_many(np.ones((1, 3)), timeout_s=WAIT_S)

    with pytest.raises(InferenceError):
        batcher.submit_many(-np.ones((1, 3)), timeout_s=WAIT_S)
    assert batcher.submit_many(np.ones((1, 3)), timeout_s=WAIT_S)["predictions"].shape == (1,)
    batcher.stop(timeout_s=WAIT_S)
    with pytest.raises(NotReady):
        batcher.submit_many(np.ones((1, 3)), timeout_s=WAIT_S)


def test_batcher_stop_waits_for_a_caller_running_its_own_rows(stop_after: Any) -> None:
    started, release = threading.Event(), threading.Event()
    calls: list[tuple[str, int]] = []
    record = recording(calls)

    def model(rows: np.ndarray) -> dict[str, np.ndarray]:
        if calls:  # the second call: the caller's own
            started.set()
            assert release.wait(WAIT_S)
        return record(rows)

    batcher = ThreadedBatcher(model, name="the-batcher").start()
    batcher.submit_many(rows_for(0), timeout_s=WAIT_S)
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(batcher.submit_many, rows_for(1), WAIT_S)
        assert started.wait(WAIT_S)
        stopping = pool.submit(batcher.stop, WAIT_S)
        # The batcher thread has ended; stop now waits for the caller's answer.
        until(lambda: "the-batcher" not in {t.name for t in threading.enumerate()}, WAIT_S)
        assert not stopping.done()  # the answer being computed is not abandoned
        release.set()
        stopping.result(WAIT_S)
        assert running.result(WAIT_S)["predictions"].tolist() == [1000.0]
    assert calls[1][0] != "the-batcher"


def test_batcher_observes_a_predict_call_before_answering_its_requests(stop_after: Any) -> None:
    # The metrics' flush observer counts the requests a call answered (the V2
    # statistics): a caller holding its answer must find itself counted, even when the
    # observer is slow and the call ran on the batcher thread.
    seen: list[tuple[Any, ...]] = []

    def slow_observer(stats: FlushStats) -> None:
        time.sleep(0.2)  # stands for a slow metrics write, not for an event
        seen.append(stats.tags)

    batcher = ThreadedBatcher(
        outputs_of(RowEcho()), max_batch_size=8, max_batch_latency_ms=0, policy="window",
        on_flush=slow_observer,
    )  # fmt: skip
    stop_after(batcher.start())

    answer = batcher.submit(rows_for(1), timeout_s=WAIT_S, tag="first")

    assert answer.merged == ("first",)
    assert seen == [("first",)]


def test_batcher_reports_the_queue_depth_of_queued_requests_only(stop_after: Any) -> None:
    # The queue depth gauge: written when a request is queued, in order, and not at all
    # for a request run on its caller's thread (it never waits in the queue).
    started, release = threading.Event(), threading.Event()
    depths: list[int] = []
    calls: list[tuple[str, int]] = []
    model = second_call_held(calls, started, release)

    batcher = ThreadedBatcher(model, max_batch_size=8, on_queue=depths.append)
    stop_after(batcher.start())
    batcher.submit_many(rows_for(9), timeout_s=WAIT_S)  # the first call is queued: depth 1
    with ThreadPoolExecutor(4) as pool:
        leader = pool.submit(batcher.submit_many, rows_for(0), WAIT_S)  # on its own thread
        assert started.wait(WAIT_S)
        followers = [pool.submit(batcher.submit_many, rows_for(i, n=2), WAIT_S) for i in (1, 2)]
        wait_while(lambda: batcher.queue_depth < 4)
        release.set()
        leader.result(WAIT_S)
        for follower in followers:
            follower.result(WAIT_S)

    assert depths == [1, 2, 4]
