"""The pandas DataFrame a model fitted on one is called with: one column per feature of
its input schema (``serving.model.schema``), each of its type, built from the typed batch
the batcher merged.

Boundary: standard library, numpy and pandas (imported when a builder is made).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from serving.model.schema import Feature

__all__ = ["frame_builder"]


def frame_builder(features: Sequence[Feature]) -> Callable[[npt.NDArray[Any]], Any]:
    """``batch -> pandas DataFrame`` with the features' names as columns, one column per
    feature of its type (float64, int64, bool, or strings).

    A missing string is NaN, as pandas reads a missing cell, in every batch: in a column of
    pandas' own string dtype where pandas infers one (pandas 3), else in an object column.
    Left to inference, a column of missing values only stayed object ``None`` while one
    holding a string became NaN: scikit-learn takes ``None`` for an unknown category and
    NaN for a missing value, so a request with a null category was answered one way alone
    and another way batched with others (found by a new user's trial). A feature whose
    encoder was fitted on ``None`` (``Feature.missing_is_none``) gets ``None`` instead,
    in an object column, in every batch (found by the next trial).

    A feature the model took as a pandas ``category`` column (``Feature.pandas_categories``:
    LightGBM, XGBoost) is one again, of exactly the model's categories in its order, as
    ``pd.Categorical(values, categories=...)`` makes it in-process: a value not among them,
    like a missing one, is NaN (code -1). The codes are looked up here, so pandas never
    sees a value outside the categories (which it deprecates)."""
    import pandas as pd

    columns = [f.name for f in features]
    categorical = {
        f.name: pd.CategoricalDtype(list(f.pandas_categories))
        for f in features
        if f.pandas_categories is not None
    }
    strings = [
        f.name for f in features
        if f.dtype.kind == "O" and f.kind == "string" and not f.missing_is_none
        and f.name not in categorical
    ]  # fmt: skip
    nones = [f.name for f in features if f.dtype.kind == "O" and f.missing_is_none]
    # pandas 3 infers its str dtype (NaN for missing) from strings; pandas 2 keeps object
    inferred = pd.Series(np.array(["a"], dtype=object)).dtype
    string_dtype = inferred if inferred != np.dtype(object) else None

    def missing_as_nan(values: npt.NDArray[Any]) -> Any:
        if string_dtype is not None:
            return pd.array(values, dtype=string_dtype)  # None -> NaN
        nan = values == None  # noqa: E711 (elementwise, on an object array)
        if not nan.any():
            return values
        values = values.copy()
        values[nan] = np.nan
        return values

    def missing_as_none(values: npt.NDArray[Any]) -> Any:
        nan = pd.isna(values)
        if nan.any():
            values = values.copy()
            values[nan] = None
        return pd.Series(values, dtype=object, copy=False)  # not inferred as str: None stays

    def as_category(values: npt.NDArray[Any], dtype: Any) -> Any:
        codes = dtype.categories.get_indexer(values)  # -1: missing, or not a category
        return pd.Categorical.from_codes(codes, dtype=dtype)

    def to_frame(batch: npt.NDArray[Any]) -> Any:
        if batch.dtype.names is None and not nones and not categorical:
            return pd.DataFrame(batch, columns=columns, copy=False)
        if batch.dtype.names is None:
            data = {name: batch[:, j] for j, name in enumerate(columns)}
        else:
            data = {name: batch[name] for name in columns}
        for name in strings:
            data[name] = missing_as_nan(data[name])
        for name in nones:
            data[name] = missing_as_none(data[name])
        for name, dtype in categorical.items():
            data[name] = as_category(data[name], dtype)
        return pd.DataFrame(data)

    return to_frame
