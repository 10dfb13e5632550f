"""skops files, MLflow 3's default format for scikit-learn models: saved here by MLflow's
own ``mlflow.sklearn.save_model``, loaded only from types the operator trusts, named after
the MLflow folder, and answering as the pipeline does in-process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import skops.io
import yaml
from prometheus_client import CollectorRegistry

from serving.errors import ModelLoadError
from serving.model.loaders import default_loaders, load_model
from serving.observe.metrics import ServingMetrics
from serving.runtime import ModelRuntime
from serving.settings import Settings
from tests.models import RowEcho
from tests.tabular import (
    CHURN_SKOPS_TYPES,
    churn_module,
    churn_rows,
    frame_of,
    save_with_mlflow,
)

CHURN_TYPES = list(CHURN_SKOPS_TYPES)


@pytest.fixture(scope="module")
def churn_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    model = churn_module().churn_pipeline()
    folder = tmp_path_factory.mktemp("mlflow") / "churn_classifier"
    return model, save_with_mlflow(folder, model, CHURN_TYPES)


def test_skops_mlflow_folder_answers_as_the_pipeline_with_the_types_trusted(
    churn_folder: tuple[Any, Path],
) -> None:
    model, path = churn_folder
    assert path.is_file()  # MLflow 3's default: model.skops, no pickle

    handle = load_model(path, loaders=default_loaders(skops_trusted_types=CHURN_TYPES))

    rows = churn_rows()
    expected = frame_of(rows)
    batch = np.zeros(len(rows), dtype=handle.batch_dtype)  # the batch the batcher merges
    for name in batch.dtype.names or ():
        batch[name] = expected[name].to_numpy()
    outputs = handle.predict_batch(batch)
    assert handle.name == "churn_classifier"  # the MLflow folder, not "model"
    assert {f.name for f in handle.features or ()} == {"plan", "region", "seats", "usage_hours"}
    np.testing.assert_array_equal(outputs["predictions"], model.predict(expected))
    np.testing.assert_array_equal(outputs["probabilities"], model.predict_proba(expected))


def test_skops_refuses_types_not_trusted_naming_them_and_the_setting(
    churn_folder: tuple[Any, Path],
) -> None:
    _, path = churn_folder
    with pytest.raises(ModelLoadError) as refused:
        load_model(path)
    message = str(refused.value)
    assert "numpy.dtype" in message and "SERVING_SKOPS_TRUSTED_TYPES" in message


def test_skops_never_trusts_the_list_in_the_models_own_mlmodel(tmp_path: Path) -> None:
    """A crafted model lists its own class in MLmodel's skops_trusted_types: MLflow read
    that list and ran it (GHSA-w582-9x45-8mpx). Here only the operator's list counts."""
    folder = tmp_path / "crafted"
    folder.mkdir()
    (folder / "model.skops").write_bytes(skops.io.dumps(RowEcho(n_features=2)))
    (folder / "MLmodel").write_text(
        yaml.safe_dump({"flavors": {"sklearn": {
            "pickled_model": "model.skops", "serialization_format": "skops",
            "skops_trusted_types": ["tests.models.RowEcho"],
        }}})
    )  # fmt: skip

    with pytest.raises(ModelLoadError, match=r"tests\.models\.RowEcho"):
        load_model(folder / "model.skops")

    trusted = load_model(
        folder / "model.skops",
        loaders=default_loaders(skops_trusted_types=["tests.models.RowEcho"]),
    )
    np.testing.assert_array_equal(
        trusted.predict_batch(np.array([[1.0, 2.0]]))["predictions"],
        RowEcho(n_features=2).predict(np.array([[1.0, 2.0]])),
    )


def test_skops_runtime_serves_a_model_dir_with_the_setting(
    churn_folder: tuple[Any, Path], settings: Settings
) -> None:
    _, path = churn_folder
    configured = settings.model_copy(
        update={"model_dir": path.parent, "skops_trusted_types": "numpy.dtype"}
    )
    runtime = ModelRuntime(configured.model_settings()[0], ServingMetrics(CollectorRegistry()))
    runtime.load()
    try:
        assert runtime.model_name == "churn_classifier"
        assert runtime.handle is not None and runtime.handle.format == "skops"
    finally:
        runtime.stop(timeout_s=10)

    refused = ModelRuntime(
        Settings(**{**settings.model_dump(), "model_dir": path.parent}).model_settings()[0],
        ServingMetrics(CollectorRegistry()),
    )
    with pytest.raises(ModelLoadError, match="SERVING_SKOPS_TRUSTED_TYPES"):
        refused.load()
