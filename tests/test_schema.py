"""Input schemas: what a fitted estimator, an ONNX graph or a schema file says of its features."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from serving.app import create_app
from serving.errors import ModelLoadError
from serving.model.loaders import load_model
from serving.model.schema import Feature
from serving.observe.metrics import ServingMetrics
from serving.settings import Settings
from tests.tabular import hgb_with_missing, write_churn


@pytest.fixture(scope="module")
def churn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, Path]:
    return write_churn(tmp_path_factory.mktemp("churn"))


def _by_name(features: tuple[Feature, ...] | None) -> dict[str, Feature]:
    assert features is not None
    return {f.name: f for f in features}


def test_schema_of_a_column_transformer_pipeline_names_kinds_categories_and_missing(
    churn: tuple[Any, Path, Path],
) -> None:
    handle = load_model(churn[1])
    features = _by_name(handle.features)

    assert handle.feature_names == ("plan", "region", "seats", "usage_hours")
    assert (features["plan"].kind, features["plan"].categories) == (
        "string", frozenset({"basic", "pro", "team"}),
    )  # fmt: skip
    assert features["region"].kind == "string"
    assert features["region"].categories is None  # handle_unknown="ignore"
    # an unknown region (None included) is ignored by its encoder: it may be missing
    assert [features[n].missing for n in handle.feature_names] == [False, True, True, True]
    assert handle.matrix_dtype is None  # mixed kinds: a record per instance
    assert [spec.name for spec in handle.input_specs()] == list(handle.feature_names)


def test_schema_of_the_onnx_export_reads_encoder_and_imputer_nodes_and_classes(
    churn: tuple[Any, Path, Path],
) -> None:
    handle = load_model(churn[2])
    features = _by_name(handle.features)

    assert features["plan"].categories == frozenset({"basic", "pro", "team"})
    assert features["region"].categories is None  # the node's zeros=1 answers unknowns
    assert features["seats"].dtype == np.float32 and features["seats"].missing
    assert not features["plan"].missing
    assert handle.classes == (0, 1)  # zipmap=False: from the LinearClassifier node


def test_schema_missing_values_follow_the_estimator_tags(tmp_path: Path) -> None:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    model, frame = hgb_with_missing()
    joblib.dump(model, tmp_path / "hgb.joblib")
    scaled = make_pipeline(StandardScaler(), LogisticRegression())
    joblib.dump(
        scaled.fit(frame.fillna(0).to_numpy(), model.predict(frame)), tmp_path / "lr.joblib"
    )

    hgb = load_model(tmp_path / "hgb.joblib")
    lr = load_model(tmp_path / "lr.joblib")

    assert [f.missing for f in hgb.features or ()] == [True, True]
    assert hgb.matrix_dtype == np.float64
    assert lr.feature_names is None  # fitted on an array: positional
    assert [f.missing for f in lr.features or ()] == [
        False,
        False,
    ]  # NaN reaches LogisticRegression


@pytest.mark.parametrize("output", ["default", "pandas"])
def test_a_passthrough_column_may_be_missing_when_the_model_takes_nan(
    tmp_path: Path, output: str, settings: Settings
) -> None:
    """A ColumnTransformer's ``"passthrough"`` is an identity ``FunctionTransformer`` once
    fitted (scikit-learn 1.9), whose tag refuses NaN: the columns it hands to a model that
    takes NaN may be missing, as in-process (trial: 20 % of a churn frame was refused)."""
    from sklearn.compose import ColumnTransformer
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OrdinalEncoder

    model, frame = hgb_with_missing()
    frame = frame.assign(plan=np.where(np.arange(len(frame)) % 3, "basic", "pro"))
    columns = ColumnTransformer([
        ("plan", OrdinalEncoder(), ["plan"]),
        ("numbers", "passthrough", [c for c in frame.columns if c != "plan"]),
    ])  # fmt: skip
    if output == "pandas":
        columns.set_output(transform="pandas")
    pipeline = Pipeline([("columns", columns), ("model", HistGradientBoostingClassifier())])
    pipeline.fit(frame, model.predict(frame.drop(columns="plan")))
    joblib.dump(pipeline, tmp_path / "passthrough.joblib")
    row = frame.iloc[:1].copy()
    row.iloc[0, 0] = np.nan
    expected = pipeline.predict_proba(row)  # in-process it takes the NaN

    handle = load_model(tmp_path / "passthrough.joblib")

    assert {f.name: f.missing for f in handle.features or ()} == {
        name: name != "plan" for name in frame.columns
    }
    app = create_app(settings, models=[handle], metrics=ServingMetrics(CollectorRegistry()))
    instance = {**row.iloc[0].to_dict(), row.columns[0]: None}
    try:
        response = app.test_client().post("/predict", json={"instances": [instance]})
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["probabilities"] == expected.tolist()


def test_gradient_boosting_on_pandas_categories_is_served_as_in_process(
    tmp_path: Path, settings: Settings
) -> None:
    """``HistGradientBoostingClassifier(categorical_features="from_dtype")`` on ``category``
    columns encodes them itself: string and integer categories, known values or not,
    missing or not, answer as the model does on its own frame (trial: the server read
    eight float features and the warm-up failed)."""
    import pandas as pd
    from sklearn.ensemble import HistGradientBoostingClassifier

    rng = np.random.default_rng(11)
    frame = pd.DataFrame({
        "plan": pd.Categorical(rng.choice(["basic", "pro", "team"], 300)),
        "tier": pd.Categorical(rng.choice([1, 2, 3], 300)),
        "usage": rng.gamma(2.0, 10.0, 300),
    })  # fmt: skip
    frame.loc[rng.random(300) < 0.1, "usage"] = np.nan
    target = ((frame["plan"] == "pro") | (frame["usage"] > 25)).astype(int)
    model = HistGradientBoostingClassifier(categorical_features="from_dtype", max_iter=20)
    joblib.dump(model.fit(frame, target), tmp_path / "native.joblib")
    records = [
        {"plan": "pro", "tier": 2, "usage": 3.5},
        {"plan": "enterprise", "tier": 9, "usage": None},
        {"plan": None, "tier": None, "usage": 40.0},
    ]
    # in-process, a category the frame's dtype lacks is NaN (pandas makes it so)
    rows = pd.DataFrame(records).astype({"usage": float})
    for name in ("plan", "tier"):
        known = rows[name].where(rows[name].isin(frame[name].cat.categories))
        rows[name] = pd.Categorical(known, dtype=frame[name].dtype)

    handle = load_model(tmp_path / "native.joblib")
    app = create_app(settings, models=[handle], metrics=ServingMetrics(CollectorRegistry()))
    try:
        response = app.test_client().post("/predict", json={"instances": records})
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    assert [(f.name, f.kind, f.missing) for f in handle.features or ()] == [
        ("plan", "string", True), ("tier", "integer", True), ("usage", "float", True)
    ]  # fmt: skip
    assert response.status_code == 200, response.get_json()
    assert response.get_json()["probabilities"] == model.predict_proba(rows).tolist()
    assert response.get_json()["predictions"] == model.predict(rows).tolist()


MLMODEL = """\
flavors:
  sklearn:
    pickled_model: model.pkl
