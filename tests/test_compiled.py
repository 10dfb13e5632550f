"""A scikit-learn model compiled to ONNX Runtime at load (``serving.model.compiled``,
``serving.loading.compiled``): when it is, that its answers are scikit-learn's, and that
every model it cannot prove is served by its library with one line saying why (XGBoost
and LightGBM models too)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import pandas as pd
import pytest
from lightgbm import LGBMClassifier
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.compose import make_column_transformer
from sklearn.ensemble import (
    GradientBoostingClassifier,
    HistGradientBoostingClassifier,
    RandomForestClassifier,
    RandomForestRegressor,
)
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import OneHotEncoder, StandardScaler
from xgboost import XGBClassifier, XGBRegressor

from serving.errors import InvalidInput
from serving.loading import compiled, load_model
from serving.model.compiled import NotCompiled, compile_handle, tree_nodes
from serving.model.estimators import estimator_handle
from serving.model.handle import ModelHandle
from serving.model.parity import differences, gate_rows
from serving.model_settings import ModelSettings

TOLERANCE = 1e-6


def handle_of(model: Any, name: str = "m") -> ModelHandle:
    return estimator_handle(model, name=name, version="1", format="joblib")


def settings_for(**fields: Any) -> ModelSettings:
    return ModelSettings(name="m", version="1", format="joblib", **fields)


def assert_answers_as(model: Any, handle: ModelHandle, rows: Any, frame: Any = None) -> None:
    """``handle``'s answers on ``rows`` are ``model``'s in-process on the same rows: labels
    equal (value and type), probabilities within the tolerance."""
    outputs = handle.predict_batch(rows)
    given = rows if frame is None else frame
    want = model.predict(given)
    assert outputs["predictions"].dtype == want.dtype
    np.testing.assert_array_equal(outputs["predictions"], want)
    if hasattr(model, "predict_proba"):
        np.testing.assert_allclose(
            outputs["probabilities"], model.predict_proba(given), rtol=0, atol=TOLERANCE
        )


@pytest.fixture(scope="module")
def scaled_forest(breast_cancer: tuple[np.ndarray, np.ndarray]) -> Any:
    X, y = breast_cancer
    forest = RandomForestClassifier(n_estimators=40, random_state=0)
    return make_pipeline(StandardScaler(), forest).fit(X, y)


def test_compile_handle_a_scaled_forest_answers_as_scikit_learn_on_every_row(
    scaled_forest: Any, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    X, _ = breast_cancer
    handle = compile_handle(handle_of(scaled_forest), tolerance=TOLERANCE)

    assert handle.engine == "onnxruntime" and handle.execution_provider == "CPUExecutionProvider"
    assert handle.estimator is scaled_forest
    assert_answers_as(scaled_forest, handle, X)
    noisy = X + np.random.default_rng(1).normal(0, 0.05, X.shape) * X.std(axis=0)
    assert_answers_as(scaled_forest, handle, noisy)


@pytest.fixture(scope="module")
def bare_forest(breast_cancer: tuple[np.ndarray, np.ndarray]) -> Any:
    """A forest on the raw rows (no scaler before it)."""
    X, y = breast_cancer
    return RandomForestClassifier(n_estimators=20, random_state=0).fit(X, y)


def test_compile_handle_feeds_trees_float32_as_scikit_learn_compares_at_a_threshold(
    bare_forest: Any, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    X, _ = breast_cancer
    forest = bare_forest
    handle = compile_handle(handle_of(forest))
    tree = forest.estimators_[0].tree_
    inner = np.flatnonzero(tree.feature >= 0)
    rows = np.repeat(X[:1], 3 * inner.size, axis=0)
    for k, node in enumerate(inner):  # each threshold, and the float32 values beside it
        narrow = np.float32(tree.threshold[node])
        for i, value in enumerate(
            (
                tree.threshold[node],
                np.nextafter(narrow, np.float32(-1e9)),
                np.nextafter(narrow, np.float32(1e9)),
            )
        ):
            rows[3 * k + i, tree.feature[node]] = value

    assert_answers_as(forest, handle, rows)


def test_compile_handle_a_gradient_boosted_pipeline_and_a_forest_regressor(
    breast_cancer: tuple[np.ndarray, np.ndarray],
) -> None:
    X, y = breast_cancer
    boosted = make_pipeline(StandardScaler(), GradientBoostingClassifier(random_state=0)).fit(X, y)
    regressor = RandomForestRegressor(n_estimators=20, random_state=0).fit(X, X[:, 0] * 0.01)

    assert_answers_as(boosted, compile_handle(handle_of(boosted)), X)
    outputs = compile_handle(handle_of(regressor)).predict_batch(X)
    np.testing.assert_allclose(outputs["predictions"], regressor.predict(X), rtol=0, atol=TOLERANCE)


def test_compile_handle_a_dataframe_pipeline_with_string_columns_answers_as_scikit_learn() -> None:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({
        "plan": rng.choice(["basic", "pro", "team"], 400),
        "seats": rng.integers(1, 50, 400).astype(float),
        "usage": rng.normal(10, 3, 400),
    })  # fmt: skip
    y = (frame.usage + (frame.plan == "pro") * 3 > 11).astype(int)
    model = make_pipeline(
        make_column_transformer(
            (OneHotEncoder(handle_unknown="ignore"), ["plan"]),
            (StandardScaler(), ["seats", "usage"]),
        ),
        RandomForestClassifier(n_estimators=30, random_state=0),
    ).fit(frame, y)
    handle = compile_handle(handle_of(model))
    rows = np.zeros(len(frame), dtype=handle.batch_dtype)
    for name in frame.columns:
        rows[name] = frame[name].to_numpy()

    assert handle.engine == "onnxruntime"
    assert_answers_as(model, handle, rows, frame)
    rows["plan"][:5] = None  # a missing string: scikit-learn answers that batch
    frame.loc[:4, "plan"] = np.nan
    assert_answers_as(model, handle, rows, frame)


def test_compile_handle_sends_missing_values_where_scikit_learn_sends_them(
    scaled_forest: Any, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    X, _ = breast_cancer
    handle = compile_handle(handle_of(scaled_forest))
    rows = X.copy()
    rng = np.random.default_rng(3)
    rows[rng.random(rows.shape) < 0.3] = np.nan  # the forest takes NaN (scikit-learn 1.4+)

    assert_answers_as(scaled_forest, handle, rows)


def test_compile_handle_a_row_with_a_missing_string_is_answered_by_scikit_learn_alone() -> None:
    """Found by an attack: a row batched with one whose string was missing got
    scikit-learn's answer, alone the graph's (``[-1.2e-07, 1.0000001]``): its answer
    depended on its batchmates. Now each row with a missing string goes to scikit-learn,
    the rest to the graph, and probabilities stay within [0, 1]."""
    frame = pd.DataFrame({"plan": ["a", "b", None, "a"] * 20, "usage": np.arange(80.0)})
    y = np.arange(80) % 3
    model = make_pipeline(
        make_column_transformer(
            (OneHotEncoder(handle_unknown="ignore"), ["plan"]), (StandardScaler(), ["usage"])
        ),
        RandomForestClassifier(n_estimators=10, random_state=0),
    ).fit(frame, y)
    handle = compile_handle(handle_of(model))
    rows = np.zeros(len(frame), dtype=handle.batch_dtype)
    rows["plan"], rows["usage"] = frame["plan"].to_numpy(), frame["usage"].to_numpy()

    batched = handle.predict_batch(rows)
    alone = [handle.predict_batch(rows[i : i + 1]) for i in range(len(rows))]

    assert handle.engine == "onnxruntime"
    assert_answers_as(model, handle, rows, frame)
    missing = frame["plan"].isna().to_numpy()
    exact = model.predict_proba(frame[missing])
    np.testing.assert_array_equal(batched["probabilities"][missing], exact)
    for i, one in enumerate(alone):
        np.testing.assert_array_equal(one["probabilities"][0], batched["probabilities"][i])
    assert batched["probabilities"].min() >= 0 and batched["probabilities"].max() <= 1


def test_compile_handle_values_past_float32_get_scikit_learn_refusal(
    bare_forest: Any, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    X, _ = breast_cancer
    handle = compile_handle(handle_of(bare_forest))
    rows = X[:3].copy()
    rows[1, 0] = 1e300  # finite in float64; scikit-learn's trees refuse it

    with pytest.raises(InvalidInput, match="too large"):
        handle.predict_batch(rows)


class Doubling(TransformerMixin, BaseEstimator):
    """A transformer skl2onnx does not know."""

    def fit(self, X: Any, y: Any = None) -> Doubling:
        self.n_features_in_ = np.shape(X)[1]
        return self

    def transform(self, X: Any) -> Any:
        return np.asarray(X) * 2


def test_compile_handle_a_step_skl2onnx_cannot_convert_runs_in_scikit_learn_before_the_graph(
    breast_cancer: tuple[np.ndarray, np.ndarray], caplog: pytest.LogCaptureFixture
) -> None:
    X, y = breast_cancer
    model = make_pipeline(Doubling(), RandomForestClassifier(n_estimators=10, random_state=0))
    model.fit(X, y)

    with caplog.at_level(logging.INFO, logger="serving"):
        handle = compile_handle(handle_of(model))

    assert handle.engine == "onnxruntime"
    assert_answers_as(model, handle, X)
    (line,) = [
        r.getMessage() for r in caplog.records if "compiled its final step" in r.getMessage()
    ]
    assert "its final step 'randomforestclassifier' after scikit-learn's steps" in line


def test_compiled_serves_scikit_learn_with_one_line_when_answers_differ(
    scaled_forest: Any, caplog: pytest.LogCaptureFixture
) -> None:
    handle = handle_of(scaled_forest)

    with caplog.at_level(logging.INFO, logger="serving.loading"):
        served = compiled(handle, settings_for(compile_tolerance=0))

    assert served is handle and served.engine == "sklearn"
    (record,) = [r for r in caplog.records if "not compiled" in r.getMessage()]
    line = record.getMessage()
    assert line.startswith("model 'm': served by scikit-learn, not compiled: ")
    assert "'probabilities' differ by up to" in line and "tolerance 0" in line
    # Under auto, a model served by its library is no fault: info (a warning under on).
    assert record.levelno == logging.INFO


def test_compiled_a_histgradientboosting_model_says_why_in_one_short_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The new-user trial: a HistGradientBoosting pipeline logged a warning quoting the
    node skl2onnx could not make with every leaf's value (``attributes={'base_values':
    array([...``), cut at 300 characters, in each worker."""
    rng = np.random.default_rng(0)
    X = rng.random((200, 4))
    model = HistGradientBoostingClassifier(max_iter=5).fit(X, X[:, 0] > 0.5)

    with caplog.at_level(logging.INFO, logger="serving.loading"):
        served = compiled(handle_of(model), settings_for(compile="on"))

    assert served.engine == "sklearn"
    (record,) = [r for r in caplog.records if "not compiled" in r.getMessage()]
    assert record.getMessage() == (
        "model 'm': served by scikit-learn, not compiled: as a whole: ValueError: Unable to "
        "create node 'TreeEnsembleClassifier'"
    )
    assert record.levelno == logging.WARNING  # asked for (on)


