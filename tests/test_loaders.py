"""Loaders on real artifacts: the bundled demo (joblib, ONNX), pickles of tiny models, failures."""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import pytest

from serving.errors import ModelLoadError
from serving.model.loaders import (
    ModelHandle,
    ModelLoader,
    default_loaders,
    estimator_handle,
    format_from_path,
    load_model,
)
from serving.settings import DEMO_MODEL_PATH
from tests.models import RowEcho

DEMO_ONNX_PATH = DEMO_MODEL_PATH.with_suffix(".onnx")


def test_demo_joblib_classifies_breast_cancer_rows(
    breast_cancer: tuple[np.ndarray, np.ndarray],
) -> None:
    X, y = breast_cancer
    handle = load_model(DEMO_MODEL_PATH)

    outputs = handle.predict_batch(X)

    assert (handle.name, handle.format, handle.n_features, handle.classes) == (
        "breast_cancer",
        "joblib",
        30,
        (0, 1),
    )
    accuracy = float((outputs["predictions"] == y).mean())
    assert accuracy > 0.95, accuracy
    assert outputs["probabilities"].shape == (569, 2)
    np.testing.assert_allclose(outputs["probabilities"].sum(axis=1), 1.0)
    np.testing.assert_array_equal(outputs["predictions"], outputs["probabilities"].argmax(axis=1))


def test_demo_onnx_agrees_with_joblib(breast_cancer: tuple[np.ndarray, np.ndarray]) -> None:
    X, _ = breast_cancer
    joblib_out = load_model(DEMO_MODEL_PATH).predict_batch(X)
    onnx_handle = load_model(DEMO_ONNX_PATH)
    onnx_out = onnx_handle.predict_batch(X)

    assert (onnx_handle.format, onnx_handle.n_features, onnx_handle.classes) == ("onnx", 30, (0, 1))
    # float64 rows into a float32 graph: cast once per batch, labels still agree on all 569
    np.testing.assert_array_equal(onnx_out["predictions"], joblib_out["predictions"])
    np.testing.assert_allclose(onnx_out["probabilities"], joblib_out["probabilities"], atol=1e-5)


def test_onnx_zipmap_classifier_gives_probabilities_in_class_order(tmp_path: Path) -> None:
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    X = rng.normal(size=(60, 4))
    y = np.array(["cat", "dog", "eel"])[rng.integers(0, 3, 60)]
    model = LogisticRegression(max_iter=500).fit(X, y)
    path = tmp_path / "zipmap.onnx"
    path.write_bytes(to_onnx(model, X[:1].astype(np.float32), target_opset=17).SerializeToString())

    handle = load_model(path)
    outputs = handle.predict_batch(X)

    assert handle.classes == ("cat", "dog", "eel")
    np.testing.assert_allclose(outputs["probabilities"], model.predict_proba(X), atol=1e-4)
    assert list(outputs["predictions"]) == list(model.predict(X))


def test_pickle_loader_serves_a_pickled_model(tmp_path: Path) -> None:
    path = tmp_path / "echo.pkl"
    path.write_bytes(pickle.dumps(RowEcho(n_features=2)))

    handle = load_model(path, name="echo", version="3")

    assert (handle.name, handle.version, handle.format, handle.source) == (
        "echo",
        "3",
        "pickle",
        path,
    )
    assert handle.n_features == 2 and handle.classes is None
    outputs = handle.predict_batch(np.array([[4.0, 0.0], [5.0, 1.0]]))
    assert list(outputs) == ["predictions"]
    np.testing.assert_array_equal(outputs["predictions"], [4.0, 5.0])


def test_joblib_regressor_has_no_probabilities(tmp_path: Path) -> None:
    from sklearn.linear_model import LinearRegression

    X = np.arange(12.0).reshape(6, 2)
    path = tmp_path / "reg.joblib"
    joblib.dump(LinearRegression().fit(X, X.sum(axis=1)), path)

    outputs = load_model(path).predict_batch(X)

    assert list(outputs) == ["predictions"]
    np.testing.assert_allclose(outputs["predictions"], X.sum(axis=1))


