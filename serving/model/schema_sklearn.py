"""The input schema a fitted scikit-learn estimator tells about itself.

- Feature names: ``feature_names_in_`` (set when it was fitted on a pandas DataFrame).
- Kinds and categories: a ``ColumnTransformer`` (the estimator, or a step of its
  ``Pipeline``) says which columns feed a ``OneHotEncoder``/``OrdinalEncoder``; their
  ``categories_`` give the kind (string or integer categories) and, when the encoder's
  ``handle_unknown`` is ``"error"``, the values it accepts. Dropped columns take any
  value. A ``HistGradientBoosting*`` fitted on pandas ``category`` columns
  (``categorical_features="from_dtype"``) keeps its own such transformer; LightGBM and
  XGBoost keep their pandas categories themselves (``serving.model.schema_boosting``).
  Every other column is a float.
- Missing values: a column may be missing when the steps it passes through accept NaN
  (scikit-learn's ``allow_nan`` estimator tag) until one of them fills it in (an imputer,
  or an encoder that saw missing values or ignores unknown ones), walking the pipeline.
  A ``"passthrough"`` (fitted: an identity ``FunctionTransformer``) lets it pass.

Boundary: standard library and numpy; scikit-learn is only looked at through the objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from serving.model.schema import Feature, Kind, feature
from serving.model.schema_boosting import boosting_features

__all__ = ["estimator_features", "estimator_missing"]

_ENCODERS = ("OneHotEncoder", "OrdinalEncoder", "TargetEncoder")
_IMPUTERS = ("SimpleImputer", "KNNImputer", "IterativeImputer", "MissingIndicator")

#: What a step does with NaN: ``fills`` it in, lets it ``pass``, or ``refuses`` it.
Nan = Literal["fills", "pass", "refuses"]


def _steps(estimator: Any) -> list[Any]:
    steps = getattr(estimator, "steps", None)
    return [step for _, step in steps] if steps else [estimator]


def _allows_nan(estimator: Any) -> bool:
    try:
        return bool(estimator.__sklearn_tags__().input_tags.allow_nan)
    except AttributeError:  # not a scikit-learn estimator: nothing is known
        return False


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value))


def _encoder_nan(encoder: Any, column: int) -> Nan:
    categories = encoder.categories_[column]
    if any(_is_missing(value) for value in categories.tolist()):
        return "fills"
    if getattr(encoder, "handle_unknown", "error") != "error":
        return "fills"  # an unknown value, NaN included, is answered (zeros or a code)
    return "refuses"


def _walk(steps: Sequence[Any], column: int | None) -> Nan:
    """What ``steps`` (a pipeline's, in order) do with a NaN in ``column`` of the first."""
    for step in steps:
        name = type(step).__name__
        if name in _IMPUTERS:
            return "fills"
        if name in _ENCODERS and column is not None and hasattr(step, "categories_"):
            return _encoder_nan(step, column)
        if name == "ColumnTransformer":
            return "pass"  # decided per column by the caller
        if _identity(step):
            continue
        if not _allows_nan(step):
            return "refuses"
    return "pass"


def _identity(step: Any) -> bool:
    """Whether ``step`` hands its input on as it is: a ``FunctionTransformer`` without a
    function or validation, which a ``ColumnTransformer``'s ``"passthrough"`` becomes once
    fitted (its ``allow_nan`` tag is False all the same)."""
    return (
        type(step).__name__ == "FunctionTransformer"
        and getattr(step, "func", 0) is None
        and not getattr(step, "validate", True)
    )


def _encoder(transformer: Any) -> Any:
    """The encoder of a column transformer's entry (itself, or a step of its pipeline)."""
    return next((s for s in _steps(transformer) if type(s).__name__ in _ENCODERS), None)


def _category_kind(categories: np.ndarray[Any, Any]) -> tuple[Kind, np.dtype[Any]]:
    values = [v for v in categories.tolist() if not _is_missing(v)]
    if categories.dtype.kind in "OUS" or any(isinstance(v, str) for v in values):
        return "string", np.dtype(object)
    if categories.dtype.kind == "b" or (values and all(type(v) is bool for v in values)):
        return "boolean", np.dtype(np.bool_)
    if categories.dtype.kind in "iu" or all(float(v).is_integer() for v in values):
        return "integer", np.dtype(np.int64)
    return "float", np.dtype(np.float64)


def _guessed(name: str, missing: bool) -> Feature:
    """A column scikit-learn takes as numbers, its type unknown (float64; a bool column
    too, so ``true``/``false`` are taken as 1/0, as scikit-learn casts them)."""
    return feature(name, "float", np.float64, missing=missing, booleans=True)


def estimator_features(model: Any) -> tuple[Feature, ...] | None:
    """The features of a fitted estimator or pipeline fitted on a DataFrame, in its column
    order; None when it was fitted on an array (it knows no feature names).

    :raises ValueError: for a LightGBM or XGBoost model whose pandas categories cannot be
        read from it (``serving.model.schema_boosting``).
    """
    names = getattr(model, "feature_names_in_", None)
    if names is None:
        return None
    names = [str(name) for name in names]
    native = boosting_features(model, names) or _native_categories(model, names)
    if native is not None:
        return native
    steps = _steps(model)
    index = next(
        (i for i, step in enumerate(steps) if type(step).__name__ == "ColumnTransformer"), None
    )
    if index is None or not hasattr(steps[index], "transformers_"):
        missing = _walk(steps, None) != "refuses"
        return tuple(_guessed(name, missing) for name in names)
    before, transformer, after = steps[:index], steps[index], steps[index + 1 :]
    rest = _walk(after, None)
    by_name: dict[str, Feature] = {}
    for _, entry, columns in transformer.transformers_:
        selected = _column_names(columns, names)
        encoder = _encoder(entry) if entry not in ("drop", "passthrough") else None
        for position, name in enumerate(selected):
            by_name[name] = _column_feature(
                name, entry, encoder, position, before=before, rest=rest
            )
    return tuple(by_name.get(name, _guessed(name, rest != "refuses")) for name in names)


def _native_categories(model: Any, names: list[str]) -> tuple[Feature, ...] | None:
    """The features of a gradient boosting model that encodes its own categories
    (``HistGradientBoosting*(categorical_features="from_dtype")`` fitted on pandas
    ``category`` columns): its fitted ``_preprocessor`` is a ``ColumnTransformer`` whose
    ``OrdinalEncoder`` holds them, unknown values and NaN going to the model as missing.
    Every other column is a float that may be missing (the model takes NaN). None for any
    other model."""
    preprocessor: Any = getattr(model, "_preprocessor", None)
    if type(preprocessor).__name__ != "ColumnTransformer":
        return None
    if not hasattr(preprocessor, "transformers_") or not _allows_nan(model):
        return None
    by_name: dict[str, Feature] = {}
    for _, entry, columns in preprocessor.transformers_:
        if type(entry).__name__ == "OrdinalEncoder" and hasattr(entry, "categories_"):
            for position, name in enumerate(_column_names(columns, names)):
                by_name[name] = _column_feature(
                    name, entry, entry, position, before=[], rest="pass"
                )
    return tuple(by_name.get(name, _guessed(name, True)) for name in names)


def estimator_missing(model: Any) -> bool:
    """Whether an estimator fitted on an array accepts NaN in every column."""
    return _walk(_steps(model), None) != "refuses"


def _column_names(columns: Any, names: list[str]) -> list[str]:
    """A ``ColumnTransformer`` entry's columns as names (it takes names, positions, a
    boolean mask or a slice)."""
    if isinstance(columns, str | int):
        columns = [columns]
    if isinstance(columns, slice):
        return names[columns]
    values = list(np.asarray(columns).tolist()) if not isinstance(columns, list) else columns
    if values and isinstance(values[0], bool):
        return [name for name, keep in zip(names, values, strict=True) if keep]
    return [names[v] if isinstance(v, int) else str(v) for v in values]


def _column_feature(
    name: str, entry: Any, encoder: Any, position: int, *, before: list[Any], rest: Nan
) -> Feature:
    if entry == "drop":
        return feature(name, "any", object, missing=True)
    if _walk(before, None) == "refuses":
        nan: Nan = "refuses"
    elif entry == "passthrough":
        nan = rest
    else:
        nan = _walk(_steps(entry), position)
        if nan == "pass":
            nan = rest
    missing = nan != "refuses"
    if encoder is None or not hasattr(encoder, "categories_"):
        return _guessed(name, missing)
    categories = encoder.categories_[position]
    kind, dtype = _category_kind(categories)
    strict = getattr(encoder, "handle_unknown", "error") == "error"
    values = categories.tolist()
    known = frozenset(v for v in values if not _is_missing(v)) if strict else None
    # fitted on None, not NaN (an object column, not as pandas reads one): None it knows
    none = any(v is None for v in values) and not any(
        _is_missing(v) for v in values if v is not None
    )
    return Feature(name, kind, dtype, missing, known, missing_is_none=none and dtype.kind == "O")
