"""Request values (JSON scalars, CSV cells read by ``serving.inputs.cells``, tensor elements) ->
typed numpy columns.

Each value is checked against its feature (``serving.model.schema.Feature``): a float feature
takes a finite number, an integer feature a whole number its element type can hold
(exactly: Python ints go straight to int64, never through float64), a string feature a
string (and, when its encoder refuses unknown values, one of its categories), a boolean
feature true or false. ``null`` (and NaN) is a missing value: passed on as NaN (numbers)
or None (strings) where the feature may be missing, else refused.

Conversion goes through numpy in C where the types allow (one type check per value, no
Python per value otherwise); only a refused batch is walked value by value, to name the
first bad one, so a body of 500,000 bad values costs one pass and stops at the first.
Typed arrays (KServe V2 tensors) are checked with numpy alone: ``typed_matrix`` for a
tensor holding every feature (itself, no copy, when it has the batch's dtype),
``column`` for one feature's values; a float32 column for a float32 feature is not
copied, and neither becomes a Python list unless a value is refused.

Boundary: standard library, numpy and ``serving`` core modules.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from serving.errors import InvalidInput
from serving.model.schema import Feature, once_per_features

__all__ = ["Locate", "column", "matrix", "show", "typed_matrix", "value_error"]

#: ``(instance, feature) -> location`` in the request's own terms (``instances[0].age``).
Locate = Callable[[int, int], str]

_NUMBERS = frozenset({int, float})


#: How JSON writes the values whose Python repr differs (what the client sent).
_JSON_TERMS: dict[Any, str] = {True: "true", False: "false", None: "null"}


def show(value: Any) -> str:
    """``value`` as the client wrote it: JSON's ``true``, ``false``, ``null``, ``NaN``,
    ``Infinity``, else its repr, cut to 40 characters with ``...`` (a 5 MB string stays
    short)."""
    if value is None or type(value) is bool:
        return _JSON_TERMS[value]
    if type(value) is float and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _is_nan(value: Any) -> bool:
    return type(value) is float and math.isnan(value)


def value_error(value: Any, f: Feature) -> tuple[str, str] | None:  # noqa: PLR0911
    """Why ``value`` cannot be a value of ``f`` (message, error type), or None if it can."""
    if value is None or _is_nan(value):
        if f.missing:
            return None
        return "missing value: this feature may not be missing", "missing_value"
    if f.kind == "any":
        return None
    if f.kind == "string":
        if type(value) is not str:
            what = "categorical" if f.categories is not None else "a string column"
            return f"{show(value)} is not a string (the feature is {what})", "string_type"
    elif f.kind == "boolean":
        if type(value) is not bool:
            return f"{show(value)} is not true or false", "bool_type"
    elif type(value) not in _NUMBERS and not (f.booleans and type(value) is bool):
        return f"{show(value)} is not a number", f"{f.kind}_type"
    else:
        why = _number_error(value, f)
        if why is not None:
            return why
    if f.categories is not None and value not in f.categories:
        return _unknown(value, f), "unknown_category"
    return None


def _number_error(value: float, f: Feature) -> tuple[str, str] | None:
    if f.kind == "float":
        try:
            number = float(value)
        except OverflowError:
            return f"{show(value)} is outside the float64 range", "out_of_range"
        if not math.isfinite(number):
            return f"{show(number)} is not a finite number", "finite_number"
        if f.dtype.itemsize < 8 and abs(number) > float(np.finfo(cast(Any, f.dtype)).max):
            limit = float(np.finfo(cast(Any, f.dtype)).max)
            why = f"outside the model's {f.dtype.name} range (|x| <= {limit:.4g})"
            return f"{number:g} is {why}", "out_of_range"
        return None
    info = np.iinfo(cast(Any, f.dtype if f.dtype.kind in "iu" else np.int64))
    integral = type(value) is int or (math.isfinite(value) and float(value).is_integer())
    if integral and info.min <= value <= info.max:
        return None
    shown = show(value) if type(value) is int else f"{value:g}"
    return f"{shown} is not an integer the model's {info.dtype.name} input can hold", "out_of_range"


def _unknown(value: Any, f: Feature) -> str:
    assert f.categories is not None
    known = sorted(f.categories, key=repr)
    shown = ", ".join(repr(v) for v in known[:10]) + (", ..." if len(known) > 10 else "")
    return f"unknown category {show(value)} (known: {shown})"


def _checked(values: Sequence[Any], f: Feature, loc: Callable[[int], str]) -> npt.NDArray[Any]:
    """The slow path: each value checked in Python; the first refused one raises."""
    for i, value in enumerate(values):
        why = value_error(value, f)
        if why is not None:
            raise InvalidInput.at(loc(i), *why)
    return _convert(values, f)


def _convert(values: Sequence[Any], f: Feature) -> npt.NDArray[Any]:
    """Values already checked against ``f`` as its column."""
    absent = [v is None or _is_nan(v) for v in values]
    if f.kind == "float":
        out = np.array([math.nan if a else float(v) for v, a in zip(values, absent, strict=True)])
        return out.astype(f.dtype, copy=False)
    if f.kind == "integer":
        if any(absent):
            return np.array([math.nan if a else v for v, a in zip(values, absent, strict=True)],
                            dtype=np.float64)  # fmt: skip
        return np.array([int(v) for v in values], dtype=f.dtype)
    if f.kind == "boolean" and not any(absent):
        return np.array(values, dtype=np.bool_)
    return _objects([None if a else v for v, a in zip(values, absent, strict=True)])


def column(  # noqa: PLR0911 (one return per kind's fast path)
    values: Sequence[Any], f: Feature, loc: Callable[[int], str]
) -> npt.NDArray[Any]:
    """One feature's values as a 1-D array of its element type (float64 with NaN for an
    integer feature that may be missing and is).

    :raises InvalidInput: (422) naming the first refused value's location.
    """
    if isinstance(values, np.ndarray) and values.dtype.kind != "O":
        return _typed_column(values, f, loc)
    types = set(map(type, values))
    has_missing = type(None) in types or (
        float in types and f.kind != "string" and any(map(_is_nan, values))
    )
    if has_missing and not f.missing:
        return _checked(values, f, loc)
    kind = f.kind
    try:
        if kind in ("float", "integer"):
            out = _numbers(values, f, types, has_missing)
            if out is not None:
                return out
        elif kind == "string" and types <= {str, type(None)}:
            out = np.array(values, dtype=object) if len(values) != 1 else _one(values[0])
            if f.categories is None or f.categories.issuperset(values):
                return out
            if has_missing and f.categories.issuperset(v for v in values if v is not None):
                return out
        elif kind == "boolean" and types <= {bool}:
            return np.array(values, dtype=np.bool_)
        elif kind == "any":
            return _objects(values)
    except OverflowError:
        pass
    return _checked(values, f, loc)


def _numbers(
    values: Sequence[Any], f: Feature, types: set[type], has_missing: bool
) -> npt.NDArray[Any] | None:
    """A number feature's fast path: its column built in C, or None when a value may be
    refused (the caller then names it). ``has_missing``: only where ``f`` may be missing.

    :raises OverflowError: for an int past float64's or the integer type's range.
    """
    if f.kind == "float" and types <= {int, float, type(None)}:
        out = np.array([math.nan if v is None else v for v in values] if has_missing
                       else values, dtype=np.float64)  # fmt: skip
        finite = np.isfinite(out) | np.isnan(out) if has_missing else np.isfinite(out)
        fits = f.dtype.itemsize == 8 or _fits_float(out, f.dtype)
        if finite.all() and fits and _known(out, f):
            return out if f.dtype.itemsize == 8 else out.astype(f.dtype)
    elif f.kind == "integer" and types <= {int, type(None)}:
        if has_missing:
            out = np.array([math.nan if v is None else v for v in values], dtype=np.float64)
        else:
            out = np.array(values, dtype=f.dtype)
        if _known(out, f):
            return out
    return None


def _known(out: npt.NDArray[Any], f: Feature) -> bool:
    """True when every value of the number column ``out`` is one of ``f``'s categories (or
    missing, NaN), or ``f`` takes any value."""
    if f.categories is None:
        return True
    known = np.isin(out, np.array(list(f.categories)))  # ints stay exact int64
    if out.dtype.kind == "f":
        known |= np.isnan(out)
    return bool(known.all())


def _one(value: Any) -> npt.NDArray[Any]:
    out = np.empty(1, dtype=object)
    out[0] = value
    return out


def _objects(values: Sequence[Any]) -> npt.NDArray[Any]:
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out


def _fits_float(values: npt.NDArray[np.float64], dtype: np.dtype[Any]) -> bool:
    limit = float(np.finfo(cast(Any, dtype)).max)
    return bool((np.abs(values[~np.isnan(values)]) <= limit).all())


def _typed_column(
    values: npt.NDArray[Any], f: Feature, loc: Callable[[int], str]
) -> npt.NDArray[Any]:
    """A column that arrived typed (a KServe V2 tensor): numbers for number features."""
    if f.kind in ("float", "integer") and values.dtype.kind in "biuf":
        if values.dtype.kind == "b":  # a BOOL tensor into a number: 0 and 1
            values = values.astype(np.int64)
        if f.kind == "integer" and values.dtype.kind in "iu":
            info = np.iinfo(cast(Any, f.dtype))
            if values.size and (values.min() < info.min or values.max() > info.max):
                bad = int(np.argmax((values < info.min) | (values > info.max)))
                _checked([values[bad].item()], f, lambda _: loc(bad))
            if _known(values, f):
                return values.astype(f.dtype, copy=False)
        if f.kind == "float" and values.dtype.kind == "f":
            ok = np.isfinite(values) | (np.isnan(values) if f.missing else False)
            fits = values.dtype.itemsize <= f.dtype.itemsize or _fits_float(values, f.dtype)
            if ok.all() and fits and _known(values, f):
                return values.astype(f.dtype, copy=False)
        return column(values.tolist(), f, loc)
    if f.kind == "boolean" and values.dtype.kind == "b":
        return values
    return column(values.tolist(), f, loc)


def typed_matrix(
    values: npt.NDArray[Any], features: Sequence[Feature], dtype: np.dtype[Any]
) -> npt.NDArray[Any] | None:
    """A typed ``(n_instances, n_features)`` block (one KServe V2 tensor holding every
    feature) as the batch of ``dtype`` (``uniform_dtype(features)``), each value checked
    against its feature with numpy over the whole block: ``values`` itself, no copy, when
    it already has ``dtype``; else one cast.

    :returns: None when a value may be refused, or the kinds need a value-by-value
        conversion (floats into integer features, categories): the caller then builds
        the batch column by column, naming the first refused value.
    """
    kind = values.dtype.kind
    if kind not in "biuf" or _plan(features)[0]:  # a category: value by value
        return None
    if dtype.kind == "f":
        fits = kind != "f" or _floats_fit(values, features)
    else:
        fits = kind != "f" and (kind == "b" or _integers_fit(values, features))
    return values.astype(dtype, copy=False) if fits else None


def _floats_fit(values: npt.NDArray[Any], features: Sequence[Feature]) -> bool:
    """True when every value of the float block is finite (or NaN where its feature may
    be missing) and within float32's range where its feature is float32."""
    ok = np.isfinite(values)
    _, missing, float32 = _plan(features)
    if missing is not None:
        ok |= np.isnan(values) & missing
    if not ok.all():
        return False
    narrow = float32 if values.itemsize > 4 else []
    if not narrow:
        return True
    part = values if len(narrow) == len(features) else values[:, narrow]
    with np.errstate(invalid="ignore"):  # NaN, a missing value, compares False
        return not (np.abs(part) > float(np.finfo(np.float32).max)).any()


