"""Decoded instances (``serving.instances``) -> the batch one model's batcher merges.

``conform(instances, handle)`` checks a request's instances against the model's inputs
(feature count, feature and input names, the values its input types can hold) and
builds the ``(n_instances, n_features)`` float64 matrix the batcher concatenates with
other requests' rows.

Every refusal is ``InvalidInput`` (422) naming the instance and the feature, in the
protocol's own terms (``instances[0].age``, ``inputs[1]``, ``csv[3].plan``).

Boundary: standard library, numpy and ``serving`` core modules (no Flask, no pydantic).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from serving.errors import InvalidInput
from serving.handle import ModelHandle, TensorSpec
from serving.instances import Columns, Frame, Instances, Records, Tensors

__all__ = ["check_names", "check_range", "conform", "invalid"]


def invalid(loc: str, msg: str, kind: str) -> InvalidInput:
    """A 422 naming one location."""
    return InvalidInput(f"{loc}: {msg}", [{"loc": loc, "msg": msg, "type": kind}])


def check_names(keys: Sequence[str], names: Sequence[str], loc: str, what: str) -> None:
    """:raises InvalidInput: (422) naming the first of ``names`` missing from ``keys``,
    else the first key that is none of ``names``, else a key given twice."""
    missing = [name for name in names if name not in keys]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise invalid(loc, f"missing {what} {missing[0]!r}{more}", f"missing_{what}")
    unknown = next((key for key in keys if key not in names), None)
    if unknown is not None:
        msg = f"unknown {what} {unknown!r}; the model's {what}s are {', '.join(names)}"
        raise invalid(f"{loc}.{unknown}", msg, f"unknown_{what}")
    if len(keys) != len(set(keys)):
        twice = next(key for i, key in enumerate(keys) if key in keys[:i])
        raise invalid(loc, f"{what} {twice!r} is given twice", f"duplicate_{what}")


def conform(instances: Instances, handle: ModelHandle) -> npt.NDArray[np.float64]:
    """``instances`` as the ``(n_instances, n_features)`` float64 rows of ``handle``'s model,
    checked against its inputs.

    :raises InvalidInput: (422) naming the first instance and feature that is wrong: a
        wrong feature count, a missing, unknown or repeated name, a value the model's
        input type cannot hold.
    """
    if isinstance(instances, Frame):
        rows = _frame(instances, handle)
    elif isinstance(instances, Records):
        rows = _records(instances.rows, handle, instances.field)
    elif isinstance(instances, Columns):
        rows = _columns(instances, handle)
    else:
        rows = _tensors(instances, handle)
    check_range(rows, handle.input_dtype, handle.column_dtypes, instances.field,
                handle.feature_names)  # fmt: skip
    return rows


def _matrix(
    rows: Sequence[Sequence[Any]], handle: ModelHandle, field: str
) -> npt.NDArray[np.float64]:
    """Positional rows as float64, each checked to have the model's feature count."""
    n_features = handle.n_features
    expected = n_features if n_features is not None else len(rows[0])
    for index, row in enumerate(rows):
        if isinstance(row, Mapping):
            raise invalid(f"{field}[{index}]", "mixes lists and objects", "instance_kind")
        if len(row) != expected:
            source = "the model expects" if n_features is not None else "instances[0] has"
            raise InvalidInput(
                f"{field}[{index}] has {len(row)} features; {source} {expected}",
                [
                    {
                        "loc": f"{field}[{index}]",
                        "msg": f"expected {expected} features, got {len(row)}",
                        "type": "feature_count",
                    }
                ],
            )
    return np.array(rows, dtype=np.float64)