def test_compiled_a_model_with_its_own_final_estimator_is_served_as_it_is(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Last(BaseEstimator):
        def fit(self, X: Any, y: Any) -> Last:
            self.n_features_in_ = np.shape(X)[1]
            return self

        def predict(self, X: Any) -> Any:
            return np.asarray(X).sum(axis=1)

    model = make_pipeline(StandardScaler(), Last()).fit(np.eye(3), [0, 1, 2])
    handle = handle_of(model)

    with caplog.at_level(logging.WARNING, logger="serving"):
        served = compiled(handle, settings_for(compile="on"))

    assert served is handle
    (line,) = [r.getMessage() for r in caplog.records]
    assert "not compiled" in line and "'last' (Last)" in line


def test_compiled_auto_compiles_tree_models_only_and_off_none(
    scaled_forest: Any, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    X, y = breast_cancer
    linear = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(X, y)

    assert compiled(handle_of(scaled_forest), settings_for()).engine == "onnxruntime"
    assert compiled(handle_of(scaled_forest), settings_for(compile="off")).engine == "sklearn"
    assert compiled(handle_of(linear), settings_for()).engine == "sklearn"
    on = compiled(handle_of(linear), settings_for(compile="on"))
    assert on.engine == "onnxruntime"
    assert_answers_as(linear, on, X)


def test_compiled_auto_leaves_a_forest_over_the_node_limit_to_scikit_learn(
    scaled_forest: Any, caplog: pytest.LogCaptureFixture
) -> None:
    nodes = tree_nodes(scaled_forest)
    assert nodes == sum(t.tree_.node_count for t in scaled_forest[-1].estimators_)

    with caplog.at_level(logging.INFO, logger="serving"):
        auto = compiled(handle_of(scaled_forest), settings_for(), max_nodes=nodes - 1)
        on = compiled(handle_of(scaled_forest), settings_for(compile="on"), max_nodes=nodes - 1)

    assert auto.engine == "sklearn" and on.engine == "onnxruntime"
    assert any(f"{nodes} nodes" in r.getMessage() for r in caplog.records)


def test_compile_handle_refuses_what_is_not_a_scikit_learn_estimator() -> None:
    handle = ModelHandle.from_callable(lambda X: X.sum(axis=1), name="f", version="1", n_features=2)

    with pytest.raises(NotCompiled, match="not a scikit-learn, XGBoost or LightGBM model"):
        compile_handle(handle)


def test_gate_rows_hold_the_sample_rows_and_the_forest_thresholds(scaled_forest: Any) -> None:
    handle = handle_of(scaled_forest)
    rows = gate_rows(handle, scaled_forest, n=2000)

    np.testing.assert_array_equal(rows[:4], handle.sample(4))
    scaler, forest = scaled_forest[0], scaled_forest[-1]
    tree = forest.estimators_[0].tree_
    node = int(np.flatnonzero(tree.feature >= 0)[0])
    j = int(tree.feature[node])
    near = tree.threshold[node] * scaler.scale_[j] + scaler.mean_[j]
    assert np.isclose(rows[:, j], near, rtol=0, atol=1e-9).any()
    assert np.isnan(rows).any(), "the forest takes missing values: some rows have them"


def test_differences_names_labels_types_shapes_and_the_largest_gap() -> None:
    labels = np.array([0, 1, 1])
    probabilities = np.array([[0.9, 0.1], [0.2, 0.8], [0.4, 0.6]])
    want = {"predictions": labels, "probabilities": probabilities}

    assert differences(want, {**want, "probabilities": probabilities + 1e-7}, 1e-6) is None
    assert differences(want, {"predictions": labels}, 1e-6) == "it gives no 'probabilities'"
    found = differences(want, {**want, "predictions": np.array([0, 0, 1])}, 1e-6)
    assert found == "1 'predictions' differ, first on row 1 ([0] for [1])"
    found = differences(want, {**want, "predictions": labels.astype(np.int32)}, 1e-6)
    assert found == "'predictions' are int32, not int64"
    moved = probabilities.copy()
    moved[2, 1] += 3e-3
    found = differences(want, {**want, "probabilities": moved}, 1e-6)
    assert found == "'probabilities' differ by up to 0.003 (row 2; tolerance 1e-06)"
    nan = probabilities.copy()
    nan[0, 0] = np.nan
    assert "differ by up to inf (row 0" in str(differences(want, {**want, "probabilities": nan}, 1))


def boosted_frame() -> tuple[pd.DataFrame, np.ndarray]:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({
        "usage hours": rng.gamma(2.0, 10.0, 600),  # a column name XGBoost's graph cannot keep
        "plan": pd.Categorical(rng.choice(["basic", "pro", "team"], 600)),
        "seats": rng.integers(1, 50, 600).astype(float),
    })  # fmt: skip
    frame.loc[::11, "seats"] = np.nan
    target = ((frame["usage hours"] > 20) ^ (frame["plan"] == "pro")).to_numpy().astype(int)
    return frame, target


def served(model: Any, tmp_path: Path) -> ModelHandle:
    """``model`` loaded as the server loads it (its schema: pandas categories too)."""
    path = tmp_path / "model.joblib"
    joblib.dump(model, path)
    return load_model(path)


def batch_of(handle: ModelHandle, frame: pd.DataFrame) -> Any:
    rows = np.zeros(len(frame), dtype=handle.batch_dtype)
    for name in frame.columns:
        values = frame[name].astype(object) if rows[name].dtype == object else frame[name]
        rows[name] = values.to_numpy()
    return rows


def test_compiled_auto_compiles_an_xgboost_classifier_with_a_pandas_category(
    tmp_path: Path,
) -> None:
    frame, target = boosted_frame()
    model = XGBClassifier(n_estimators=60, max_depth=4, enable_categorical=True, n_jobs=1)
    handle = served(model.fit(frame, target), tmp_path)

    fast = compiled(handle, settings_for())

    assert fast.engine == "onnxruntime"
    probe = frame.copy()
    probe["plan"] = pd.Categorical(
        np.where(np.arange(600) % 7 == 0, None, probe["plan"].astype(object)),
        categories=["basic", "pro", "team"],
    )  # missing plans among them
    assert_answers_as(model, fast, batch_of(handle, probe), probe)


def test_compiled_auto_compiles_an_xgboost_model_fitted_on_named_columns(
    breast_cancer: tuple[np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    X, y = breast_cancer
    frame = pd.DataFrame(X, columns=[f"feature {j}" for j in range(X.shape[1])])
    model = XGBClassifier(n_estimators=80, max_depth=4, n_jobs=1).fit(frame, y)
    handle = served(model, tmp_path)

    fast = compiled(handle, settings_for())

    assert fast.engine == "onnxruntime"
    assert_answers_as(model, fast, batch_of(handle, frame), frame)


def test_compiled_leaves_lightgbm_to_itself_under_auto_and_on(
    breast_cancer: tuple[np.ndarray, np.ndarray], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An attack's LightGBM model, compiled with ``on`` where its parity rows agreed,
    answered 57.5000000001 as 57.5: LightGBM compares in float64."""
    X, y = breast_cancer
    model = LGBMClassifier(n_estimators=60, verbose=-1, n_jobs=1).fit(X, y)
    handle = served(model, tmp_path)

    with caplog.at_level(logging.INFO, logger="serving"):
        auto = compiled(handle, settings_for())
        on = compiled(handle, settings_for(compile="on"))

    assert auto.engine == on.engine == "lightgbm"
    lines = "\n".join(r.getMessage() for r in caplog.records)
    assert "served by LightGBM: it compares each value in float64" in lines  # auto
    assert "served by LightGBM, not compiled: LightGBM compares each value" in lines  # on


def test_compiled_leaves_an_xgboost_model_with_a_missing_sentinel_to_xgboost(
    breast_cancer: tuple[np.ndarray, np.ndarray], tmp_path: Path
) -> None:
    """Found by an attack: ``XGBClassifier(missing=-999)`` was compiled, and the graph
    took -999 for a number."""
    X, y = breast_cancer
    X = X.copy()
    X[::5, 0] = -999.0
    model = XGBClassifier(n_estimators=30, missing=-999.0, n_jobs=1).fit(X, y)

    with pytest.raises(NotCompiled, match=r"its missing value is -999\.0: the graph takes NaN"):
        compile_handle(served(model, tmp_path))


def test_compiled_an_xgboost_regressor_within_its_tolerance_only(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(800, 6))
    y = X @ np.arange(1.0, 7.0) * 20
    model = XGBRegressor(n_estimators=60, n_jobs=1).fit(X, y)
    handle = served(model, tmp_path)

    strict = compiled(handle, settings_for())
    loose = compiled(handle, settings_for(compile_tolerance=1e-2))

    assert strict.engine == "xgboost"  # a float32 sum of outputs in the hundreds
    assert loose.engine == "onnxruntime"
    np.testing.assert_allclose(loose.predict_batch(X)["predictions"], model.predict(X), atol=1e-2)


def test_compile_handle_trees_after_a_pca_answer_rows_at_a_float32_boundary_as_scikit_learn() -> (
    None
):
    """Found by an attack: a PCA -> forest pipeline compiled as a whole sent 27 of 5,200
    rows crafted beside a threshold the other way (ONNX Runtime's projection differs in
    its last bits). A head that is not elementwise now runs in scikit-learn."""
    from sklearn.datasets import make_classification
    from sklearn.decomposition import PCA

    X, y = make_classification(n_samples=1000, n_features=12, n_informative=6, random_state=0)
    forest = RandomForestClassifier(n_estimators=10, random_state=0)
    model = make_pipeline(PCA(n_components=6, random_state=0), forest).fit(X, y)
    pca = model[0]
    rows = []
    for tree in (e.tree_ for e in forest.estimators_):
        for k in np.flatnonzero(tree.feature >= 0)[:40]:
            j, threshold = tree.feature[k], tree.threshold[k]
            low = np.float32(threshold)
            low = low if low <= threshold else np.nextafter(low, np.float32(-np.inf))
            middle = (float(low) + float(np.nextafter(low, np.float32(np.inf)))) / 2
            base = pca.mean_ + middle * pca.components_[j]
            step = np.spacing(np.abs(base).max())
            rows.extend(base + s * step * pca.components_[j] for s in range(-6, 7))

    handle = compile_handle(handle_of(model))

    assert handle.engine == "onnxruntime"
    assert_answers_as(model, handle, np.array(rows))


def test_compile_handle_a_forest_fitted_on_missing_values_is_proven_on_its_parity_rows() -> None:
    """Found by an attack: such trees split at +inf, the parity rows held inf, scikit-learn
    refused them and the proof fell back to 8 sample rows."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(3000, 5))
    y = (X[:, 0] + np.tanh(X[:, 1]) > 0.5).astype(int)
    X[rng.random(X.shape) < 0.1] = np.nan
    model = RandomForestClassifier(n_estimators=20, max_depth=8, random_state=0).fit(X, y)
    assert any(np.isinf(e.tree_.threshold).any() for e in model.estimators_)
    probe = rng.normal(size=(2000, 5))
    probe[rng.random(probe.shape) < 0.1] = np.nan

    handle = compile_handle(handle_of(model))

    assert not np.isinf(gate_rows(handle_of(model), model)).any()  # inf: refused by the model
    assert handle.engine == "onnxruntime"
    assert_answers_as(model, handle, probe)


def test_compile_handle_a_regressor_whose_outputs_float32_cannot_hold_stays_on_its_library() -> (
    None
):
    """Found by an attack: a tree regressor with a leaf at 49.7 (float32: 49.717365) was
    compiled, its parity rows never reaching that leaf."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 4))
    y = np.where(X[:, 0] > 2.5, 49.71736711, 0.1 * X[:, 1])  # the large leaf is rare
    model = RandomForestRegressor(n_estimators=5, random_state=0).fit(X, y)

    with pytest.raises(NotCompiled, match=r"its outputs reach 49\.72, .* over the tolerance 1e-06"):
        compile_handle(handle_of(model))
