"""A tabular model of the kind teams ship: a scikit-learn Pipeline fitted on a pandas
DataFrame with categorical (string) columns and missing values.

``python examples/churn.py [OUT_DIR]`` writes ``churn.joblib`` (and ``churn.onnx``, its
skl2onnx export with one input per column, when skl2onnx is installed) to ``OUT_DIR``
(default ``models/``). The README's "Your model" section serves it.

Columns: ``plan`` (string: basic/pro/team; an unknown plan is refused), ``region``
(string; an unknown region is answered, as the encoder ignores it), ``seats`` (integer,
may be missing), ``usage_hours`` (float, may be missing). Target: churned (0/1).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

PLANS = ["basic", "pro", "team"]
REGIONS = ["emea", "amer", "apac"]


def churn_frame(n: int = 600, seed: int = 0) -> tuple[pd.DataFrame, np.ndarray[Any, Any]]:
    """``n`` synthetic customers and whether each churned (a rule plus noise)."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame(
        {
            "plan": rng.choice(PLANS, n),
            "region": rng.choice(REGIONS, n),
            "seats": rng.integers(1, 50, n).astype(float),
            "usage_hours": rng.gamma(2.0, 10.0, n),
        }
    )
    score = (frame["plan"] == "basic") * 1.5 - frame["usage_hours"] / 15 + rng.normal(0, 0.5, n)
    frame.loc[rng.random(n) < 0.1, "seats"] = np.nan
    frame.loc[rng.random(n) < 0.1, "usage_hours"] = np.nan
    return frame, (score > -0.5).astype(int).to_numpy()


def churn_pipeline() -> Any:
    """OneHotEncoder on the strings, imputer + scaler on the numbers, then LogisticRegression."""
    from sklearn.compose import ColumnTransformer
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import Pipeline, make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    columns = ColumnTransformer(
        [
            ("plan", OneHotEncoder(handle_unknown="error"), ["plan"]),
            ("region", OneHotEncoder(handle_unknown="ignore"), ["region"]),
            ("numbers", make_pipeline(SimpleImputer(), StandardScaler()), ["seats", "usage_hours"]),
        ]
    )
    frame, target = churn_frame()
    return Pipeline([("columns", columns), ("model", LogisticRegression())]).fit(frame, target)


def to_onnx(model: Any) -> bytes:
    """The pipeline as an ONNX graph with one ``(batch, 1)`` input per column."""
    from skl2onnx import to_onnx as convert
    from skl2onnx.common.data_types import FloatTensorType, StringTensorType

    inputs = [
        ("plan", StringTensorType([None, 1])),
        ("region", StringTensorType([None, 1])),
        ("seats", FloatTensorType([None, 1])),
        ("usage_hours", FloatTensorType([None, 1])),
    ]
    graph = convert(model, initial_types=inputs, options={"zipmap": False}, target_opset=17)
    return bytes(graph.SerializeToString())


def main() -> None:
    import joblib

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "models")
    out.mkdir(parents=True, exist_ok=True)
    model = churn_pipeline()
    joblib.dump(model, out / "churn.joblib")
    print(f"wrote {out / 'churn.joblib'}")
    try:
        (out / "churn.onnx").write_bytes(to_onnx(model))
        print(f"wrote {out / 'churn.onnx'}")
    except ImportError:
        print("skl2onnx is not installed: no ONNX export")


if __name__ == "__main__":
    main()