#: ``_plan`` of the feature tuples seen last (a model's own: one per model), by identity:
#: ``(features, plan)``.
_PLANS: dict[int, tuple[Sequence[Feature], Any]] = {}
_PLANS_KEPT = 64


def _plan(
    features: Sequence[Feature],
) -> tuple[bool, npt.NDArray[np.bool_] | None, list[int]]:
    """Whether any feature is categorical; per feature, whether it may be missing (None
    when none may); and the float32 features' columns: worked out once per features
    tuple, not per request."""
    entry = _PLANS.get(id(features))
    if entry is not None and entry[0] is features:
        return entry[1]  # type: ignore[no-any-return]
    missing = [f.missing for f in features]
    plan = (
        any(f.categories is not None for f in features),
        np.array(missing) if any(missing) else None,
        [j for j, f in enumerate(features) if f.dtype.itemsize < 8],
    )
    if len(_PLANS) >= _PLANS_KEPT:
        _PLANS.clear()
    _PLANS[id(features)] = (features, plan)
    return plan


def _integers_fit(values: npt.NDArray[Any], features: Sequence[Feature]) -> bool:
    """True when every value of the integer block fits its feature's integer type."""
    small = [j for j, f in enumerate(features) if not np.can_cast(values.dtype, f.dtype)]
    if not small:
        return True
    low, high = values.min(axis=0), values.max(axis=0)
    for j in small:  # int64 values for int32 features, uint64 for int64
        info = np.iinfo(cast(Any, features[j].dtype))
        if low[j] < info.min or high[j] > info.max:
            return False
    return True


