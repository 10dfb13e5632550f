"""An XGBoost or LightGBM model as an ONNX graph (onnxmltools), for
``serving.model.compiled`` to try under the same parity rows as a scikit-learn model.

Both libraries compare float32 values with float32 thresholds, so the graph takes the
features as one ``(batch, n_features)`` float32 input, in the model's column order. A
feature the model took as a pandas ``category`` column reaches the graph as its code: its
position among the model's categories, NaN when missing or not among them, as pandas
codes it in-process (``serving.model.frames``). Labels come from the probabilities'
argmax: LightGBM's graph declares its ``label`` output with a shape it does not give.

Boundary: standard library, numpy and ``serving`` core modules; onnxmltools is imported
when a model is converted.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from serving.model.convert import Graph, NotCompiled
from serving.model.handle import ModelHandle

__all__ = ["boosting_candidates", "boosting_nodes"]


def boosting_candidates(
    estimator: Any, handle: ModelHandle
) -> list[tuple[str, Callable[[], Graph]]]:
    """The one way to compile an XGBoost or LightGBM scikit-learn-API model."""
    library = type(estimator).__module__.split(".")[0]
    features = handle.features or ()
    codes = tuple(f.pandas_categories for f in features)
    if any(f.dtype.kind == "O" and f.pandas_categories is None for f in features):
        raise NotCompiled("it takes strings that are not pandas categories")

    def build() -> Graph:
        from onnxmltools import convert_lightgbm, convert_xgboost
        from onnxmltools.convert.common.data_types import FloatTensorType

        types = [("input", FloatTensorType([None, len(features)]))]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # converter deprecations are not the user's
            if library == "xgboost":
                # onnxmltools names features f0, f1, ...: a copy of the booster without
                # the DataFrame's column names (the order is the same)
                booster = estimator.get_booster().copy()
                booster.feature_names = None
                model = convert_xgboost(booster, initial_types=types)
            else:
                model = convert_lightgbm(estimator, initial_types=types, zipmap=False)
        classifier = hasattr(estimator, "classes_")
        return Graph(model, None, False, True, codes=codes, argmax=classifier)

    return [(f"with onnxmltools ({library})", build)]


def boosting_nodes(estimator: Any) -> int:
    """The tree nodes of an XGBoost or LightGBM model (0 for anything else)."""
    library = type(estimator).__module__.split(".")[0]
    if library == "xgboost":
        return sum(len(tree.splitlines()) for tree in estimator.get_booster().get_dump())
    if library == "lightgbm":
        trees = estimator.booster_.dump_model()["tree_info"]
        return sum(2 * int(tree["num_leaves"]) - 1 for tree in trees)
    return 0
