"""The DataFrame a model fitted on one is called with (``serving.model.frames``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from serving.model.frames import frame_builder
from serving.model.schema import Feature, feature, structured_dtype


def test_frames_category_column_has_the_models_categories_unknown_and_missing_as_nan() -> None:
    """A feature with ``pandas_categories`` is a ``category`` column of exactly those, in
    the model's order, whatever the batch holds: as ``pd.Categorical(values,
    categories=...)`` in-process, an unknown value and a missing one are NaN."""
    features = (
        Feature("plan", "string", np.dtype(object), missing=True,
                pandas_categories=("pro", "basic", "team")),
        Feature("tier", "integer", np.dtype(np.int64), missing=True, pandas_categories=(1, 2, 3)),
        feature("usage", "float", np.float64, missing=True),
    )  # fmt: skip
    batch = np.zeros(4, dtype=structured_dtype(features))
    batch["plan"] = ["team", "gold", None, "pro"]
    batch["tier"] = [3, 9, np.nan, 1]  # an integer that may be missing arrives as float64
    batch["usage"] = [1.0, np.nan, 2.0, 3.0]

    frame = frame_builder(features)(batch)

    expected_plan = pd.CategoricalDtype(["pro", "basic", "team"])
    assert frame["plan"].dtype == expected_plan
    assert frame["plan"].cat.codes.tolist() == [2, -1, -1, 0]
    assert frame["tier"].dtype == pd.CategoricalDtype([1, 2, 3])
    assert frame["tier"].cat.codes.tolist() == [2, -1, -1, 0]
    assert frame["usage"].dtype == np.float64


def test_frames_category_dtype_is_the_same_for_every_batch() -> None:
    """Categories are never inferred from a batch: one holding a single value, or only
    missing ones, gets the model's categories too (codes are what the model reads)."""
    features = (Feature("plan", "string", np.dtype(object), missing=True,
                        pandas_categories=("basic", "pro")),)  # fmt: skip
    build = frame_builder(features)

    for values in (["pro"], [None, None], ["basic", "pro", "pro"]):
        batch = np.zeros(len(values), dtype=structured_dtype(features))
        batch["plan"] = values
        column = build(batch)["plan"]
        assert list(column.cat.categories) == ["basic", "pro"]
        assert column.cat.codes.tolist() == [{"basic": 0, "pro": 1}.get(v, -1) for v in values]
