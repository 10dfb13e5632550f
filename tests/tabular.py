"""The tabular models of ``examples/churn.py`` for tests: a DataFrame pipeline with string
columns and missing values (joblib and its skl2onnx export), and a
HistGradientBoostingClassifier fitted on a DataFrame with missing values; missing strings
and numbers as tritonclient sends them (issue 34)."""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import joblib
import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent


def churn_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("churn", ROOT / "examples" / "churn.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_churn(folder: Path) -> tuple[Any, Path, Path]:
    """The fitted churn pipeline, and the paths of its joblib file and ONNX export."""
    churn = churn_module()
    model = churn.churn_pipeline()
    joblib.dump(model, folder / "churn.joblib")
    (folder / "churn.onnx").write_bytes(churn.to_onnx(model))
    return model, folder / "churn.joblib", folder / "churn.onnx"


def churn_rows() -> list[dict[str, Any]]:
    """Rows as clients send them: strings, ints, floats and nulls (an unknown region too)."""
    frame, _ = churn_module().churn_frame(40, seed=7)
    rows: list[dict[str, Any]] = [
        {k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in row.items()}
        for row in frame.to_dict("records")
    ]
    for row in rows:
        if row["seats"] is not None:
            row["seats"] = int(row["seats"])
    rows[3]["region"] = "antarctica"  # handle_unknown="ignore": answered
    return rows


def frame_of(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The DataFrame an in-process caller would pass for ``rows`` (null -> NaN)."""
    return pd.DataFrame(rows).astype({"seats": float, "usage_hours": float})


def hgb_with_missing() -> tuple[Any, pd.DataFrame]:
    """HistGradientBoostingClassifier fitted on a DataFrame where a tenth of values are NaN."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    rng = np.random.default_rng(3)
    frame = pd.DataFrame({"tenure": rng.normal(24, 8, 300), "spend": rng.normal(50, 20, 300)})
    target = (frame["tenure"] + rng.normal(0, 4, 300) > 24).astype(int)
    frame.loc[rng.random(300) < 0.1, "tenure"] = np.nan
    return HistGradientBoostingClassifier(max_iter=30).fit(frame, target), frame


# The churn pipeline's OneHotEncoder keeps a numpy.dtype, which skops does not trust by
# default: MLflow itself refuses to save it in skops unless told (skops_trusted_types).
CHURN_SKOPS_TYPES = ("numpy.dtype",)


def save_with_mlflow(
    folder: Path,
    model: Any,
    trusted: list[str],
    predict_fn: str = "predict",
    signed: pd.DataFrame | None = None,
) -> Path:
    """``mlflow.sklearn.save_model`` in its default (skops) format, with a signature
    inferred from ``signed`` (default: ``churn_rows()``, which hold nulls) and
    ``pyfunc_predict_fn=predict_fn``. The pip requirements are given, pinned as MLflow
    would infer them: inferring them loads the model again in a subprocess (9.7 s of a
    9.8 s save); the server never reads them."""
    import sklearn
    import skops
    from mlflow.models import infer_signature
    from mlflow.sklearn import save_model

    frame = frame_of(churn_rows()) if signed is None else signed
    with warnings.catch_warnings():
        # MLflow's own notice about its pyfunc type hints, not about this model or us.
        warnings.filterwarnings("ignore", ".*Any type hint is inferred", UserWarning)
        save_model(
            model, folder, signature=infer_signature(frame, getattr(model, predict_fn)(frame)),
            skops_trusted_types=trusted, pyfunc_predict_fn=predict_fn,
            pip_requirements=[f"scikit-learn=={sklearn.__version__}",
                              f"skops=={skops.__version__}", f"pandas=={pd.__version__}"],
        )  # fmt: skip
    return folder / "model.skops"


def pyfunc_predict(folder: Path, frame: pd.DataFrame) -> Any:
    """``mlflow.pyfunc.load_model(folder).predict(frame)`` as JSON carries it (lists)."""
    with warnings.catch_warnings():
        # MLflow's own notice about its pyfunc type hints, raised on import.
        warnings.filterwarnings("ignore", ".*Any type hint is inferred", UserWarning)
        import mlflow.pyfunc

    predicted = mlflow.pyfunc.load_model(str(folder)).predict(frame)
    return json.loads(json.dumps(np.asarray(predicted).tolist()))


def tier_pipeline() -> tuple[Any, pd.DataFrame]:
    """A pipeline fitted on a DataFrame whose integer column ``tier`` (1, 2 or 3, never 0)
    feeds a ``OneHotEncoder(handle_unknown="error")``, beside a string ``plan`` (also
    refused when unknown) and a float ``usage``; and that DataFrame."""
    from sklearn.compose import ColumnTransformer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import OneHotEncoder

    rng = np.random.default_rng(5)
    frame = pd.DataFrame(
        {
            "tier": rng.integers(1, 4, 200),
            "plan": rng.choice(["basic", "pro"], 200),
            "usage": rng.gamma(2.0, 10.0, 200),
        }
    )
    target = ((frame["tier"] == 3) | (frame["usage"] > 25)).astype(int)
    columns = ColumnTransformer(
        [
            ("tier", OneHotEncoder(handle_unknown="error"), ["tier"]),
            ("plan", OneHotEncoder(handle_unknown="error"), ["plan"]),
        ],
        remainder="passthrough",
    )
    model = Pipeline([("columns", columns), ("model", LogisticRegression())])
    return model.fit(frame, target), frame


def boosting_frame(n: int = 400, seed: int = 13) -> tuple[pd.DataFrame, pd.Series]:
    """A DataFrame of two pandas ``category`` columns of strings (``plan``, ``region``) and
    two float columns with NaN (``seats``, ``usage``), and a 0/1 target that depends on
    all four: the training data of ``boosting_model``."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({
        "plan": pd.Categorical(rng.choice(["basic", "pro", "team"], n)),
        "region": pd.Categorical(rng.choice(["amer", "apac", "emea", "latam"], n)),
        "seats": rng.integers(1, 60, n).astype(float),
        "usage": rng.gamma(2.0, 10.0, n),
    })  # fmt: skip
    score = (
        (frame["plan"] == "pro").to_numpy() * 1.5 + (frame["region"] == "apac").to_numpy()
        + frame["usage"].to_numpy() / 20 - frame["seats"].to_numpy() / 40
        + rng.normal(0, 0.5, n)
    )  # fmt: skip
    frame.loc[rng.random(n) < 0.1, "seats"] = np.nan
    frame.loc[rng.random(n) < 0.1, "usage"] = np.nan
    return frame, pd.Series((score > 1).astype(int))


def boosting_model(library: str) -> tuple[Any, pd.DataFrame]:
    """``LGBMClassifier`` (``library="lightgbm"``) or ``XGBClassifier(enable_categorical=True,
    tree_method="hist")`` (``"xgboost"``) fitted on ``boosting_frame()``, and that frame."""
    frame, target = boosting_frame()
    if library == "lightgbm":
        from lightgbm import LGBMClassifier

        model: Any = LGBMClassifier(n_estimators=30, min_child_samples=5, verbose=-1)
    else:
        from xgboost import XGBClassifier

        model = XGBClassifier(n_estimators=30, enable_categorical=True, tree_method="hist")
    return model.fit(frame, target), frame


def boosting_rows(frame: pd.DataFrame, n: int = 60) -> list[dict[str, Any]]:
    """The first ``n`` rows of ``frame`` as clients send them (NaN as null), with unknown
    (``"gold"``, ``"mars"``) and missing categories in some (rows 1, 2, 3 among them)."""
    rows: list[dict[str, Any]] = [
        {k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in row.items()}
        for row in frame.head(n).astype({"plan": object, "region": object}).to_dict("records")
    ]
    for i, row in enumerate(rows):
        if i % 9 == 1:
            row["plan"] = "gold"  # not a training category
        if i % 11 == 2:
            row["region"] = None
        if i % 13 == 3:
            row["plan"], row["region"], row["seats"] = None, "mars", None
    return rows


def boosting_frame_of(rows: list[dict[str, Any]], like: pd.DataFrame) -> pd.DataFrame:
    """The DataFrame an in-process caller builds for ``rows``: ``like``'s columns and
    dtypes, each category column ``pd.Categorical`` of the training categories (a value
    not among them NaN, as pandas makes it; pandas deprecates passing it through)."""
    frame = pd.DataFrame(rows, columns=like.columns)
    for name, dtype in like.dtypes.items():
        if isinstance(dtype, pd.CategoricalDtype):
            known = frame[name].where(frame[name].isin(dtype.categories))
            frame[name] = pd.Categorical(known, dtype=dtype)
        else:
            frame[name] = frame[name].astype(dtype)
    return frame


#: Rows of the churn example missing a string (plan) or a number (seats, usage_hours).
MISSING_ROWS = [
    {"plan": None, "region": "emea", "seats": 12, "usage_hours": 3.5},
    {"plan": "pro", "region": "apac", "seats": None, "usage_hours": 40.0},
    {"plan": "basic", "region": "emea", "seats": 3, "usage_hours": None},
]


def churn_with_missing_plans() -> Any:
    """The churn pipeline, its ``plan`` encoder fitted on plans of which some are None (an
    object column holding None): None is a category it knows, an unknown one is refused."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline

    pipeline = churn_module().churn_pipeline()
    frame, target = churn_module().churn_frame()
    frame["plan"] = frame["plan"].astype(object)
    frame.loc[frame.index % 7 == 0, "plan"] = None
    steps = [("columns", pipeline.named_steps["columns"]), ("model", LogisticRegression())]
    return Pipeline(steps).fit(frame, target)


def frame_with_none(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The DataFrame an in-process caller passes: strings as objects (None where missing,
    the category the encoder knows), numbers float64 (NaN where missing)."""
    columns: dict[str, Any] = {}
    for name in ("plan", "region"):
        columns[name] = pd.Series([row[name] for row in rows], dtype=object)
    for name in ("seats", "usage_hours"):
        columns[name] = pd.Series([row[name] for row in rows], dtype=float)
    return pd.DataFrame(columns)


def triton_inputs(rows: list[dict[str, Any]], binary: bool) -> list[Any]:
    """The rows as a tritonclient user builds them from a DataFrame: strings in an object
    array (None stays None, tritonclient writes it "None"), numbers FP64 with NaN."""
    import tritonclient.http as triton

    inputs = []
    for name in ("plan", "region", "seats", "usage_hours"):
        values = [row[name] for row in rows]
        if name in ("plan", "region"):
            array = np.array(values, dtype=object)
            tensor = triton.InferInput(name, [len(rows)], "BYTES")
        else:
            array = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
            tensor = triton.InferInput(name, [len(rows)], "FP64")
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    return inputs


#: Rows of the plan pipeline (``plan_pipeline``): every plan it knows, as clients send them.
PLAN_ROWS: list[dict[str, Any]] = [
    {"plan": "basic", "seats": 1.0},
    {"plan": "pro", "seats": 4.0},
    {"plan": "team", "seats": 12.0},
    {"plan": "pro", "seats": 2.5},
]


def write_plan(folder: Path, schema: bool = False) -> Any:
    """A pipeline whose ``OrdinalEncoder`` over the string ``plan`` refuses any other plan
    (``""`` included: the value a warm-up makes up for a string declared without
    categories), saved as ``folder/plan.joblib``; with ``schema``, beside it the schema
    an MLflow signature gives (``plan`` a string, no categories) and the pipeline inside a
    ``TransformedTargetRegressor``, where its encoder's categories are not looked for.
    Returns the model saved."""
    import json

    from sklearn.compose import ColumnTransformer, TransformedTargetRegressor
    from sklearn.linear_model import LinearRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OrdinalEncoder

    plans = ["basic", "pro", "team"] * 4
    frame = pd.DataFrame({"plan": plans, "seats": np.arange(12, dtype=float)})
    encode = ColumnTransformer(
        [("plan", OrdinalEncoder(), ["plan"])], remainder="passthrough"
    )  # fmt: skip
    model: Any = make_pipeline(encode, LinearRegression())
    if schema:
        model = TransformedTargetRegressor(regressor=model)
    model.fit(frame, np.arange(12, dtype=float) * 2 + np.tile([0.0, 10.0, 20.0], 4))
    joblib.dump(model, folder / "plan.joblib")
    if schema:
        columns = [{"name": "plan", "type": "string"}, {"name": "seats", "type": "double"}]
        (folder / "plan.schema.json").write_text(json.dumps({"inputs": columns}))
    return model


def save_plan_with_mlflow(folder: Path, model: Any, example: pd.DataFrame) -> Path:
    """``mlflow.sklearn.save_model`` of a plan model (``write_plan``) as a pickle, with a
    signature (``plan`` a string, no categories) and ``example`` as its input example."""
    from mlflow.models import infer_signature
    from mlflow.sklearn import save_model

    with warnings.catch_warnings():
        # MLflow's own comparison of a column index with a range, deprecated by pandas.
        warnings.filterwarnings("ignore", "Operation with range is deprecated")
        warnings.filterwarnings("ignore", ".*Any type hint is inferred", UserWarning)
        save_model(
            model, folder, serialization_format="pickle", input_example=example,
            signature=infer_signature(example, model.predict(example)),
            pip_requirements=["scikit-learn"],
        )  # fmt: skip
    return folder / "model.pkl"