def _frame(frame: Frame, handle: ModelHandle) -> npt.NDArray[np.float64]:
    rows, columns = frame.rows, frame.columns
    if columns is not None:
        for index, row in enumerate(rows):
            if len(row) != len(columns):
                msg = f"has {len(row)} values for {len(columns)} columns"
                raise invalid(f"{frame.field}[{index}]", msg, "row_length")
        if handle.feature_names is not None:
            names = [str(column) for column in columns]
            check_names(names, handle.feature_names, frame.columns_field, "feature")
            order = [names.index(name) for name in handle.feature_names]
            rows = [[row[j] for j in order] for row in rows]
    return _matrix(rows, handle, frame.field)


def _by_input_name(handle: ModelHandle, keys: Sequence[str]) -> bool:
    """True when objects are keyed by input name rather than by feature name."""
    features = handle.feature_names or ()
    inputs = [spec.name for spec in handle.input_specs()]
    first = next(iter(keys), None)
    if first is not None and first in features:
        return False
    return first in inputs or not features


def _input_row(instance: Mapping[str, Any], specs: tuple[TensorSpec, ...], loc: str) -> list[Any]:
    check_names(list(instance), [spec.name for spec in specs], loc, "input")
    row: list[Any] = []
    for spec in specs:
        value = instance[spec.name]
        values = value if isinstance(value, list) else [value]
        if spec.width >= 0 and len(values) != spec.width:
            msg = f"input {spec.name!r} takes {spec.width} values, got {len(values)}"
            raise invalid(f"{loc}.{spec.name}", msg, "input_width")
        row.extend(values)
    return row


def _scalar(value: Any, loc: str) -> Any:
    if isinstance(value, list):
        if len(value) != 1:
            raise invalid(loc, f"a feature takes one value, got {len(value)}", "feature_width")
        return value[0]
    return value


def _records(
    records: Sequence[Mapping[str, Any]], handle: ModelHandle, field: str
) -> npt.NDArray[np.float64]:
    """Objects keyed by feature name (or input name), in the model's feature order; for a
    model without feature names, in the first record's key order."""
    for index, record in enumerate(records):
        if not isinstance(record, Mapping):
            raise invalid(f"{field}[{index}]", "mixes lists and objects", "instance_kind")
    if _by_input_name(handle, list(records[0])) and handle.inputs is not None:
        specs = handle.input_specs()
        rows = [_input_row(record, specs, f"{field}[{i}]") for i, record in enumerate(records)]
        return _matrix(rows, handle, field)
    names = handle.feature_names
    if names is None:
        names = tuple(records[0])
        for index, record in enumerate(records):
            if record.keys() != set(names):
                check_names(list(record), names, f"{field}[{index}]", "column")
    known = set(names)
    rows = []
    for index, record in enumerate(records):
        loc = f"{field}[{index}]"
        missing = [name for name in names if name not in record]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise invalid(loc, f"missing feature {missing[0]!r}{more}", "missing_feature")
        if len(record) != len(names):
            unknown = next(key for key in record if key not in known)
            msg = f"unknown feature {unknown!r}; the model's features are {', '.join(names)}"
            raise invalid(f"{loc}.{unknown}", msg, "unknown_feature")
        rows.append([_scalar(record[name], f"{loc}.{name}") for name in names])
    return _matrix(rows, handle, field)


def _columns(columns: Columns, handle: ModelHandle) -> npt.NDArray[np.float64]:
    keys = list(columns.data)
    if handle.inputs is not None and _by_input_name(handle, keys):
        check_names(keys, [spec.name for spec in handle.input_specs()], columns.field, "input")
    elif handle.feature_names is not None:
        check_names(keys, handle.feature_names, columns.field, "feature")
    records = [{name: values[i] for name, values in columns.data.items()}
               for i in range(columns.n)]  # fmt: skip
    return _records(records, handle, columns.field)