def matrix(
    rows: Sequence[Sequence[Any]], features: Sequence[Feature], dtype: np.dtype[Any], loc: Locate
) -> npt.NDArray[Any]:
    """Rows of equal length (checked by the caller) as one ``(n_instances, n_features)``
    array of ``dtype`` (float64 or int64), every value checked against its feature.

    :raises InvalidInput: (422) naming the first refused value's instance and feature.
    """
    types = set(map(type, chain.from_iterable(rows)))
    allowed = {int, float} if dtype.kind == "f" else {int}
    if types <= allowed:
        try:
            out = _array(rows, dtype)
        except OverflowError:
            out = None
        if out is not None and _matrix_ok(out, features):
            return out
    elif dtype.kind == "f" and types <= allowed | {type(None)}:
        missing = [f.missing for f in features]
        nan = [[math.nan if v is None else v for v in row] for row in rows]
        out = _array(nan, dtype)
        absent = np.isnan(out)
        if not (absent & ~np.array(missing)).any() and _matrix_ok(out, features, absent):
            return out
    for i, row in enumerate(rows):
        for j, value in enumerate(row):
            why = value_error(value, features[j])
            if why is not None:
                raise InvalidInput.at(loc(i, j), *why)
    columns = [_convert([row[j] for row in rows], f) for j, f in enumerate(features)]
    return np.stack(columns, axis=1).astype(dtype)