signature:
  inputs: '[{"type": "string", "name": "plan", "required": true}, {"type": "string",
    "name": "region", "required": true}, {"type": "long", "name": "seats", "required":
    false}, {"type": "double", "name": "usage_hours", "required": false}]'
  outputs: '[{"type": "long", "required": true}]'
"""


def test_schema_from_an_mlmodel_signature_types_the_features_and_keeps_categories(
    churn: tuple[Any, Path, Path], tmp_path: Path
) -> None:
    (tmp_path / "MLmodel").write_text(MLMODEL)
    (tmp_path / "model.pkl").write_bytes(churn[1].read_bytes())
    handle = load_model(tmp_path / "model.pkl", "joblib")
    features = _by_name(handle.features)

    assert (features["seats"].kind, features["seats"].dtype) == ("integer", np.int64)
    assert features["seats"].missing and not features["plan"].missing
    assert features["plan"].categories == frozenset({"basic", "pro", "team"})


def test_schema_file_naming_other_features_stops_the_load(
    churn: tuple[Any, Path, Path], tmp_path: Path
) -> None:
    path = tmp_path / "churn.joblib"
    path.write_bytes(churn[1].read_bytes())
    spec = {"inputs": [{"name": "plan", "type": "string"}, {"name": "tenure", "type": "double"}]}
    (tmp_path / "churn.schema.json").write_text(json.dumps(spec))

    with pytest.raises(ModelLoadError, match="tenure"):
        load_model(path)


def test_schema_file_with_an_unknown_type_names_it(
    churn: tuple[Any, Path, Path], tmp_path: Path
) -> None:
    path = tmp_path / "churn.joblib"
    path.write_bytes(churn[1].read_bytes())
    (tmp_path / "churn.schema.json").write_text('{"inputs": [{"name": "plan", "type": "text"}]}')

    with pytest.raises(ModelLoadError, match=r"churn.schema.json.*'text'"):
        load_model(path)


def test_an_mlmodel_linked_out_of_the_models_folder_is_refused(
    churn: tuple[Any, Path, Path], tmp_path: Path
) -> None:
    """Found by the hostile trial: a link out of the folder was read, and its YAML error
    quoted the linked file's lines (a ``db_password: ...`` came back in /healthz)."""
    secret = tmp_path / "etc" / "app.yaml"
    secret.parent.mkdir()
    secret.write_text("name: app\ndb_password: hunter2: [\n")
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model.pkl").write_bytes(churn[1].read_bytes())
    (folder / "MLmodel").symlink_to(secret)

    with pytest.raises(ModelLoadError) as info:
        load_model(folder / "model.pkl", "joblib")

    message = str(info.value).replace(str(tmp_path), "<tmp>")
    assert "is a link out of the model's folder" in message
    assert "hunter2" not in message


