"""The input schema of a LightGBM or XGBoost model (their scikit-learn estimators, such as
``LGBMClassifier`` or ``XGBClassifier(enable_categorical=True)``) fitted on a DataFrame
with pandas ``category`` columns, which it encodes itself: which columns were categories,
and their categories in order, read from the model.

- LightGBM: ``booster_.pandas_categorical`` holds the categories of the frame's category
  columns, in column order; ``booster_.params["categorical_column"]`` (or
  ``"categorical_feature"`` on a booster read back from text) the positions of its
  categorical features. When the two do not pair up (an ordered category column, which
  LightGBM takes as numbers, or ``categorical_feature`` naming a column of numbers), which
  columns were categories cannot be told, and the model is refused at load.
- XGBoost: ``get_booster().feature_types`` marks categorical features ``"c"``; their
  categories are in the model's JSON (``save_raw("json")``, the format XGBoost keeps them
  in across versions: ``learner.gradient_booster.model.cats``), written by XGBoost 3.1 and
  later. Its ``get_categories(export_to_arrow=True)`` gives the same, but needs pyarrow.

Every other column is a float that may be missing: both take NaN. A category column
takes any value of its categories' kind (string or integer) or ``null``; a value not
among its categories reaches the model as NaN, as it does in-process through
``pd.Categorical(values, categories=...)`` (LightGBM itself sets the training categories
on a frame whose categories differ, with the same effect).

Boundary: standard library and numpy; LightGBM and XGBoost are only looked at through the
objects (never imported, never changed).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from serving.model.schema import Feature, Kind, feature

__all__ = ["boosting_features"]


def boosting_features(model: Any, names: Sequence[str]) -> tuple[Feature, ...] | None:
    """The features of a LightGBM or XGBoost estimator fitted on a DataFrame of columns
    ``names`` with at least one pandas ``category`` column; None for any other model (or
    one fitted without categories).

    :raises ValueError: naming the model's library and why, when it has categories whose
        columns or values cannot be read from it.
    """
    module = type(model).__module__.split(".")[0]
    if module == "lightgbm":
        categories = _lightgbm_categories(model, names)
    elif module == "xgboost":
        categories = _xgboost_categories(model, names)
    else:
        return None
    if not categories:
        return None
    return tuple(
        _category_feature(name, categories[name]) if name in categories
        else feature(name, "float", np.float64, missing=True, booleans=True)
        for name in names
    )  # fmt: skip


def _category_feature(name: str, categories: list[Any]) -> Feature:
    """A pandas category column: the kind of its categories (strings, or integers), any
    value of it taken (an unknown one is NaN to the model), ``null`` too."""
    kind: Kind
    if all(isinstance(c, str) for c in categories):
        kind, dtype = "string", np.dtype(object)
    elif all(isinstance(c, int | np.integer) and not isinstance(c, bool) for c in categories):
        kind, dtype = "integer", np.dtype(np.int64)
    else:
        raise ValueError(
            f"column {name!r}: categories that are neither all strings nor all integers "
            f"({', '.join(sorted({type(c).__name__ for c in categories}))})"
        )
    return Feature(name, kind, dtype, missing=True, pandas_categories=tuple(categories))


def _lightgbm_categories(model: Any, names: Sequence[str]) -> dict[str, list[Any]]:
    """Column name -> its categories, for each pandas category column LightGBM was fitted
    on (``{}``: none).

    :raises ValueError: when the category lists and the categorical features do not pair up.
    """
    try:
        booster = model.booster_
    except AttributeError:  # not fitted (LightGBM's LGBMNotFittedError is one)
        return {}
    categories = getattr(booster, "pandas_categorical", None) or []
    if not categories:
        return {}
    params = getattr(booster, "params", None) or {}
    given = params.get("categorical_column", params.get("categorical_feature"))
    positions = _positions(given, names)
    if positions is None or len(positions) != len(categories):
        raise ValueError(
            f"LightGBM model: it holds the categories of {len(categories)} pandas category "
            f"column(s) (pandas_categorical) but its categorical features are {given!r}, so "
            "which columns were categories cannot be told from it (an ordered category "
            "column, or categorical_feature naming columns of numbers); fit it with "
            "unordered category columns as its only categorical features"
        )
    return {names[j]: list(c) for j, c in zip(positions, categories, strict=True)}


def _positions(given: Any, names: Sequence[str]) -> list[int] | None:
    """LightGBM's categorical features (positions, names, or text ``"0,1"`` /
    ``"name:a,b"``) as sorted positions in ``names``; None when they cannot be read."""
    if isinstance(given, str):
        text = given.removeprefix("name:")
        given = [part.strip() for part in text.split(",") if part.strip()]
    if not isinstance(given, list | tuple):
        return None
    positions = []
    for item in given:
        position = int(item) if isinstance(item, str) and item.isdigit() else item
        if isinstance(position, int | np.integer) and 0 <= position < len(names):
            positions.append(int(position))
        elif isinstance(position, str) and position in names:
            positions.append(list(names).index(position))
        else:
            return None
    return sorted(set(positions))


def _xgboost_categories(model: Any, names: Sequence[str]) -> dict[str, list[Any]]:
    """Column name -> its categories, for each feature XGBoost marks categorical (``{}``:
    none).

    :raises ValueError: when the model keeps no categories (written before XGBoost 3.1),
        or they cannot be read.
    """
    get_booster = getattr(model, "get_booster", None)
    if not callable(get_booster):
        return {}
    try:
        booster = get_booster()
    except (AttributeError, ValueError):  # scikit-learn's NotFittedError is both
        return {}
    types = list(getattr(booster, "feature_types", None) or [])
    if "c" not in types:
        return {}
    if len(types) != len(names):
        raise ValueError(f"XGBoost model: {len(types)} feature types for {len(names)} columns")
    encoded = _json_categories(booster)
    if len(encoded) != len(names):
        raise ValueError(
            "XGBoost model: it keeps no categories of its categorical features (models "
            "fitted with XGBoost 3.1 or later do), so its columns' categories cannot be "
            "known; fit it again with XGBoost 3.1 or later"
        )
    return {
        name: _decoded(name, entry)
        for name, kind, entry in zip(names, types, encoded, strict=True)
        if kind == "c"
    }


def _json_categories(booster: Any) -> list[Any]:
    """The per-feature category entries of the model's JSON (``[]`` when it has none): the
    whole model is written once, at load, to read them."""
    learner = json.loads(booster.save_raw("json")).get("learner", {})
    gradient_booster = learner.get("gradient_booster", {})
    model = gradient_booster.get("model") or gradient_booster.get("gbtree", {}).get("model", {})
    encoded = (model.get("cats") or {}).get("enc") or []
    return list(encoded)


def _decoded(name: str, entry: Any) -> list[Any]:
    """One feature's categories from the model's JSON: strings as bytes cut at
    ``offsets``, numbers as ``values``.

    :raises ValueError: for an entry of another shape, no categories, or strings that are
        not ASCII.
    """
    values = entry.get("values") if isinstance(entry, dict) else None
    if not isinstance(values, list) or not values:
        raise ValueError(f"XGBoost model: no categories for categorical column {name!r}")
    if "offsets" in entry:
        data = bytes(v & 0xFF for v in values)
        if not data.isascii():
            raise ValueError(
                f"XGBoost model: column {name!r} has categories that are not ASCII, which "
                "XGBoost keeps cut short (its offsets count characters, not bytes: 3.2 "
                "does), so they cannot be read back; fit it on ASCII categories"
            )
        offsets = entry["offsets"]
        return [data[start:end].decode("ascii") for start, end in itertools.pairwise(offsets)]
    return list(values)
