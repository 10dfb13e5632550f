"""Whether a compiled model answers as the estimator it was compiled from: the rows it is
tried on and how answers are compared (``serving.model.compiled``).

The rows: the schema's sample rows (``ModelHandle.sample``), then rows of the model's own
feature ranges, seeded: for a numeric feature, values around what the estimator learned
(a tree's thresholds, exactly and one float32 step either side, where the trees see the
raw feature or a standard scaler's output, and an XGBoost or LightGBM model's split
thresholds; a scaler's mean and scale or minimum and maximum), a known category for a
categorical feature (and a value not among a pandas category's); in the last quarter of them,
missing values where a feature may be missing.

Boundary: standard library, numpy and ``serving`` core modules.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from serving.model.handle import ModelHandle, Outputs
from serving.model.schema import Feature

__all__ = ["differences", "gate_rows", "trees_of"]

#: Rows of the model's feature ranges tried, after the schema's sample rows.
RANGE_ROWS = 512
_SEED = 20261205


def gate_rows(handle: ModelHandle, estimator: Any, n: int = RANGE_ROWS) -> npt.NDArray[Any]:
    """``handle``'s sample rows and ``n`` rows of ``estimator``'s feature ranges, as a
    typed batch (``(rows, n_features)`` or a record array, as ``handle.sample`` makes)."""
    features = handle.features or ()
    rng = np.random.default_rng(_SEED)
    rows = np.concatenate([handle.sample(4), handle.sample(n)])
    pools = _numeric_pools(estimator, len(features))
    for j, f in enumerate(features):
        values = _column(f, pools.get(j), rng, n)
        if rows.dtype.names is None:
            rows[4:, j] = values
        else:
            rows[f.name][4:] = values
    return rows


def differences(expected: Outputs, got: Outputs, tolerance: float) -> str | None:
    """The first way ``got`` differs from ``expected`` (``None`` when it does not): a
    missing output, one of another shape or type, a label not equal, or the largest
    absolute difference above ``tolerance``, with its row."""
    for name, value in expected.items():
        if name not in got:
            return f"it gives no {name!r}"
        have = np.asarray(got[name])
        want = np.asarray(value)
        if have.shape != want.shape:
            return f"{name!r} has shape {have.shape}, not {want.shape}"
        if have.dtype != want.dtype:
            return f"{name!r} are {have.dtype}, not {want.dtype}"
        if want.dtype.kind not in "fc":
            unequal = np.flatnonzero(_rows(np.asarray(have != want)))
            if unequal.size:
                row = int(unequal[0])
                return (
                    f"{unequal.size} {name!r} differ, first on row {row} "
                    f"({have.reshape(len(have), -1)[row].tolist()} for "
                    f"{want.reshape(len(want), -1)[row].tolist()})"
                )
            continue
        with np.errstate(invalid="ignore"):
            gap = np.abs(have.astype(np.float64) - want.astype(np.float64))
        gap[np.isnan(have) & np.isnan(want)] = 0.0
        gap[np.isnan(gap)] = np.inf
        largest = float(gap.max()) if gap.size else 0.0
        if largest > tolerance:
            row = int(np.unravel_index(int(np.argmax(gap)), gap.shape)[0])
            return f"{name!r} differ by up to {largest:.3g} (row {row}; tolerance {tolerance:g})"
    return None


def _rows(unequal: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
    flat = np.asarray(unequal).reshape(len(unequal), -1)
    return np.asarray(flat.any(axis=1), dtype=np.bool_)


def _column(f: Feature, pool: npt.NDArray[Any] | None, rng: Any, n: int) -> npt.NDArray[Any]:
    """``n`` values of feature ``f``: from its categories, its pool, or around zero; about
    one in ten of the last quarter missing where it may be."""
    if f.categories or f.pandas_categories:
        pandas = (*f.pandas_categories, "not one of them") if f.pandas_categories else ()
        known = sorted(f.categories or pandas, key=repr)
        values = np.empty(n, dtype=object)
        values[:] = [known[i] for i in rng.integers(0, len(known), n)]
    elif f.dtype.kind == "O":
        values = np.array(["", "a", "b", "zz"], dtype=object)[rng.integers(0, 4, n)]
    elif f.kind == "boolean" or f.dtype.kind == "b":
        values = rng.integers(0, 2, n).astype(f.dtype)
    else:
        if pool is not None and pool.size:
            values = pool[rng.integers(0, pool.size, n)]
        else:
            values = rng.normal(0.0, 3.0, n)
        if f.dtype.kind in "iu":
            info = np.iinfo(f.dtype)
            values = np.clip(np.round(values), info.min, info.max)
        values = values.astype(f.dtype)
    if f.missing:  # in the last quarter of the rows only: the rest are whole
        gone = (rng.random(n) < 0.1) & (np.arange(n) >= n - n // 4)
        if values.dtype.kind == "f":
            values[gone] = np.nan
        elif values.dtype.kind == "O":
            values = values.astype(object)
            values[gone] = None
    return values


def _numeric_pools(estimator: Any, width: int) -> dict[int, npt.NDArray[np.float64]]:
    """Per input column, the values the model's ranges suggest: thresholds of trees that
    see the raw column (or a standard scaler's output of it), and a scaler's statistics."""
    boosted = _booster_thresholds(estimator, width)
    if boosted:
        return {j: _float32_edges_of(np.asarray(t)) for j, t in boosted.items()}
    steps = [step for _, step in getattr(estimator, "steps", None) or [("", estimator)]]
    scale = np.ones(width)
    shift = np.zeros(width)
    pools: dict[int, list[npt.NDArray[np.float64]]] = {}
    for step in steps:
        mean, spread = getattr(step, "mean_", None), getattr(step, "scale_", None)
        if mean is not None and spread is not None and np.shape(mean) == (width,):
            for j in range(width):
                pools.setdefault(j, []).append(mean[j] + spread[j] * np.linspace(-3, 3, 13))
            scale, shift = np.asarray(spread, dtype=np.float64), np.asarray(mean, np.float64)
            continue
        low, high = getattr(step, "data_min_", None), getattr(step, "data_max_", None)
        if low is not None and high is not None and np.shape(low) == (width,):
            for j in range(width):
                pools.setdefault(j, []).append(np.linspace(low[j], high[j], 13))
            continue
        for tree in trees_of(step):
            # a tree fitted on missing values splits some at +inf: not a value to send
            inner = (tree.feature >= 0) & np.isfinite(tree.threshold)
            for j, threshold in zip(tree.feature[inner], tree.threshold[inner], strict=True):
                if j < width:
                    edges = _float32_edges(threshold)
                    pools.setdefault(int(j), []).append(edges * scale[j] + shift[j])
        break  # a step that is neither scaler nor tree: its outputs are other columns
    return {j: np.concatenate(parts) for j, parts in pools.items()}


def _booster_thresholds(estimator: Any, width: int) -> dict[int, list[float]]:
    """An XGBoost or LightGBM model's numeric split thresholds per feature column."""
    library = type(estimator).__module__.split(".")[0]
    if library == "lightgbm":
        booster = estimator.booster_
        frame, names = booster.trees_to_dataframe(), booster.feature_name()
        column, value = "split_feature", "threshold"
    elif library == "xgboost":
        booster = estimator.get_booster()
        frame = booster.trees_to_dataframe()
        names = booster.feature_names or [f"f{j}" for j in range(width)]
        column, value = "Feature", "Split"
    else:
        return {}
    import pandas as pd

    where = {name: j for j, name in enumerate(names)}
    found: dict[int, list[float]] = {}
    thresholds = pd.to_numeric(frame[value], errors="coerce")  # categorical splits: NaN
    for name, threshold in zip(frame[column], thresholds, strict=True):
        if name in where and np.isfinite(threshold):
            found.setdefault(where[name], []).append(float(threshold))
    return found


def _float32_edges_of(thresholds: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    return np.concatenate([_float32_edges(t) for t in thresholds])


def _float32_edges(threshold: float) -> npt.NDArray[np.float64]:
    """A threshold and the float32 values either side of it: where a comparison in
    float32 and one in float64 can disagree."""
    narrow = np.float32(threshold)
    return np.array(
        [threshold, narrow, np.nextafter(narrow, np.float32(-np.inf)),
         np.nextafter(narrow, np.float32(np.inf))], dtype=np.float64,
    )  # fmt: skip


def trees_of(step: Any) -> list[Any]:
    """The ``tree_`` objects of a decision tree, a forest or gradient boosting."""
    if hasattr(step, "tree_"):
        return [step.tree_]
    members = getattr(step, "estimators_", None)
    if members is None:
        return []
    flat = np.asarray(members, dtype=object).ravel()
    return [m.tree_ for m in flat if hasattr(m, "tree_")]
