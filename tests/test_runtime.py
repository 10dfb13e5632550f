"""ModelRuntime: load in the background, bounded load time, readiness states."""

from __future__ import annotations

import pickle
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from serving.errors import ModelLoadError
from serving.model.handle import ModelHandle
from serving.observe.metrics import ServingMetrics
from serving.runtime import ModelRuntime
from serving.settings import Settings
from tests.models import Ballast, SlowLoading


def test_a_load_slower_than_load_timeout_fails_with_the_setting_named(
    settings: Settings, tmp_path: Path
) -> None:
    path = tmp_path / "slow.pkl"
    path.write_bytes(pickle.dumps(SlowLoading(n_features=1, load_s=3.0)))
    configured = Settings(**{**settings.model_dump(), "model_path": path, "load_timeout_s": 0.3})
    runtime = ModelRuntime(configured.model_settings()[0], ServingMetrics(CollectorRegistry()))
    failures: list[BaseException] = []
    failed = threading.Event()

    runtime.start_loading(on_failure=lambda exc: (failures.append(exc), failed.set()))

    assert failed.wait(10)
    assert isinstance(failures[0], ModelLoadError)
    assert "SERVING_LOAD_TIMEOUT_S" in str(failures[0]) and str(path) in str(failures[0])
    assert runtime.state == "failed"


def test_a_load_that_ends_after_its_timeout_serves_nothing_and_keeps_no_metric(
    settings: Settings, tmp_path: Path
) -> None:
    """Found by the attack: a load past SERVING_LOAD_TIMEOUT_S that ended later started a
    batcher nobody stopped and said the version served in /metrics."""
    path = tmp_path / "late.pkl"
    path.write_bytes(pickle.dumps(SlowLoading(n_features=1, load_s=1.0)))
    configured = Settings(**{**settings.model_dump(), "model_path": path, "load_timeout_s": 0.3})
    registry = CollectorRegistry()
    runtime = ModelRuntime(configured.model_settings()[0], ServingMetrics(registry))
    failed = threading.Event()
    batchers = {t for t in threading.enumerate() if t.name == "serving-batcher"}

    thread = runtime.start_loading(on_failure=lambda exc: failed.set())
    assert failed.wait(10)
    thread.join(10)  # the load itself ends, late

    assert runtime.batcher is None and runtime.state == "failed"
    assert "SERVING_LOAD_TIMEOUT_S" in str(runtime.error)
    assert registry.get_sample_value("serving_model_info", {"model": "late"}) is None
    now = {t for t in threading.enumerate() if t.name == "serving-batcher" and t.is_alive()}
    assert now - batchers == set()


def test_a_load_that_ended_leaves_no_timer_holding_its_runtime(
    settings: Settings, tmp_path: Path
) -> None:
    """Found by the attack: each load's SERVING_LOAD_TIMEOUT_S timer (300 s by default)
    ran on after the load, holding the runtime (and a model dropped in place) alive."""
    path = tmp_path / "quick.pkl"
    path.write_bytes(pickle.dumps(SlowLoading(n_features=1, load_s=0.0)))
    configured = Settings(**{**settings.model_dump(), "model_path": path, "load_timeout_s": 300})
    runtime = ModelRuntime(configured.model_settings()[0], ServingMetrics(CollectorRegistry()))
    before = {t for t in threading.enumerate() if isinstance(t, threading.Timer)}

    runtime.start_loading(on_failure=lambda exc: None).join(10)
    time.sleep(0.2)

    timers = {t for t in threading.enumerate() if isinstance(t, threading.Timer)} - before
    assert [t for t in timers if t.is_alive()] == []
    runtime.stop(timeout_s=10)


def test_a_model_that_loads_in_time_calls_on_ready(settings: Settings, tmp_path: Path) -> None:
    path = tmp_path / "quick.pkl"
    path.write_bytes(pickle.dumps(SlowLoading(n_features=1, load_s=0.0)))
    configured = Settings(**{**settings.model_dump(), "model_path": path, "load_timeout_s": 30})
    runtime = ModelRuntime(configured.model_settings()[0], ServingMetrics(CollectorRegistry()))
    ready = threading.Event()

    runtime.start_loading(on_failure=lambda exc: None, on_ready=ready.set)

    assert ready.wait(10)
    assert runtime.state == "ready"
    runtime.stop(timeout_s=10)
    assert runtime.state == "stopping"