def test_an_mlmodel_linked_within_its_folder_is_read(
    churn: tuple[Any, Path, Path], tmp_path: Path
) -> None:
    """As a Kubernetes ConfigMap volume links each file into ``..data/``."""
    (tmp_path / "..data").mkdir()
    (tmp_path / "..data" / "MLmodel").write_text(MLMODEL)
    (tmp_path / "MLmodel").symlink_to(tmp_path / "..data" / "MLmodel")
    (tmp_path / "model.pkl").write_bytes(churn[1].read_bytes())

    handle = load_model(tmp_path / "model.pkl", "joblib")

    assert _by_name(handle.features)["plan"].categories == frozenset({"basic", "pro", "team"})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("signature:\n  inputs: 1\ndb_password: hunter2: [\n", "not valid YAML"),
        ("- db_password\n- hunter2\n", "not a mapping"),
        ("signature: hunter2\n", "signature is not a mapping"),
    ],
)
def test_an_unreadable_mlmodel_is_named_without_quoting_it(
    churn: tuple[Any, Path, Path], tmp_path: Path, text: str, expected: str
) -> None:
    (tmp_path / "MLmodel").write_text(text)
    (tmp_path / "model.pkl").write_bytes(churn[1].read_bytes())

    with pytest.raises(ModelLoadError) as info:
        load_model(tmp_path / "model.pkl", "joblib")

    message = str(info.value)
    assert "MLmodel" in message and expected in message
    assert "hunter2" not in message


def test_a_signature_of_many_other_features_is_named_in_a_short_message(
    churn: tuple[Any, Path, Path], tmp_path: Path
) -> None:
    """Found by the hostile trial: 200,000 columns gave a 2.09 MB error message."""
    columns = [{"name": f"c{i}", "type": "double"} for i in range(200_000)]
    (tmp_path / "churn.schema.json").write_text(json.dumps({"inputs": columns}))
    (tmp_path / "churn.joblib").write_bytes(churn[1].read_bytes())

    with pytest.raises(ModelLoadError) as info:
        load_model(tmp_path / "churn.joblib")

    message = str(info.value)
    assert len(message) < 1000
    assert "'c0'" in message and "200,000" in message and "plan" in message


def test_once_per_features_works_out_a_schema_once_per_features_object() -> None:
    import numpy as np

    from serving.model.schema import feature, once_per_features

    calls: list[int] = []

    @once_per_features
    def width(features: Any) -> int:
        calls.append(len(features))
        return len(features)

    features = tuple(feature(str(j), "float", np.float64) for j in range(30))
    equal = tuple(features)[:]  # the same object: a tuple copy is the tuple itself
    other = tuple(feature(str(j), "float", np.float64) for j in range(30))

    assert [width(features) for _ in range(3)] == [30, 30, 30]
    assert width(equal) == 30 and width(other) == 30
    assert calls == [30, 30]  # once for features, once for the other object


def test_a_model_without_a_schema_gets_the_same_float_features_every_request() -> None:
    from serving.inputs.conform import _floats

    assert _floats(30) is _floats(30)
    assert [f.name for f in _floats(3)] == ["0", "1", "2"]
