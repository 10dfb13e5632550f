"""``DataPlane.infer`` without a Flask app or request context: real tiny models, a real
``ModelCache`` and ``ModelRuntime`` with their batchers."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from serving.cache import ModelCache
from serving.context import Call
from serving.dataplane import DataPlane
from serving.errors import (
    InferenceTimeout,
    InvalidInput,
    ModelNotFound,
    NotReady,
    Overloaded,
    PayloadTooLarge,
    RequestTimeout,
    VersionConflict,
)
from serving.inputs.instances import Columns, Frame, Records, Tensors
from serving.model.loaders import ModelHandle, estimator_handle
from serving.observe.metrics import ServingMetrics
from serving.runtime import ModelRuntime
from serving.settings import Settings
from tests.models import RowEcho, RowOffset
from tests.waiting import until


def runtime_of(settings: Settings, metrics: ServingMetrics, handle: ModelHandle) -> ModelRuntime:
    runtime = ModelRuntime(settings.model_settings()[0], metrics)
    runtime.load(handle)
    return runtime


@pytest.fixture
def plane(settings: Settings, metrics: ServingMetrics) -> Iterator[DataPlane]:
    """Two versions of model ``offset`` (``1``: +0, ``2``: +100), then model ``echo``."""
    handles = [
        estimator_handle(RowOffset(3, 0.0), name="offset", version="1", format="pickle"),
        estimator_handle(RowOffset(3, 100.0), name="offset", version="2", format="pickle"),
        estimator_handle(RowEcho(3), name="echo", version="7", format="pickle"),
    ]
    cache = ModelCache([runtime_of(settings, metrics, h) for h in handles])
    yield DataPlane(settings, metrics, lambda: cache)
    cache.stop(timeout_s=10)


def soon(plane: DataPlane) -> Call:
    """A call arriving now, due SERVING_REQUEST_TIMEOUT_MS later."""
    return plane.call("test")


def test_dataplane_infer_answers_the_default_model_and_fills_the_calls_timing(
    plane: DataPlane,
) -> None:
    call = soon(plane)
    answer = plane.infer(call, None, None, Frame([[1.0, 2, 3], [4, 5, 6]]))

    assert (answer.handle.name, answer.handle.version) == ("offset", "1")
    np.testing.assert_array_equal(answer.outputs["predictions"], [1.0, 4.0])
    timing = answer.timing
    assert timing is call.timing
    assert (timing.model, timing.version, timing.instances, timing.batch_size) == (
        "offset", "1", 2, 2,
    )  # fmt: skip
    assert timing.conformed is not None and timing.answered is not None
    assert timing.started <= timing.conformed <= timing.answered
    assert timing.infer_s > 0
    stages = timing.stages()
    assert list(stages) == ["queue", "compute_input", "compute_infer", "compute_output"]
    assert stages["compute_infer"] == timing.infer_s and min(stages.values()) >= 0


def test_dataplane_infer_names_the_model_in_the_timing_of_a_refused_call(
    plane: DataPlane,
) -> None:
    call = soon(plane)
    with pytest.raises(InvalidInput):
        plane.infer(call, "echo", None, Frame([[1.0, 2]]))  # 2 features for 3
    assert (call.timing.model, call.timing.version) == ("echo", "7")
    assert call.timing.instances == 0 and call.timing.answered is None


def test_dataplane_infer_picks_the_model_and_version_asked_for(plane: DataPlane) -> None:
    pinned = plane.infer(soon(plane), "offset", "2", Frame([[1.0, 2, 3]]))
    other = plane.infer(
        soon(plane),
        "echo",
        None,
        Records([{"a": 5.0, "b": 6, "c": 7}], unnamed="key_order"),
    )

    np.testing.assert_array_equal(pinned.outputs["predictions"], [101.0])
    assert other.handle.name == "echo" and other.outputs["predictions"].tolist() == [5.0]


def test_dataplane_infer_conforms_every_instances_shape(plane: DataPlane) -> None:
    columns = Columns({"a": [1.0, 2.0], "b": [0.0, 0.0], "c": [0.0, 0.0]}, 2)
    tensors = Tensors([("input-0", np.array([[3.0, 0, 0]]))])

    by_columns = plane.infer(soon(plane), None, None, columns)
    by_tensors = plane.infer(soon(plane), None, None, tensors)

    assert by_columns.outputs["predictions"].tolist() == [1.0, 2.0]
    assert by_tensors.outputs["predictions"].tolist() == [3.0]


@pytest.mark.parametrize(
    ("name", "version", "error"),
    [("nope", None, ModelNotFound), ("offset", "9", VersionConflict)],
)
def test_dataplane_infer_refuses_a_model_not_served(
    plane: DataPlane, name: str, version: str | None, error: type[Exception]
) -> None:
    with pytest.raises(error):
        plane.infer(soon(plane), name, version, Frame([[1.0, 2, 3]]))


def test_dataplane_infer_counts_instances_once_the_model_is_found(plane: DataPlane) -> None:
    too_many = Frame([[1.0, 2, 3]] * 17)  # settings: max_instances_per_request=16
    with pytest.raises(PayloadTooLarge, match="SERVING_MAX_INSTANCES_PER_REQUEST"):
        plane.infer(soon(plane), None, None, too_many)
    with pytest.raises(ModelNotFound):  # an unknown model is a 404 whatever the body
        plane.infer(soon(plane), "nope", None, too_many)
    tensors = Tensors([("input-0", np.zeros((1, 3))), ("b", np.zeros((17, 1)))])
    with pytest.raises(PayloadTooLarge):  # the largest input counts, as V2 declared it
        plane.infer(soon(plane), None, None, tensors)


def test_dataplane_infer_refuses_instances_that_do_not_fit_the_model(plane: DataPlane) -> None:
    with pytest.raises(InvalidInput, match=r"instances\[1\] has 2 features; the model expects 3"):
        plane.infer(soon(plane), None, None, Frame([[1.0, 2, 3], [1.0, 2]]))


def test_dataplane_infer_checks_the_output_names(plane: DataPlane) -> None:
    answer = plane.infer(soon(plane), None, None, Frame([[1.0, 2, 3]]),
                         outputs=["predictions"])  # fmt: skip
    assert answer.outputs["predictions"].tolist() == [1.0]
    with pytest.raises(InvalidInput, match=r"outputs\[0\]: the model has no output 'logits'"):
        plane.infer(soon(plane), None, None, Frame([[1.0, 2, 3]]), outputs=["logits"])


def test_dataplane_infer_is_408_when_the_deadline_passed_before_queueing(
    plane: DataPlane, settings: Settings
) -> None:
    started = time.monotonic() - settings.request_timeout_ms / 1000 - 0.5
    with pytest.raises(RequestTimeout, match="ms to arrive, past SERVING_REQUEST_TIMEOUT_MS"):
        plane.infer(plane.call("late", started=started), None, None, Frame([[1.0, 2, 3]]))


def test_dataplane_infer_is_503_while_the_model_loads(
    settings: Settings, metrics: ServingMetrics
) -> None:
    cache = ModelCache([ModelRuntime(settings.model_settings()[0], metrics)])
    plane = DataPlane(settings, metrics, lambda: cache)

    with pytest.raises(NotReady, match="is not ready \\(loading\\)"):
        plane.infer(soon(plane), None, None, Frame([[1.0, 2, 3]]))
    with pytest.raises(NotReady):
        plane.ready()


def test_dataplane_ready_gives_the_runtime_and_handle(plane: DataPlane) -> None:
    runtime, handle = plane.ready("offset", "2")

    assert runtime.model_version == handle.version == "2"


def test_dataplane_infer_counts_queue_depth_and_rejections(
    settings: Settings, metrics: ServingMetrics
) -> None:
    release = threading.Event()

    def slow(X: np.ndarray) -> np.ndarray:
        if X.any():  # not the warmup's zero rows
            release.wait(10)
        return X[:, 0]

    small = Settings(**{**settings.model_dump(), "max_queue_depth": 2, "max_batch_size": 1})
    handle = ModelHandle.from_callable(slow, name="slow", version="1", n_features=1)
    cache = ModelCache([runtime_of(small, metrics, handle)])
    plane = DataPlane(small, metrics, lambda: cache)
    batcher = cache.default.batcher
    assert batcher is not None
    labels = {"model": "slow", "version": "1"}
    callers = [
        threading.Thread(target=plane.infer, args=(soon(plane), None, None, Frame([[1.0]])))
        for _ in range(3)
    ]  # fmt: skip
    try:
        callers[0].start()
        until(lambda: batcher.busy_for_s > 0, 10, interval_s=0.001, what="the model busy")
        for caller in callers[1:]:
            caller.start()
        until(lambda: batcher.queue_depth >= 2, 10, interval_s=0.001, what="2 queued")
        with pytest.raises(Overloaded):
            plane.infer(soon(plane), None, None, Frame([[1.0]]))
        depth = metrics.registry.get_sample_value("inference_queue_depth", labels)
        assert depth == 2
        assert metrics.registry.get_sample_value("inference_rejected_total", labels) == 1
    finally:
        release.set()
        for caller in callers:
            caller.join(10)
        cache.stop(timeout_s=10)


@pytest.mark.parametrize("policy", ["window", "adaptive"])
def test_dataplane_counts_a_request_that_timed_out_once_and_as_failed(
    settings: Settings, metrics: ServingMetrics, policy: str
) -> None:
    """Found by the attack: the flush observer counted a request whose predict call
    ended after its caller gave up (504) as answered, so the V2 statistics held it twice
    (``fail`` from the data plane, then ``success`` from the observer: queued) or as a
    success (on the caller's own thread, ``adaptive``)."""
    release, entered = threading.Event(), threading.Event()

    def slow(X: np.ndarray) -> np.ndarray:
        if X.any():  # not the warm-up's zero rows
            entered.set()
            release.wait(10)
        return X[:, 0]

    short = Settings(**{**settings.model_dump(), "request_timeout_ms": 300, "batch_policy": policy})
    handle = ModelHandle.from_callable(slow, name="slow", version="1", n_features=1)
    cache = ModelCache([runtime_of(short, metrics, handle)])
    plane = DataPlane(short, metrics, lambda: cache)
    batcher = cache.default.batcher
    assert batcher is not None

    def requests(outcome: str) -> float:
        labels = {"model": "slow", "version": "1", "outcome": outcome}
        return metrics.registry.get_sample_value("inference_requests_total", labels) or 0.0

    try:
        # window: the caller gives up in the queue; adaptive: the call runs on the
        # caller's own thread and ends past its deadline
        threading.Timer(0.6, release.set).start()
        with pytest.raises(InferenceTimeout):
            plane.infer(soon(plane), None, None, Frame([[1.0]]))
        assert entered.wait(10)
        until(lambda: batcher.busy_for_s == 0, 10, interval_s=0.01, what="the call done")
        until(lambda: batcher.queue_depth == 0, 10, interval_s=0.01, what="the queue empty")
        time.sleep(0.05)  # the observer runs right after the call: let it finish
        assert (requests("success"), requests("fail")) == (0.0, 1.0)
    finally:
        release.set()
        cache.stop(timeout_s=10)
