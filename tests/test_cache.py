"""ModelCache: several model versions per worker, chosen per request, never mixed in a batch."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from flask import Flask
from prometheus_client import CollectorRegistry

from serving.cache import ModelCache
from serving.errors import ModelNotFound, SettingsError, VersionConflict
from serving.model.handle import ModelHandle
from serving.observe.metrics import ServingMetrics
from serving.runtime import ModelRuntime
from serving.settings import Settings, load_settings
from tests.conftest import serve_runtimes
from tests.models import RowOffset

DEMO = Path(__file__).resolve().parent.parent / "serving" / "demo" / "breast_cancer.joblib"


class Recording(RowOffset):
    """A RowOffset that keeps every batch it was called with."""

    def __init__(self, offset: float) -> None:
        super().__init__(n_features=1, offset=offset)
        self.batches: list[list[float]] = []

    def predict(self, X: np.ndarray) -> np.ndarray:
        self.batches.append(X[:, 0].tolist())
        threading.Event().wait(0.002)  # long enough for requests to queue up behind
        return super().predict(X)


def loaded(settings: Settings, metrics: ServingMetrics, name: str, version: str,
           model: RowOffset) -> ModelRuntime:  # fmt: skip
    runtime = ModelRuntime(settings.model_settings()[0], metrics)
    runtime.load(ModelHandle.from_callable(model.predict, name=name, version=version,
                                           n_features=1))  # fmt: skip
    return runtime


@pytest.fixture
def two_versions(settings: Settings) -> tuple[Flask, Recording, Recording, ServingMetrics]:
    metrics = ServingMetrics(CollectorRegistry())
    v1, v2 = Recording(offset=0.0), Recording(offset=1000.0)
    app = serve_runtimes(
        settings,
        metrics,
        [
            loaded(settings, metrics, "m", "1", v1),
            loaded(settings, metrics, "m", "2", v2),
            loaded(settings, metrics, "other", "a", Recording(offset=-1.0)),
        ],
    )
    v1.batches.clear()  # the warmup's zero rows
    v2.batches.clear()
    yield app, v1, v2, metrics
    app.extensions["serving"].get_models().stop(timeout_s=10)


def test_resolve_picks_the_default_model_and_version_or_refuses(settings: Settings) -> None:
    metrics = ServingMetrics(CollectorRegistry())
    runtimes = [ModelRuntime(settings.model_defaults(name=n, version=v, format="callable"),
                             metrics) for n, v in [("m", "1"), ("m", "2"), ("x", "7")]]  # fmt: skip
    cache = ModelCache(runtimes)

    assert cache.resolve() is runtimes[0]
    assert cache.resolve(None, "2") is runtimes[1]
    assert cache.resolve("x") is runtimes[2]
    assert cache.names() == ["m", "x"] and cache.versions("m") == ["1", "2"]
    with pytest.raises(ModelNotFound, match=r"model 'nope' is not served here .*serves m, x"):
        cache.resolve("nope")
    with pytest.raises(VersionConflict, match=r"'3' of model 'm' .* serves '1, 2'"):
        cache.resolve("m", "3")
    assert cache.state == "loading"  # none loaded: not ready


def test_concurrent_requests_get_the_version_they_asked_for_never_mixed(
    two_versions: tuple[Flask, Recording, Recording, ServingMetrics],
) -> None:
    app, v1, v2, metrics = two_versions

    def call(i: int) -> tuple[str, float, float]:
        version = "1" if i % 2 else "2"
        body = {"instances": [[float(i)]], "model_version": version}
        response = app.test_client().post("/predict", json=body)
        assert response.status_code == 200, response.get_json()
        return response.get_json()["model_version"], float(i), response.get_json()["predictions"][0]

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(call, range(200)))

    for version, sent, predicted in answers:
        assert predicted == sent + (0.0 if version == "1" else 1000.0)
        assert version == ("1" if sent % 2 else "2")
    # each model's batches hold only its own requests' rows (odd rows: v1, even rows: v2)
    assert all(row % 2 == 1 for batch in v1.batches for row in batch)
    assert all(row % 2 == 0 for batch in v2.batches for row in batch)
    assert max(len(batch) for batch in v1.batches + v2.batches) > 1, "no batching happened"
    count = metrics.registry.get_sample_value
    labels = {"model": "m", "engine": "python"}
    assert count("inference_batch_size_sum", {**labels, "version": "1"}) == 100
    assert count("inference_batch_size_sum", {**labels, "version": "2"}) == 100


def test_predict_refuses_a_version_this_replica_does_not_serve(
    two_versions: tuple[Flask, Recording, Recording, ServingMetrics],
) -> None:
    app, *_ = two_versions
    response = app.test_client().post("/predict", json={"instances": [[1.0]], "model_version": "9"})
    assert response.status_code == 409
    assert response.get_json()["error"]["code"] == "version_conflict"


def test_healthz_lists_every_model_and_is_ready_only_when_all_are(
    two_versions: tuple[Flask, Recording, Recording, ServingMetrics],
) -> None:
    app, *_ = two_versions
    body = app.test_client().get("/healthz").get_json()
    assert [(m["name"], m["version"], m["status"]) for m in body["models"]] == [
        ("m", "1", "ready"), ("m", "2", "ready"), ("other", "a", "ready")
    ]  # fmt: skip
    assert body["status"] == "ready" and (body["model_name"], body["model_version"]) == ("m", "1")


def test_serving_models_reads_a_json_file_and_narrows_settings_per_model(
    monkeypatch: pytest.MonkeyPatch, settings: Settings, tmp_path: Path
) -> None:
    config = tmp_path / "models.json"
    entries = [
        {"name": "bc", "version": "1", "path": str(DEMO)},
        {"name": "bc", "version": "2", "path": str(DEMO.with_suffix(".onnx")),
         "max_batch_size": 4, "batch_policy": "window"},
    ]  # fmt: skip
    config.write_text(json.dumps(entries))
    monkeypatch.setenv("SERVING_MODELS", str(config))
    monkeypatch.setenv("SERVING_MAX_BATCH_SIZE", "16")

    loaded_settings = load_settings()
    cache = ModelCache.of(loaded_settings.model_settings(), ServingMetrics(CollectorRegistry()))
    cache.start_loading().join(60)

    assert cache.state == "ready"
    first, second = cache.runtimes
    assert (first.settings.max_batch_size, second.settings.max_batch_size) == (16, 4)
    assert second.settings.batch_policy == "window" and first.settings.batch_policy == "adaptive"
    assert first.handle is not None and second.handle is not None
    assert (first.handle.format, second.handle.format) == ("joblib", "onnx")
    cache.stop(timeout_s=10)


@pytest.mark.parametrize(
    ("models", "max_models", "expected"),
    [
        ('[{"name": "a", "path": "%s"}, {"name": "b", "path": "%s"}]', "1",
         "lists 2 models, more than SERVING_MAX_MODELS=1"),
        ('[{"name": "a", "path": "%s"}, {"name": "a", "path": "%s"}]', "8",
         "lists model 'a' version '1' twice"),
        ("[]", "8", "is an empty list"),
        ('{"name": "a", "path": "%s"}', "8", "Input should be a valid list"),
        ("/no/such/models.json", "8", "neither a JSON list nor a readable JSON file"),
    ],
)  # fmt: skip
def test_bad_serving_models_stops_start_up_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, settings: Settings, models: str, max_models: str,
    expected: str,
) -> None:  # fmt: skip
    monkeypatch.setenv("SERVING_MODELS", models.replace("%s", str(DEMO)))
    monkeypatch.setenv("SERVING_MAX_MODELS", max_models)
    with pytest.raises(SettingsError, match=expected) as caught:
        load_settings()
    assert str(caught.value).startswith("SERVING_MODELS: ")