@pytest.mark.parametrize(
    ("name", "content", "fmt", "cause"),
    [
        ("missing.joblib", None, None, "no such file"),
        ("model.bin", b"x", None, "cannot tell the format"),
        ("model.joblib", b"x", "xml", "no loader for format 'xml'"),
        ("corrupt.pkl", b"not a pickle", None, "UnpicklingError"),
        ("corrupt.onnx", b"not a graph", None, "onnx"),
        ("no_predict.pkl", pickle.dumps({"a": 1}), None, "has no predict()"),
        # found by the new-user trial: a truncated file said "EOFError: " and no more
        ("empty.joblib", b"", None, "file ends early"),
        ("cut.pkl", pickle.dumps({"a": list(range(100))})[:40], None, "truncated"),
        # found by the new-user trial: random bytes said "KeyError: 216" and no more
        ("noise.joblib", bytes(range(216, 256)) * 8, None, "not a pickle or joblib file"),
        ("noise.pkl", b"\x80\x04" + bytes(range(216, 256)) * 8, None, "invalid load key"),
    ],
)
def test_load_model_failures_name_the_path_and_the_cause(
    tmp_path: Path, name: str, content: bytes | None, fmt: str | None, cause: str
) -> None:
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)

    with pytest.raises(ModelLoadError) as info:
        load_model(path, fmt)

    assert str(path) in str(info.value)
    assert cause.lower() in str(info.value).lower()


def test_load_model_takes_a_new_format_from_the_loaders_given(tmp_path: Path) -> None:
    seen: list[bytes | None] = []

    class DoubleLoader(ModelLoader):
        def load(
            self, path: Path, data: bytes | None, *, name: str, version: str, threads: int = 1
        ) -> ModelHandle:
            seen.append(data)
            factor = float(data or b"0")
            return ModelHandle.from_callable(lambda X: X[:, 0] * factor, name=name, version=version)

    path = tmp_path / "m.txt"
    path.write_text("2")

    handle = load_model(path, "double", loaders={**default_loaders(), "double": DoubleLoader()})

    np.testing.assert_array_equal(handle.predict_batch(np.array([[3.0]]))["predictions"], [6.0])
    assert seen == [b"2"]  # the loader is given the bytes, read once, not the path to read
    with pytest.raises(ModelLoadError, match="no loader for format 'double'"):
        load_model(path, "double")  # no global registry: the default loaders do not know it


def test_load_model_refuses_a_loader_reading_its_path_for_a_pinned_model(tmp_path: Path) -> None:
    class ReadsPath(ModelLoader):
        reads_path = True

        def load(
            self, path: Path, data: bytes | None, *, name: str, version: str, threads: int = 1
        ) -> ModelHandle:
            raise AssertionError("not called")

    path = tmp_path / "m.txt"
    path.write_text("2")

    with pytest.raises(ModelLoadError, match="reads the file itself"):
        load_model(path, "mine", loaders={"mine": ReadsPath()}, data=b"2", pinned=True)


def test_from_callable_accepts_arrays_or_named_outputs() -> None:
    plain = ModelHandle.from_callable(lambda X: X.sum(axis=1), name="s", version="1")
    named = ModelHandle.from_callable(
        lambda X: {"predictions": [1], "extra": [[2, 3]]}, name="n", version="1"
    )

    np.testing.assert_array_equal(plain.predict_batch(np.ones((2, 3)))["predictions"], [3, 3])
    assert set(named.predict_batch(np.ones((1, 1)))) == {"predictions", "extra"}
    assert plain.warmup(4) is False  # n_features unknown: nothing to warm up


def test_estimator_handle_refuses_objects_without_predict() -> None:
    with pytest.raises(ModelLoadError, match="no predict"):
        estimator_handle(object(), name="x", version="1", format="pickle")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "fmt"),
    [("a.pkl", "pickle"), ("a.PICKLE", "pickle"), ("a.joblib", "joblib"), ("a.onnx", "onnx")],
)
def test_format_from_path_reads_the_extension(name: str, fmt: str) -> None:
    assert format_from_path(Path(name)) == fmt