def _array(rows: Sequence[Sequence[Any]], dtype: np.dtype[Any]) -> npt.NDArray[Any]:
    """``np.array(rows, dtype)``; past float32's range a value becomes inf (refused by
    ``_matrix_ok``), without numpy's overflow warning. Only a float32 batch pays for the
    ``errstate`` (about 3 us)."""
    if dtype.kind == "f" and dtype.itemsize < 8:
        with np.errstate(over="ignore"):
            return np.array(rows, dtype=dtype)
    return np.array(rows, dtype=dtype)


def _matrix_ok(
    out: npt.NDArray[Any], features: Sequence[Feature], absent: npt.NDArray[np.bool_] | None = None
) -> bool:
    """True when every value of ``out`` fits its feature (finite, within float32's range
    for a float32 feature, an integer for an integer one)."""
    narrow, small, known = _checks(features)
    if out.dtype.kind == "f":
        finite = np.isfinite(out) if absent is None else np.isfinite(out) | absent
        if not finite.all():
            return False
        if narrow:
            limit = float(np.finfo(np.float32).max)
            if (np.abs(np.nan_to_num(out[:, narrow])) > limit).any():
                return False
        return all(_known(out[:, j], features[j]) for j in known)
    for j in small:
        info = np.iinfo(cast(Any, features[j].dtype))
        if ((out[:, j] < info.min) | (out[:, j] > info.max)).any():
            return False
    return all(_known(out[:, j], features[j]) for j in known)


@once_per_features
def _checks(features: Sequence[Feature]) -> tuple[list[int], list[int], list[int]]:
    """The columns of ``features`` that need a check beyond finiteness: float32 ones
    (range), integers narrower than int64 (range), those with known categories."""
    narrow = [j for j, f in enumerate(features) if f.dtype.kind == "f" and f.dtype.itemsize < 8]
    small = [j for j, f in enumerate(features) if f.dtype.itemsize < 8]
    known = [j for j, f in enumerate(features) if f.categories is not None]
    return narrow, small, known
