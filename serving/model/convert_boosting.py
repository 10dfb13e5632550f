"""An XGBoost model as an ONNX graph (onnxmltools), for ``serving.model.compiled`` to try
under the same parity rows as a scikit-learn model.

XGBoost compares float32 values with float32 thresholds, so the graph takes the features
as one ``(batch, n_features)`` float32 input, in the model's column order, and answers as
XGBoost does. A feature the model took as a pandas ``category`` column reaches the graph
as its code: its position among the model's categories, NaN when missing or not among
them, as pandas codes it in-process (``serving.model.frames``). Labels come from the
probabilities' argmax.

Not compiled: a model whose ``missing`` is a number (the graph knows NaN alone), one
with more than ``MAX_CATEGORIES`` categories (onnxmltools expands each categorical split
over them: 120 categories in 30 trees took 181 s), and LightGBM, which compares each
float64 value with its thresholds: no float32 graph answers as it does within a float32
step of one (57.5000000001 against 57.5), and ONNX Runtime runs no float64 trees.

Boundary: standard library, numpy and ``serving`` core modules; onnxmltools is imported
when a model is converted.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from serving.model.convert import Graph, NotCompiled
from serving.model.handle import ModelHandle

__all__ = ["boosting_candidates", "boosting_nodes"]


#: The most categories (all categorical features together) of a model compiled.
MAX_CATEGORIES = 32


def boosting_candidates(
    estimator: Any, handle: ModelHandle
) -> list[tuple[str, Callable[[], Graph]]]:
    """The one way to compile an XGBoost scikit-learn-API model.

    :raises NotCompiled: for LightGBM, and an XGBoost model the graph cannot answer as.
    """
    library = type(estimator).__module__.split(".")[0]
    if library == "lightgbm":
        raise NotCompiled(
            "LightGBM compares each value in float64, which a float32 graph cannot match "
            "within a float32 step of a threshold"
        )
    features = handle.features or ()
    codes = tuple(f.pandas_categories for f in features)
    if any(f.dtype.kind == "O" and f.pandas_categories is None for f in features):
        raise NotCompiled("it takes strings that are not pandas categories")
    missing = getattr(estimator, "missing", np.nan)
    if missing is not None and not np.isnan(missing):
        raise NotCompiled(f"its missing value is {missing!r}: the graph takes NaN alone")
    categories = sum(len(c) for c in codes if c is not None)
    if categories > MAX_CATEGORIES:
        raise NotCompiled(
            f"its categorical features have {categories} categories, over the "
            f"{MAX_CATEGORIES} whose splits onnxmltools converts in reasonable time"
        )

    def build() -> Graph:
        from onnxmltools import convert_xgboost
        from onnxmltools.convert.common.data_types import FloatTensorType

        types = [("input", FloatTensorType([None, len(features)]))]
        # onnxmltools names features f0, f1, ...: a copy of the booster without the
        # DataFrame's column names (the order is the same)
        booster = estimator.get_booster().copy()
        booster.feature_names = None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # converter deprecations are not the user's
            model = convert_xgboost(booster, initial_types=types)
        classifier = hasattr(estimator, "classes_")
        return Graph(model, None, False, True, codes=codes, argmax=classifier)

    return [("with onnxmltools", build)]


def boosting_nodes(estimator: Any) -> int:
    """The tree nodes of an XGBoost or LightGBM model (0 for anything else)."""
    library = type(estimator).__module__.split(".")[0]
    if library == "xgboost":
        return sum(len(tree.splitlines()) for tree in estimator.get_booster().get_dump())
    if library == "lightgbm":
        trees = estimator.booster_.dump_model()["tree_info"]
        return sum(2 * int(tree["num_leaves"]) - 1 for tree in trees)
    return 0