# (estimator, whether its labels come from predict_proba alone, pipeline step before it)
CLASSIFIERS = [
    ("RandomForestClassifier(n_estimators=25, random_state=0)", True, "scale"),
    ("ExtraTreesClassifier(n_estimators=25, random_state=0)", True, "scale"),
    ("DecisionTreeClassifier(random_state=0)", True, "scale"),
    ("LogisticRegression(max_iter=2000)", True, "scale"),
    ("HistGradientBoostingClassifier(max_iter=20)", True, "scale"),
    ("MLPClassifier(hidden_layer_sizes=(8,), max_iter=50, random_state=0)", True, "scale"),
    ("GradientBoostingClassifier(n_estimators=20, random_state=0)", True, "scale"),
    ("KNeighborsClassifier(n_neighbors=4)", True, "scale"),
    ("KNeighborsClassifier(n_neighbors=4, algorithm='kd_tree')", True, "scale"),  # scipy mode
    ("KNeighborsClassifier(n_neighbors=10, weights='distance')", True, "scale"),
    ("GaussianNB()", True, "scale"),
    ("BernoulliNB()", True, "scale"),
    ("MultinomialNB()", True, "minmax"),
    ("ComplementNB()", True, "minmax"),
    ("CategoricalNB()", True, "bins"),
    ("LinearDiscriminantAnalysis()", True, "scale"),
    ("QuadraticDiscriminantAnalysis(reg_param=0.1)", True, "scale"),
    pytest.param(  # Platt-scaled probabilities may disagree with predict: both calls
        "SVC(probability=True, random_state=0)",
        False,
        "scale",
        marks=pytest.mark.filterwarnings("ignore:The `probability` parameter:FutureWarning"),
    ),
    ("RidgeClassifierCV()", False, "scale"),  # no predict_proba: predict only
]


def classifier(estimator: str, before: str) -> Any:
    """A pipeline of ``before`` (scale, minmax or bins) and ``estimator``, unfitted."""
    from sklearn import discriminant_analysis, ensemble, naive_bayes, neighbors, svm, tree
    from sklearn.linear_model import LogisticRegression, RidgeClassifierCV
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import KBinsDiscretizer, MinMaxScaler, StandardScaler

    names: dict[str, Any] = {
        "LogisticRegression": LogisticRegression,
        "RidgeClassifierCV": RidgeClassifierCV,
        "MLPClassifier": MLPClassifier,
    }
    for module in (discriminant_analysis, ensemble, naive_bayes, neighbors, svm, tree):
        names.update(vars(module))
    step = {
        "scale": StandardScaler(),
        "minmax": MinMaxScaler(),
        "bins": KBinsDiscretizer(n_bins=6, encode="ordinal", strategy="uniform"),
    }[before]
    return make_pipeline(step, eval(estimator, names))


def counting_predict(model: Any) -> list[int]:
    """Patch ``model.predict`` (this instance) to record the rows of each call."""
    calls: list[int] = []
    own = model.predict

    def predict(rows: Any) -> Any:
        calls.append(len(rows))
        return own(rows)

    model.predict = predict
    return calls


@pytest.mark.parametrize(("estimator", "one_pass", "before"), CLASSIFIERS)
@pytest.mark.parametrize("dataset", ["breast_cancer", "iris"])
@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_estimator_handle_predictions_equal_the_estimators_own_predict(
    estimator: str, one_pass: bool, before: str, dataset: str
) -> None:
    from sklearn import datasets

    X, y = getattr(datasets, f"load_{dataset}")(return_X_y=True)
    labels = np.array(["setosa", "versicolor", "virginica", "x"])[y] if dataset == "iris" else y
    model = classifier(estimator, before).fit(X, labels)
    expected = model.predict(X)
    calls = counting_predict(model)
    handle = estimator_handle(model, name="m", version="1", format="joblib")

    assert handle.warmup(1, 8)  # the first batch runs both and compares
    calls.clear()
    outputs = handle.predict_batch(X)

    np.testing.assert_array_equal(outputs["predictions"], expected)
    assert outputs["predictions"].dtype == expected.dtype
    if hasattr(model, "predict_proba"):
        np.testing.assert_array_equal(outputs["probabilities"], model.predict_proba(X))
        assert handle.classes == tuple(model.classes_.tolist())
    assert calls == ([] if one_pass else [len(X)])  # predict not called per batch


