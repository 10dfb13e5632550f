"""LightGBM and XGBoost models fitted on pandas ``category`` columns: their columns and
categories read from the model (``serving.model.schema_boosting``), and their answers
equal to the model's own on the DataFrame an in-process caller builds."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import pandas as pd
import pytest
from prometheus_client import CollectorRegistry

from serving.app import create_app
from serving.errors import ModelLoadError
from serving.model.loaders import load_model
from serving.model.schema import merge_features
from serving.model.schema_boosting import boosting_features
from serving.observe.metrics import ServingMetrics
from serving.settings import Settings
from tests.tabular import boosting_frame_of, boosting_model, boosting_rows

LIBRARIES = ["lightgbm", "xgboost"]


@pytest.fixture(scope="module", params=LIBRARIES)
def fitted(request: pytest.FixtureRequest) -> tuple[Any, pd.DataFrame]:
    return boosting_model(request.param)


@pytest.mark.parametrize("library", LIBRARIES)
def test_schema_boosting_reads_category_columns_and_their_categories_from_the_model(
    library: str,
) -> None:
    model, frame = boosting_model(library)

    features = boosting_features(model, list(frame.columns))

    assert features is not None
    assert [(f.name, f.kind, f.missing, f.categories) for f in features] == [
        ("plan", "string", True, None), ("region", "string", True, None),
        ("seats", "float", True, None), ("usage", "float", True, None),
    ]  # fmt: skip
    assert [f.pandas_categories for f in features] == [
        ("basic", "pro", "team"), ("amer", "apac", "emea", "latam"), None, None,
    ]  # fmt: skip


@pytest.mark.parametrize("library", LIBRARIES)
def test_schema_boosting_reads_integer_categories(library: str) -> None:
    """Integer categories (``tier`` 1, 2, 3) are an integer column, as the model knows them."""
    rng = np.random.default_rng(2)
    frame = pd.DataFrame({"tier": pd.Categorical(rng.choice([3, 1, 2], 200)),
                          "usage": rng.normal(size=200)})  # fmt: skip
    target = ((frame["tier"] == 3) | (frame["usage"] > 1)).astype(int)
    if library == "lightgbm":
        from lightgbm import LGBMClassifier

        model: Any = LGBMClassifier(n_estimators=5, verbose=-1).fit(frame, target)
    else:
        from xgboost import XGBClassifier

        model = XGBClassifier(n_estimators=5, enable_categorical=True).fit(frame, target)

    features = boosting_features(model, ["tier", "usage"])

    assert features is not None
    assert (features[0].kind, features[0].pandas_categories) == ("integer", (1, 2, 3))


def test_schema_boosting_is_none_for_a_model_without_categories() -> None:
    from lightgbm import LGBMClassifier
    from sklearn.linear_model import LogisticRegression

    frame = pd.DataFrame({"a": [0.0, 1.0, 2.0, 3.0] * 10, "b": [1.0, 0.0, 1.0, 0.0] * 10})
    target = [0, 1, 1, 0] * 10

    lightgbm = LGBMClassifier(n_estimators=2, verbose=-1).fit(frame, target)
    linear = LogisticRegression().fit(frame, target)

    assert boosting_features(lightgbm, ["a", "b"]) is None
    assert boosting_features(linear, ["a", "b"]) is None


def test_schema_boosting_an_ordered_lightgbm_category_is_refused_at_load(tmp_path: Path) -> None:
    """LightGBM keeps the categories of an ordered category column but takes it as
    numbers: which columns were categories cannot be told, so the load says why (before,
    every worker's warm-up failed with ``categorical_feature do not match``)."""
    from lightgbm import LGBMClassifier

    model, frame = boosting_model("lightgbm")
    frame = frame.assign(region=frame["region"].cat.as_ordered())
    target = model.predict(boosting_frame_of(boosting_rows(frame, len(frame)), frame))
    joblib.dump(LGBMClassifier(n_estimators=3, verbose=-1).fit(frame, target),
                tmp_path / "ordered.joblib")  # fmt: skip

    with pytest.raises(ModelLoadError, match="pandas_categorical"):
        load_model(tmp_path / "ordered.joblib")


def test_schema_boosting_non_ascii_xgboost_categories_are_refused_at_load(tmp_path: Path) -> None:
    """XGBoost (3.2) keeps non-ASCII categories cut short: they cannot be rebuilt, and a
    wrong category would be answered silently, so the load says why."""
    from xgboost import XGBClassifier

    frame = pd.DataFrame({"plan": pd.Categorical(["a", "é", "ñu", "a"] * 20),
                          "usage": np.arange(80.0)})  # fmt: skip
    model = XGBClassifier(n_estimators=3, enable_categorical=True)
    joblib.dump(model.fit(frame, [0, 1, 1, 0] * 20), tmp_path / "accents.joblib")

    with pytest.raises(ModelLoadError, match="'plan' has categories that are not ASCII"):
        load_model(tmp_path / "accents.joblib")


def test_schema_boosting_a_schema_file_keeps_the_models_categories(
    fitted: tuple[Any, pd.DataFrame],
) -> None:
    model, frame = fitted
    inferred = boosting_features(model, list(frame.columns))
    assert inferred is not None
    declared = tuple(f.__class__(f.name, f.kind, f.dtype, missing=True) for f in inferred)

    merged = merge_features(declared, inferred)

    assert merged is not None
    assert [f.pandas_categories for f in merged] == [f.pandas_categories for f in inferred]


def _served(app: Any, path: str, body: Any) -> Any:
    response = app.test_client().post(path, json=body)
    assert response.status_code == 200, response.get_json()
    return response.get_json()


def test_schema_boosting_models_answer_as_in_process_with_null_and_unknown_categories(
    fitted: tuple[Any, pd.DataFrame], tmp_path: Path, settings: Settings
) -> None:
    """Saved with joblib and pickle, loaded, and asked on /predict (objects and lists),
    KServe V2 JSON and /invocations: labels and probabilities equal the model's own on
    the frame a caller builds with the training dtypes (null, an unknown category),
    answered by the library itself (compiled: tests/test_compiled.py)."""
    settings = settings.model_copy(update={"compile": "off"})
    model, frame = fitted
    joblib.dump(model, tmp_path / "model.joblib")
    (tmp_path / "model.pkl").write_bytes(pickle.dumps(model))
    rows = boosting_rows(frame, 12)
    expected = boosting_frame_of(rows, frame)
    labels, probabilities = model.predict(expected).tolist(), model.predict_proba(expected)
    columns = list(frame.columns)
    v2 = {"inputs": [
        {"name": c, "shape": [len(rows)], "datatype": "BYTES" if c in ("plan", "region")
         else "FP64", "data": [r[c] for r in rows]} for c in columns
    ]}  # fmt: skip

    for name in ("model.joblib", "model.pkl"):
        handle = load_model(tmp_path / name, name="m")
        app = create_app(settings, models=[handle], metrics=ServingMetrics(CollectorRegistry()))
        try:
            answers = [
                _served(app, "/predict", {"instances": rows}),
                _served(app, "/predict", {"instances": [[r[c] for c in columns] for r in rows]}),
            ]
            v2_outputs = {
                o["name"]: o["data"] for o in _served(app, "/v2/models/m/infer", v2)["outputs"]
            }
            mlflow = _served(app, "/invocations", {"dataframe_records": rows})
        finally:
            app.extensions["serving"].get_models().stop(timeout_s=10)

        for answer in answers:
            assert answer["predictions"] == labels
            assert _exactly(answer["probabilities"], probabilities)
        assert v2_outputs["predictions"] == labels
        assert _exactly(v2_outputs["probabilities"], probabilities.ravel())
        assert mlflow["predictions"] == labels


def _exactly(answer: list[Any], expected: np.ndarray) -> bool:
    """Whether the JSON numbers are ``expected``'s values in its dtype (XGBoost's float32
    probabilities are written as float32's shortest repr)."""
    return bool(np.array_equal(np.asarray(answer, dtype=expected.dtype), expected))