def test_load_warms_up_batches_of_one_and_of_max_batch_size(settings: Settings) -> None:
    sizes: list[int] = []

    def record(rows: np.ndarray) -> np.ndarray:
        sizes.append(len(rows))
        return rows[:, 0]

    runtime = ModelRuntime(settings.model_settings()[0], ServingMetrics(CollectorRegistry()))
    runtime.load(ModelHandle.from_callable(record, name="r", version="1", n_features=2))
    runtime.stop(timeout_s=10)

    # then one instance more: the output specs (names, dtypes, shapes) for model metadata
    assert sizes == [1, settings.max_batch_size, 1]
    assert [(spec.name, spec.shape) for spec in runtime.outputs] == [("predictions", (-1,))]


class _Evil:
    """Unpickling it creates ``marker``: shows whether swapped content was ever loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


def test_a_file_swapped_after_the_sha256_check_is_not_what_gets_loaded(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hashlib

    from serving import loading as runtime_module  # where the artifact is read and loaded

    path = tmp_path / "m.pkl"
    good = pickle.dumps(SlowLoading(n_features=1, load_s=0.0))
    path.write_bytes(good)
    marker = tmp_path / "evil-ran"
    evil = pickle.dumps(_Evil(marker))
    checked = runtime_module.check_artifact

    def check_then_swap(*args: object) -> bytes:
        data = checked(*args)  # type: ignore[arg-type]
        path.write_bytes(evil)  # swapped between the hash and the load
        return data

    monkeypatch.setattr(runtime_module, "check_artifact", check_then_swap)
    pinned = {"model_path": path, "model_sha256": hashlib.sha256(good).hexdigest()}
    configured = Settings(**{**settings.model_dump(), **pinned})
    runtime = ModelRuntime(configured.model_settings()[0], ServingMetrics(CollectorRegistry()))

    runtime.load()  # loads the bytes that were hashed

    assert runtime.state == "ready"
    assert not marker.exists(), "the swapped pickle ran"
    monkeypatch.setattr(runtime_module, "check_artifact", checked)
    refused = ModelRuntime(configured.model_settings()[0], ServingMetrics(CollectorRegistry()))
    with pytest.raises(ModelLoadError, match="SHA-256 is"):
        refused.load()  # the swapped file itself is refused
    assert not marker.exists()
    runtime.stop(0)


def test_load_logs_each_stage_with_its_size_and_names_the_stage_while_it_runs(
    settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "slow.pkl"
    path.write_bytes(pickle.dumps(SlowLoading(n_features=1, load_s=0.5)))
    configured = Settings(**{**settings.model_dump(), "model_path": path, "load_timeout_s": 30})
    runtime = ModelRuntime(configured.model_settings()[0], ServingMetrics(CollectorRegistry()))
    ready = threading.Event()
    seen: set[str | None] = set()

    with caplog.at_level("INFO"):  # serving.loading reads and loads, serving.runtime warms up
        runtime.start_loading(on_failure=lambda exc: None, on_ready=ready.set)
        while not ready.wait(0.01):  # the unpickling sleeps 0.5 s: "loading" is seen
            seen.add(runtime.stage)
    runtime.stop(timeout_s=10)

    assert "loading" in seen and runtime.stage is None
    size_mib = f"{path.stat().st_size / 2**20:.1f} MiB"
    assert f"model {path}: read and checked {size_mib}" in caplog.text
    assert "model 'slow': loaded as pickle, 1 float features" in caplog.text
    assert "model 'slow': warmed up" in caplog.text
    keys = ("read and checked", "loaded as", "warmed up", "ready to serve")
    order = [next(i for i, m in enumerate(caplog.messages) if key in m) for key in keys]
    assert order == sorted(order)


def test_load_measures_the_memory_its_own_copy_added(settings: Settings, tmp_path: Path) -> None:
    path = tmp_path / "ballast.pkl"
    path.write_bytes(pickle.dumps(Ballast(n_features=3, mib=48)))
    configured = Settings(**{**settings.model_dump(), "model_path": path})
    registry = CollectorRegistry()
    runtime = ModelRuntime(configured.model_settings()[0], ServingMetrics(registry))
    runtime.load()
    try:
        assert runtime.memory_bytes is not None
        assert 46 * 2**20 <= runtime.memory_bytes <= 120 * 2**20
        assert runtime.shared_memory_bytes is None  # its own copy: nothing from the master
        labels = {"model": runtime.model_name, "version": runtime.model_version}
        gauge = registry.get_sample_value("serving_model_memory_bytes", labels)
        assert gauge == runtime.memory_bytes
    finally:
        runtime.stop(timeout_s=5)