def test_estimator_handle_gives_predict_labels_on_tied_probabilities() -> None:
    """GradientBoostingClassifier predicts the second class at raw 0 (``raw >= 0``), where
    argmax of ``[0.5, 0.5]`` is the first; LogisticRegression's ``score > 0`` likewise for a
    score of 1e-20 (``expit`` rounds it to 0.5). Tied rows, and only they, ask predict."""
    from sklearn.ensemble import GradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression

    X = np.r_[np.zeros((4, 1)), np.ones((2, 1))]
    boosted = GradientBoostingClassifier(n_estimators=3).fit(X, ["a", "a", "b", "b", "a", "b"])
    tiny = LogisticRegression().fit([[0.0], [1.0]], [0, 1])
    tiny.coef_[:] = 0
    tiny.intercept_[:] = 1e-20
    for model in (boosted, tiny):
        assert model.predict_proba(X[:1]).tolist() == [[0.5, 0.5]]
        calls = counting_predict(model)
        handle = estimator_handle(model, name="m", version="1", format="joblib")
        handle.warmup(1)
        calls.clear()

        outputs = handle.predict_batch(X)

        np.testing.assert_array_equal(outputs["predictions"], model.predict(X))
        assert outputs["predictions"][0] == model.classes_[1]
        assert calls[0] == int(np.count_nonzero(outputs["probabilities"][:, 0] == 0.5))


def test_estimator_handle_gbc_pipeline_on_a_dataframe_calls_predict_proba_only() -> None:
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import GradientBoostingClassifier
    from sklearn.impute import SimpleImputer
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder

    from tests.tabular import churn_module

    frame, target = churn_module().churn_frame(400, seed=1)
    columns = ColumnTransformer(
        [("strings", OneHotEncoder(handle_unknown="ignore"), ["plan", "region"]),
         ("numbers", SimpleImputer(), ["seats", "usage_hours"])]
    )  # fmt: skip
    labels = np.array(["stays", "churns"], dtype=object)[target]
    model = Pipeline([("columns", columns), ("gbc", GradientBoostingClassifier(n_estimators=30))])
    model.fit(frame, labels)
    expected, expected_proba = model.predict(frame), model.predict_proba(frame)
    calls = counting_predict(model)
    handle = estimator_handle(model, name="m", version="1", format="joblib")
    handle.warmup(1, 32)
    calls.clear()
    batch = np.zeros(len(frame), dtype=handle.batch_dtype)
    for name in batch.dtype.names or ():
        batch[name] = frame[name].to_numpy()

    outputs = handle.predict_batch(batch)

    assert outputs["predictions"].dtype == expected.dtype == object
    np.testing.assert_array_equal(outputs["predictions"], expected)
    np.testing.assert_array_equal(outputs["probabilities"], expected_proba)
    assert calls == []