def _tensors(tensors: Tensors, handle: ModelHandle) -> npt.NDArray[np.float64]:
    """Each of the model's inputs sent once under its name, laid side by side."""
    specs = handle.input_specs()
    names = [spec.name for spec in specs]
    given: dict[str, int] = {}
    for index, (name, _) in enumerate(tensors.inputs):
        loc = f"inputs[{index}]"
        if name not in names:
            msg = f"the model has no input {name!r} (its inputs: {', '.join(names)})"
            raise invalid(loc, msg, "input_name")
        if name in given:
            raise invalid(loc, f"input {name!r} is given twice", "input_name")
        given[name] = index
    missing = [name for name in names if name not in given]
    if missing:
        msg = f"missing input {missing[0]!r} (the model's inputs: {', '.join(names)})"
        raise invalid("inputs", msg, "input_name")
    parts: list[npt.NDArray[np.float64]] = []
    for spec in specs:
        index = given[spec.name]
        values, loc = tensors.inputs[index][1], f"inputs[{index}]"
        shape, width = list(values.shape), spec.width
        fits = (len(shape) == 2 and width in (-1, shape[1])) or (len(shape) == 1 and width == 1)
        if not fits or shape[0] == 0 or (len(shape) == 2 and shape[1] == 0):
            msg = (
                f"input {spec.name!r} has shape {shape}; the model takes {list(spec.shape)} "
                "(-1: any number of instances, at least one)"
            )
            raise invalid(loc, msg, "shape")
        rows = values.reshape(shape[0], -1).astype(np.float64)
        if parts and len(rows) != len(parts[0]):
            first = tensors.inputs[given[specs[0].name]][0]
            msg = f"input {spec.name!r} has {len(rows)} instances; input {first!r} has "
            raise invalid(loc, msg + str(len(parts[0])), "shape")
        parts.append(rows)
    matrix = parts[0] if len(parts) == 1 else np.hstack(parts)
    if handle.n_features is not None and matrix.shape[1] != handle.n_features:
        msg = (
            f"the inputs have {matrix.shape[1]} features in all; the model expects "
            f"{handle.n_features}"
        )
        raise invalid("inputs", msg, "feature_count")
    return np.ascontiguousarray(matrix, dtype=np.float64)


def check_range(
    rows: npt.NDArray[np.float64],
    dtype: npt.DTypeLike,
    column_dtypes: tuple[np.dtype[Any], ...] | None = None,
    field: str = "instances",
    feature_names: tuple[str, ...] | None = None,
) -> None:
    """Refuse values the model's input types cannot hold: 1e39 into a float32 graph would
    become infinity inside the model, 2.5 into an int64 input would be truncated.

    :param dtype: the element type of every column, unless ``column_dtypes`` gives one per
        column (a multi-input ONNX graph).
    :param field: where the rows came from, for the error's location: ``instances[i][j]``
        for ``/predict``, else ``<field>: instance i, feature j ('name')``.
    :raises InvalidInput: (422) naming the first such value's instance and feature.
    """
    kinds = column_dtypes if column_dtypes is not None else (np.dtype(dtype),)
    for kind in dict.fromkeys(kinds):
        columns = rows if column_dtypes is None else rows[:, [k == kind for k in kinds]]
        if kind.kind == "f" and kind.itemsize < 8:
            limit = float(np.finfo(cast(Any, kind)).max)
            bad, why = np.abs(columns) > limit, f"outside the model's {kind.name} range"
            why += f" (|x| <= {limit:.4g})"
        elif kind.kind in "iu":
            info = np.iinfo(cast(Any, kind))
            bad = (columns != np.round(columns)) | (columns < info.min) | (columns > info.max)
            why = f"not an integer the model's {kind.name} input can hold"
        else:
            continue
        if bad.any():
            i, j = (int(k) for k in np.argwhere(bad)[0])
            if column_dtypes is not None:
                j = [c for c, k in enumerate(kinds) if k == kind][j]
            if field == "instances":
                loc = f"instances[{i}][{j}]"
            else:
                name = f" ({feature_names[j]!r})" if feature_names else ""
                loc = f"{field}: instance {i}, feature {j}{name}"
            msg = f"{rows[i, j]:g} is {why}"
            raise InvalidInput(f"{loc}: {msg}", [{"loc": loc, "msg": msg, "type": "out_of_range"}])
