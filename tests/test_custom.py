"""serving/model/custom.py: a user's class served through load_model, like any artifact."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from serving.errors import ModelLoadError
from serving.model.custom import PythonLoader, import_class, python_handle
from serving.model.loaders import load_model
from tests.e2e.server import ROOT


class Scaled:
    """load() reads a factor from the file; preprocess adds 1; postprocess names outputs."""

    feature_names = ("a", "b")

    def load(self, path: Path) -> None:
        self.factor = float(Path(path).read_text())

    def preprocess(self, instances: np.ndarray) -> np.ndarray:
        return instances + 1.0

    def predict(self, instances: np.ndarray) -> np.ndarray:
        return instances.sum(axis=1) * self.factor

    def postprocess(self, predictions: np.ndarray) -> dict[str, Any]:
        return {"predictions": predictions, "doubled": predictions * 2}


class NoPredict:
    def load(self, path: Path) -> None:
        pass


@pytest.fixture
def factor_file(tmp_path: Path) -> Path:
    path = tmp_path / "factor.txt"
    path.write_text("3")
    return path


def test_python_loader_calls_load_then_preprocess_predict_postprocess(factor_file: Path) -> None:
    handle = load_model(
        factor_file, "python", name="s", loaders={"python": PythonLoader(f"{__name__}:Scaled")}
    )
    outputs = handle.predict_batch(np.array([[1.0, 2.0], [0.0, 0.0]]))

    np.testing.assert_array_equal(outputs["predictions"], [15.0, 6.0])  # (2+3)*3, (1+1)*3
    np.testing.assert_array_equal(outputs["doubled"], [30.0, 12.0])
    assert (handle.format, handle.name, handle.n_features) == ("python", "s", 2)
    assert handle.feature_names == ("a", "b") and handle.source == factor_file


def test_python_handle_wraps_plain_array_predictions() -> None:
    class Plain:
        n_features = 3

        def predict(self, instances: np.ndarray) -> list[float]:
            return instances.max(axis=1).tolist()

    handle = python_handle(Plain(), name="p", version="2")
    assert handle.warmup(1, 4)  # n_features known: warmup runs
    np.testing.assert_array_equal(
        handle.predict_batch(np.array([[1.0, 5.0, 2.0]]))["predictions"], [5.0]
    )


def test_python_loader_takes_a_directory(tmp_path: Path) -> None:
    (tmp_path / "factor.txt").write_text("2")

    class FromDir(Scaled):
        def load(self, path: Path) -> None:
            super().load(path / "factor.txt")

    module = sys.modules[__name__]
    module.FromDir = FromDir  # type: ignore[attr-defined]
    try:
        handle = load_model(
            tmp_path, "python", loaders={"python": PythonLoader(f"{__name__}:FromDir")}
        )
    finally:
        del module.FromDir  # type: ignore[attr-defined]
    assert handle.predict_batch(np.zeros((1, 2)))["predictions"].tolist() == [4.0]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon", "is not package.module:ClassName"),
        ("no_such_module_xyz:Model", "cannot import 'no_such_module_xyz'"),
        (f"{__name__}:Missing", "has no attribute 'Missing'"),
        (f"{__name__}:factor_file", "not a class"),
    ],
)
def test_import_class_names_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        import_class(spec)


def test_python_loader_refuses_a_class_without_the_contract(factor_file: Path) -> None:
    with pytest.raises(ModelLoadError, match="has no load"):
        load_model(factor_file, "python", loaders={"python": PythonLoader(f"{__name__}:NoPredict")})
    with pytest.raises(ModelLoadError, match="SERVING_MODEL_CLASS: cannot import"):
        load_model(factor_file, "python", loaders={"python": PythonLoader("nowhere_xyz:Model")})


def test_python_handle_refuses_a_malformed_input_schema() -> None:
    class BadSchema:
        feature_names = "abc"

        def predict(self, instances: np.ndarray) -> np.ndarray:
            return instances

    with pytest.raises(ModelLoadError, match="feature_names must be a sequence of str"):
        python_handle(BadSchema(), name="b", version="1")


def test_example_custom_model_answers_as_its_own_pipeline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    from custom_model import ShapeRatioModel, engineer, train

    train(tmp_path)
    X, y = breast_cancer
    handle = load_model(
        tmp_path, "python", loaders={"python": PythonLoader("custom_model:ShapeRatioModel")}
    )
    outputs = handle.predict_batch(X)

    own = ShapeRatioModel()
    own.load(tmp_path)
    expected = own.predict(own.preprocess(X))
    np.testing.assert_array_equal(outputs["predictions"], expected["predictions"])
    np.testing.assert_array_equal(outputs["probabilities"], expected["probabilities"])
    assert handle.n_features == 30 and handle.classes == (0, 1)
    assert engineer(X).shape == (569, 42)
    assert float(np.mean(outputs["predictions"] == y)) > 0.95


def test_models_entry_with_a_class_loads_through_the_runtime_and_batches(
    factor_file: Path,
) -> None:
    """A SERVING_MODELS entry with "class" goes the way every model goes: runtime, warmup
    (feature_names gives the width), batcher."""
    from prometheus_client import CollectorRegistry

    from serving.observe.metrics import ServingMetrics
    from serving.runtime import ModelRuntime
    from serving.settings import ModelSpec, Settings

    spec = ModelSpec(name="scaled", path=factor_file, **{"class": f"{__name__}:Scaled"})
    settings = Settings(models=[spec], workers=1)
    runtime = ModelRuntime(settings.model_settings()[0], ServingMetrics(CollectorRegistry()))
    runtime.load()
    try:
        handle, batcher = runtime.require_ready()
        assert (handle.name, handle.format, handle.n_features) == ("scaled", "python", 2)
        assert runtime.state == "ready"
        outputs = batcher.submit_many(np.array([[1.0, 1.0]]), timeout_s=10)
        assert outputs["predictions"].tolist() == [12.0]  # (2 + 2) * 3
        assert outputs["doubled"].tolist() == [24.0]
    finally:
        runtime.stop(timeout_s=5)


def test_python_handle_takes_the_declared_schema_and_hands_a_typed_dataframe(
    tmp_path: Path,
) -> None:
    """strings, a number that may be missing, a categorical column: the class gets a
    pandas DataFrame of its columns, each of its type, as a pipeline in-process does."""

    from tests.models import TypedChurn
    from tests.tabular import churn_rows, frame_of, write_churn

    pipeline, _, _ = write_churn(tmp_path)
    model = TypedChurn()
    model.load(tmp_path)
    handle = python_handle(model, name="m", version="1", source=tmp_path)

    by_name = {f.name: f for f in handle.features or ()}
    assert [f.kind for f in by_name.values()] == ["string", "string", "float", "float"]
    assert by_name["seats"].missing and not by_name["plan"].missing
    assert by_name["plan"].categories == frozenset({"basic", "pro", "team"})
    assert handle.feature_names == ("plan", "region", "seats", "usage_hours")
    frame = frame_of(churn_rows())
    batch = np.zeros(len(frame), dtype=handle.batch_dtype)
    for name in batch.dtype.names or ():
        batch[name] = frame[name].to_numpy()
    outputs = handle.predict_batch(batch)
    np.testing.assert_array_equal(outputs["predictions"], pipeline.predict(frame))
    np.testing.assert_array_equal(outputs["probabilities"], pipeline.predict_proba(frame))


def test_python_handle_reads_schema_json_from_the_models_directory(tmp_path: Path) -> None:
    class Sums:
        def load(self, path: Path) -> None:
            pass

        def predict(self, instances: np.ndarray) -> np.ndarray:
            return instances["a"] + instances["b"]  # a record batch: one field per column

    (tmp_path / "schema.json").write_text(
        '{"inputs": [{"name": "a", "type": "long"}, {"name": "b", "type": "double", '
        '"required": false}]}'
    )
    handle = python_handle(Sums(), name="s", version="1", source=tmp_path)

    assert [(f.name, f.kind, f.missing) for f in handle.features or ()] == [
        ("a", "integer", False), ("b", "float", True),
    ]  # fmt: skip
    assert handle.warmup(1, 4)  # sample instances of the schema reach predict
    batch = handle.sample(2)
    batch["a"], batch["b"] = [1, 2], [0.5, np.nan]
    np.testing.assert_array_equal(handle.predict_batch(batch)["predictions"], [1.5, np.nan])


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        ({"input_format": "arrow"}, "input_format must be 'batch' or 'dataframe'"),
        ({"input_format": "dataframe"}, "needs the columns"),
        ({"input_schema": [{"name": "a", "type": "text"}]}, "has type 'text'"),
        ({"input_schema": [{"name": "a", "type": "string"}], "feature_names": ("b",)},
         "differ from the input schema"),
    ],
)  # fmt: skip
def test_python_handle_refuses_a_schema_it_cannot_use(
    attributes: dict[str, Any], message: str
) -> None:
    model = type("Declared", (), {"predict": lambda self, rows: rows, **attributes})()
    with pytest.raises(ModelLoadError, match=message):
        python_handle(model, name="m", version="1")


def test_warm_up_failure_on_invented_rows_names_the_class_and_serves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A class that fails on the float zeros the server made up may serve its real rows:
    the failure is a warning naming the class and the error, not a stopped server."""
    from prometheus_client import CollectorRegistry

    from serving.observe.metrics import ServingMetrics
    from serving.runtime import ModelRuntime
    from serving.settings import Settings

    settings = Settings(
        model_dir=tmp_path, model_class="tests.models:StringsWithoutSchema", workers=1
    )
    runtime = ModelRuntime(settings.model_settings()[0], ServingMetrics(CollectorRegistry()))

    with caplog.at_level("WARNING", logger="serving.warmup"):
        runtime.load()

    assert runtime.state == "ready"
    assert "class tests.models:StringsWithoutSchema" in caplog.text
    assert "TypeError: ufunc 'isnan'" in caplog.text and "warmup_instances" in caplog.text


def test_a_class_folder_loaded_has_the_sha256_of_its_files_manifest(tmp_path: Path) -> None:
    """Issue 32 item 6: a version a class loads from its folder gets a digest too, the
    one ``sha256sum`` gives over its files' ``sha256sum`` lines (docs/repository.md)."""
    import subprocess

    from serving.loading import load_artifact
    from serving.model_settings import ModelSettings
    from tests.tabular import write_churn

    folder = tmp_path / "churn"
    folder.mkdir()
    write_churn(folder)
    (folder / "sub").mkdir()
    (folder / "sub" / "notes.txt").write_text("v2\n")
    (folder / "link.txt").symlink_to(folder / "sub" / "notes.txt")  # not followed
    model = ModelSettings(
        name="churn", version="1", path=folder, format="python",
        model_class="tests.models:TypedChurn",
    )  # fmt: skip
    handle = load_artifact(model)

    recipe = "find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum"
    shell = subprocess.run(
        ["sh", "-c", recipe], cwd=folder, capture_output=True, text=True, check=True
    ).stdout.split()[0]
    assert handle.sha256 == shell
    (folder / "sub" / "notes.txt").write_text("v3\n")
    assert load_artifact(model).sha256 != shell  # a file changed: another digest
