"""Shared fixtures: ``settings``, ``app`` and ``client`` around a tiny real in-memory model.

Every test is marked by its folder: ``e2e`` (tests/e2e: real Gunicorn over HTTP), ``deploy``
(tests/deploy: nginx, promtool, manifests), else ``unit`` (in-process), so
``pytest -m unit`` is the fast inner loop."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from flask import Flask
from flask.testing import FlaskClient
from prometheus_client import CollectorRegistry
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from serving.app import create_app
from serving.model.loaders import ModelHandle, estimator_handle
from serving.observe.metrics import ServingMetrics
from serving.settings import Settings
from tests.models import RowEcho

SUITES = {"e2e", "deploy"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test ``unit``, ``e2e`` or ``deploy`` by the folder under tests/ it lives in."""
    tests = Path(__file__).parent
    for item in items:
        folder = item.path.relative_to(tests).parts[0]
        item.add_marker(folder if folder in SUITES else "unit")


@pytest.fixture(scope="session")
def breast_cancer() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's built-in data set: X (569, 30) float64, y (569,) 0 = malignant, 1 = benign."""
    X, y = load_breast_cancer(return_X_y=True)
    return X, y


def unit_settings(monkeypatch: pytest.MonkeyPatch, **overrides: Any) -> Settings:
    """The unit tests' settings (small batches and limits, one worker), with no
    ``SERVING_*`` variable of the environment (``monkeypatch`` removes them)."""
    for name in list(__import__("os").environ):
        if name.startswith("SERVING_"):
            monkeypatch.delenv(name)
    defaults: dict[str, Any] = {
        "max_batch_size": 8, "max_batch_latency_ms": 5, "max_instances_per_request": 16,
        "max_body_bytes": 4096, "workers": 1,
    }  # fmt: skip
    return Settings(**{**defaults, **overrides})


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> Settings:
    return unit_settings(monkeypatch)


@pytest.fixture
def metrics() -> ServingMetrics:
    return ServingMetrics(CollectorRegistry())


@pytest.fixture
def model_handle() -> ModelHandle:
    model = RowEcho(n_features=3)

    def predict(rows: Any) -> Any:
        return {"predictions": model.predict(rows), "probabilities": np.full((len(rows), 2), 0.5)}

    return ModelHandle.from_callable(
        predict, name="echo", version="7", n_features=3, classes=("a", "b")
    )


@pytest.fixture
def app(settings: Settings, model_handle: ModelHandle, metrics: ServingMetrics) -> Iterator[Flask]:
    app = create_app(settings, models=[model_handle], metrics=metrics)
    yield app
    app.extensions["serving"].get_models().stop(timeout_s=10)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture(scope="session")
def frame_classifier() -> tuple[Any, pd.DataFrame]:
    """StandardScaler + LogisticRegression fitted on a pandas DataFrame of the first four
    breast-cancer features, so it knows its ``feature_names_in_``; and that DataFrame."""
    data = load_breast_cancer(as_frame=True)
    X = data.data.iloc[:, :4]
    model = make_pipeline(StandardScaler(), LogisticRegression()).fit(X, data.target)
    return model, X


@pytest.fixture
def named_app(
    settings: Settings, metrics: ServingMetrics, frame_classifier: tuple[Any, pd.DataFrame]
) -> Iterator[Flask]:
    """The app serving ``frame_classifier`` as model ``cancer`` version ``2``."""
    model, _ = frame_classifier
    handle = estimator_handle(model, name="cancer", version="2", format="pickle")
    app = create_app(settings, models=[handle], metrics=metrics)
    yield app
    app.extensions["serving"].get_models().stop(timeout_s=10)


def serve_runtimes(settings: Settings, metrics: ServingMetrics, runtimes: list[Any]) -> Flask:
    """An app serving ``runtimes`` (loaded or not) as its ModelCache, first one the default."""
    from serving.cache import ModelCache

    models = ModelCache(runtimes)
    return create_app(settings, models=models, metrics=metrics)


def sleeping_processes(count: int) -> Iterator[list[int]]:
    """``count`` live processes' pids, standing for workers (a board skips the state of a
    process that is gone); killed afterwards. For a fixture to ``yield from``."""
    import subprocess
    import sys

    code = "import time; time.sleep(60)"
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(count)]
    yield [proc.pid for proc in procs]
    for proc in procs:
        proc.kill()
        proc.wait(10)