def test_estimator_handle_keeps_two_passes_when_predict_disagrees_at_load(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Whatever the list says: a GaussianNB whose predict (patched on the instance) is not
    argmax(predict_proba), and a multi-label MLPClassifier (``classes_`` one array, but
    predict answers one column per label), answer as their own predict, both calls a batch."""
    from sklearn.datasets import load_iris, make_multilabel_classification
    from sklearn.naive_bayes import GaussianNB
    from sklearn.neural_network import MLPClassifier

    X, y = load_iris(return_X_y=True)
    contrary = GaussianNB().fit(X, y)
    own = contrary.predict
    contrary.predict = lambda rows: (own(rows) + 1) % 3
    Xm, Ym = make_multilabel_classification(n_samples=60, n_classes=3, random_state=0)
    with pytest.warns(Warning, match="Maximum iterations"):
        multilabel = MLPClassifier(max_iter=20, random_state=0).fit(Xm, Ym)

    for model, rows, why in [
        (contrary, X, "150 of 150 sample rows differ|1 of 1 sample rows differ"),
        (multilabel, Xm, r"predict gave shape \(1, 3\)"),
    ]:
        calls = counting_predict(model)
        handle = estimator_handle(model, name="odd", version="1", format="joblib")
        with caplog.at_level("WARNING", logger="serving.model.labels"):
            handle.warmup(1, 8)
        assert "model 'odd': predict and predict_proba both run per batch" in caplog.text
        assert re.search(why, caplog.text)
        caplog.clear()
        calls.clear()

        outputs = handle.predict_batch(rows)

        np.testing.assert_array_equal(outputs["predictions"], model.predict(rows))
        assert calls == [len(rows), len(rows)]  # the handle's call and the line above


def test_label_rule_reads_the_module_and_class_name_without_importing() -> None:
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.tree import DecisionTreeClassifier

    from serving.model.labels import label_rule

    def named(module: str, name: str) -> object:
        return type(name, (), {"__module__": module})()

    classes = np.array([0, 1])
    assert label_rule(named("xgboost.sklearn", "XGBClassifier"), classes) == "untied"
    assert label_rule(named("lightgbm.sklearn", "LGBMClassifier"), classes) == "argmax"
    assert label_rule(named("mypackage.models", "GaussianNB"), classes) is None  # own subclass
    assert label_rule(KNeighborsClassifier(), classes) == "argmax"
    assert label_rule(KNeighborsClassifier(weights="distance"), classes) == "untied"
    assert label_rule(DecisionTreeClassifier(), [classes, classes]) is None  # multi-output


def test_check_artifact_refuses_a_world_writable_file(tmp_path: Path) -> None:
    from serving.model.loaders import check_artifact

    path = tmp_path / "m.pkl"
    path.write_bytes(pickle.dumps(RowEcho()))
    path.chmod(0o666)

    with pytest.raises(ModelLoadError, match="world-writable"):
        check_artifact(path)
    check_artifact(path, allow_world_writable=True)
    path.chmod(0o644)
    check_artifact(path)


def test_check_artifact_compares_the_sha256(tmp_path: Path) -> None:
    import hashlib

    from serving.model.loaders import check_artifact

    path = tmp_path / "m.pkl"
    path.write_bytes(b"model bytes")
    good = hashlib.sha256(b"model bytes").hexdigest()

    check_artifact(path, sha256=good.upper())
    with pytest.raises(ModelLoadError, match=r"but 0{64} is expected \(SERVING_MODEL_SHA256"):
        check_artifact(path, sha256="0" * 64)


def test_onnx_handle_declares_float32_input() -> None:
    assert np.dtype(load_model(DEMO_ONNX_PATH).input_dtype) == np.float32
    assert np.dtype(load_model(DEMO_MODEL_PATH).input_dtype) == np.float64


def test_handles_describe_their_inputs_and_outputs_as_tensor_specs() -> None:
    joblib_handle, onnx_handle = load_model(DEMO_MODEL_PATH), load_model(DEMO_ONNX_PATH)

    def described(specs: tuple[Any, ...]) -> list[tuple[str, str, tuple[int, ...]]]:
        return [(spec.name, spec.dtype.name, spec.shape) for spec in specs]

    assert described(joblib_handle.input_specs()) == [("input-0", "float64", (-1, 30))]
    assert described(onnx_handle.input_specs()) == [("X", "float32", (-1, 30))]
    assert described(joblib_handle.output_specs()) == [
        ("predictions", "int64", (-1,)), ("probabilities", "float64", (-1, 2))
    ]  # fmt: skip
    assert described(onnx_handle.output_specs()) == [
        ("predictions", "int64", (-1,)), ("probabilities", "float32", (-1, 2))
    ]  # fmt: skip
    assert joblib_handle.feature_names is None  # fitted on an ndarray: no names


def test_a_file_loaded_as_another_format_says_so(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(DEMO_ONNX_PATH.read_bytes())
    with pytest.raises(ModelLoadError, match=r"extension says onnx, but it was loaded as joblib"):
        load_model(path, "joblib")


def test_models_with_n_jobs_are_loaded_single_threaded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import joblib
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    forest = RandomForestClassifier(n_estimators=3, n_jobs=-1, random_state=0)
    model = make_pipeline(StandardScaler(), forest).fit([[0.0], [1.0]], [0, 1])
    path = tmp_path / "m.joblib"
    joblib.dump(model, path)

    with caplog.at_level("INFO", logger="serving.model.loaders"):
        load_model(path)
    assert "randomforestclassifier__n_jobs=-1 set to n_jobs=1" in caplog.text
    loaded = joblib.load(path)  # the file keeps what it was trained with
    assert loaded.steps[-1][1].n_jobs == -1

    from serving.model.loaders import JoblibLoader

    kept = JoblibLoader(keep_n_jobs=True).load(path, path.read_bytes(), name="m", version="1")
    assert kept.predict_batch(np.zeros((1, 1)))["predictions"].shape == (1,)


def test_estimator_handle_gives_predict_labels_where_the_probabilities_are_not_numbers() -> None:
    """Found by the attack: finite inputs large enough to make a score infinite (iris,
    ``[1e154, 1e308, 1e308, 1e308]``) give NaN probabilities (``inf - inf`` in the
    softmax), whose argmax is the first class, while predict, the argmax of the scores,
    says the class whose score is infinite: the server answered 0 where the model says 2
    (LogisticRegression, LDA, QDA). Such rows ask predict, as tied rows do."""
    from sklearn.datasets import load_iris
    from sklearn.discriminant_analysis import (
        LinearDiscriminantAnalysis,
        QuadraticDiscriminantAnalysis,
    )
    from sklearn.linear_model import LogisticRegression

    X, y = load_iris(return_X_y=True)
    rows = np.array(
        [[1e154, 1e308, 1e308, 1e308], [1e154, 1e200, 0.0, 1e308], [0.0, -1e308, 1e200, 1e308]]
    )
    rows = np.r_[X[:5], rows]
    for model in (
        LogisticRegression(max_iter=1000).fit(X, y),
        LinearDiscriminantAnalysis().fit(X, y),
        QuadraticDiscriminantAnalysis().fit(X, y),
    ):
        with np.errstate(all="ignore"):
            expected = model.predict(rows)
            not_numbers = np.count_nonzero(np.isnan(model.predict_proba(rows)).any(axis=1))
        assert not_numbers, type(model).__name__
        calls = counting_predict(model)
        handle = estimator_handle(model, name="m", version="1", format="joblib")
        handle.warmup(1)
        calls.clear()

        outputs = handle.predict_batch(rows)

        np.testing.assert_array_equal(outputs["predictions"], expected, type(model).__name__)
        assert calls == [not_numbers]  # only those rows ask predict


@pytest.mark.parametrize("outputs", ["two binary", "three and two classes"])
def test_estimator_handle_of_a_multi_output_classifier_answers_each_instance(
    outputs: str,
) -> None:
    """Found by the attack: a RandomForestClassifier fitted on two target columns keeps
    ``classes_`` and ``predict_proba`` per output (a list of ``(n_instances, n_classes)``
    arrays). The handle made one array of them, output first: a batch of one or three
    instances failed (500, 'probabilities has 2 rows for a batch of 1'), a batch of two
    gave each instance one output's probabilities for both instances (another client's
    row, once merged), and with outputs of different class counts the model failed to
    load ('inhomogeneous shape'). Such a model answers its predictions, one row of labels
    per instance, without probabilities."""
    from sklearn.datasets import load_iris
    from sklearn.ensemble import RandomForestClassifier

    X, y = load_iris(return_X_y=True)
    Y = np.c_[y % 2, (y + 1) % 2] if outputs == "two binary" else np.c_[y, y % 2]
    model = RandomForestClassifier(10, random_state=0).fit(X, Y)
    handle = estimator_handle(model, name="m", version="1", format="joblib")
    handle.warmup(1)

    assert handle.output_names == ("predictions",)
    for rows in (X[:1], X[48:50], X[98:101]):
        answer = handle.predict_batch(rows)
        assert set(answer) == {"predictions"}
        np.testing.assert_array_equal(answer["predictions"], model.predict(rows))
