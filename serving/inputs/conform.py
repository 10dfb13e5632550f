"""Decoded instances (``serving.inputs.instances``) -> the batch one model's batcher merges.

``conform(instances, handle)`` checks a request's instances against the model's input
schema (``handle.features``: names, kinds, missing values, categories) and builds its
batch: a ``(n_instances, n_features)`` array of ``uniform_dtype(features)`` when every
feature has one kind (the features' own element type when they share one: float32 for a
float32 graph, float64 for scikit-learn; else float64 for floats, int64 for integers:
exact, never through float64), else a record array with one typed field per feature
(strings as ``str`` objects). The batcher concatenates the batches of several requests
into one predict call; every protocol gives one model the same dtype, so they merge.

KServe V2 tensors arrive typed (``serving.protocols.v2.codec``): one holding every
feature is checked whole with numpy (``serving.inputs.values.typed_matrix``) and is the batch
itself when it has the batch's dtype (a binary tensor: a view of the request body, no
copy, no Python per value); one of another dtype is cast once.

Every refusal is ``InvalidInput`` (422) naming the instance and the feature in the
protocol's own terms: ``instances[0][3]`` for a list, ``instances[0].plan`` for an
object, ``inputs.plan[2]`` for a column, ``inputs[1].data[0][2]`` for a tensor. Only the
first refused value is reported: a body of many bad values costs one pass.

Boundary: standard library, numpy and ``serving`` core modules (no Flask, no pydantic).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from operator import itemgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from serving.errors import InvalidInput
from serving.inputs.cells import text_rows
from serving.inputs.instances import Columns, Frame, Instances, Records, Tensors, Unnamed
from serving.inputs.rules import STRICT, Rules, check_names, numbers_from_strings
from serving.inputs.values import Locate, column, matrix, typed_matrix
from serving.model.handle import ModelHandle, TensorSpec
from serving.model.schema import Feature, feature, structured_dtype, uniform_dtype

__all__ = ["conform", "no_such_input"]


def conform(instances: Instances, handle: ModelHandle, rules: Rules = STRICT) -> npt.NDArray[Any]:
    """``instances`` as the batch of ``handle``'s model, checked against its schema, with
    ``rules`` for names it does not have and numbers sent as strings (``serving.inputs.rules``).

    :returns: ``(n_instances, n_features)`` of ``handle.matrix_dtype``, or a record array
        ``(n_instances,)`` of ``handle.batch_dtype``.
    :raises InvalidInput: (422) naming the first instance and feature that is wrong: a
        wrong feature count, a missing, unknown or repeated name, a value of the wrong
        kind, a missing value the feature may not have, an unknown category, a number
        the model's input type cannot hold.
    """
    if isinstance(instances, Tensors):
        return _tensors(instances, handle, rules)
    if isinstance(instances, Columns):
        return _columns(instances, handle, rules)
    rows: Sequence[Sequence[Any]]
    if isinstance(instances, Records):
        rows, loc = _records(instances.rows, handle, instances.field, instances.unnamed, rules)
        if handle.features is not None and len(rows[0]) != len(handle.features):
            # keys in key order for a model without feature names: as many as it has?
            _check_lengths(rows[:1], len(handle.features), instances.field, known=True)
    else:
        rows, loc = _frame(instances, handle, rules)
    features = handle.features or _floats(len(rows[0]))
    if not features:
        raise InvalidInput.at(f"{instances.field}[0]", "the instance has no values", "too_short")
    if isinstance(instances, Frame):
        known = handle.features is not None
        _check_lengths(rows, len(features), instances.field, known, handle.feature_names)
        if instances.text:
            rows = text_rows(rows, features, loc)
    if rules.numbers_from_strings:
        rows = numbers_from_strings(rows, features, loc)
    dtype = uniform_dtype(features)
    if dtype is not None:
        return matrix(rows, features, dtype, loc)
    return _table(_transposed(rows, len(features)), features, loc)


@functools.lru_cache(maxsize=32)
def _floats(n: int) -> tuple[Feature, ...]:
    """The schema of a model that does not tell its width: ``n`` float features (made once
    per width, not per request: 30 dataclasses cost ~40 us)."""
    return tuple(feature(str(j), "float", np.float64) for j in range(n))


def _check_lengths(
    rows: Sequence[Any], n: int, field: str, known: bool, names: Sequence[str] | None = None
) -> None:
    """Each row a list of ``n`` values (the model's, when ``known``; its columns
    ``names``, in order, said when a row has another length), else 422."""
    for index, row in enumerate(rows):
        if type(row) is not list and (
            isinstance(row, Mapping | str) or not isinstance(row, Sequence)
        ):
            what = "mixes lists and objects" if isinstance(row, Mapping) else "is not a list"
            raise InvalidInput.at(f"{field}[{index}]", what, "instance_kind")
        if len(row) != n:
            source = "the model expects" if known else "instances[0] has"
            listed = ", ".join(names[:12]) + (", ..." if len(names) > 12 else "") if names else ""
            raise InvalidInput(
                f"{field}[{index}] has {len(row)} features; {source} {n}"
                + (f": {listed}" if listed else ""),
                [{"loc": f"{field}[{index}]", "msg": f"expected {n} features, got {len(row)}",
                  "type": "feature_count"}],
            )  # fmt: skip


def _transposed(rows: Sequence[Sequence[Any]], n: int) -> Iterator[list[Any]]:
    """Each column of ``rows``, built when asked for: a batch refused in its first column
    never holds a copy of the others."""
    for j in range(n):
        yield [row[j] for row in rows]


def _table(
    columns: Iterable[Sequence[Any]], features: Sequence[Feature], loc: Locate
) -> npt.NDArray[Any]:
    """Per-feature values (model order) as the batch: a matrix when one type holds them
    all, else a record array."""
    arrays = [
        column(values, f, lambda i, j=j: loc(i, j))  # type: ignore[misc]
        for j, (values, f) in enumerate(zip(columns, features, strict=True))
    ]
    dtype = uniform_dtype(features)
    if dtype is not None:
        return np.stack(arrays, axis=1).astype(dtype, copy=False)
    out = np.empty(len(arrays[0]), dtype=structured_dtype(features))
    for f, values in zip(features, arrays, strict=True):
        out[f.name] = values
    return out


def _frame(
    frame: Frame, handle: ModelHandle, rules: Rules
) -> tuple[Sequence[Sequence[Any]], Locate]:
    rows, columns, field = frame.rows, frame.columns, frame.field
    if columns is None and handle.feature_names is not None:  # each value's feature named
        named = handle.feature_names
        return rows, lambda i, j: f"{field}[{i}][{j}] (feature {named[j]!r})"
    if columns is None:
        return rows, lambda i, j: f"{field}[{i}][{j}]"
    for index, row in enumerate(rows):
        if len(row) != len(columns):
            msg = f"has {len(row)} values for {len(columns)} columns"
            raise InvalidInput.at(f"{field}[{index}]", msg, "row_length")
    names = [str(c) for c in columns]
    if handle.feature_names is None:
        return rows, lambda i, j: f"{field}[{i}].{names[j]}"
    check_names(names, handle.feature_names, frame.columns_field, "feature", rules)
    order = [names.index(name) for name in handle.feature_names]
    if order != list(range(len(names))):  # reordered, or with columns the rules ignore
        rows = [[row[j] for j in order] for row in rows]
    model_names = handle.feature_names
    return rows, lambda i, j: f"{field}[{i}].{model_names[j]}"


def _by_input_name(handle: ModelHandle, keys: Sequence[str]) -> bool:
    """True when objects are keyed by input name (``input-0`` with a list of the row's
    values, or each input of a multi-input graph) rather than by feature name."""
    features = set(handle.feature_names or ())
    inputs = {spec.name for spec in handle.input_specs()}
    return any(key in inputs and key not in features for key in keys)


def _records(
    records: Sequence[Mapping[str, Any]],
    handle: ModelHandle,
    field: str,
    unnamed: Unnamed = "key_order",
    rules: Rules = STRICT,
) -> tuple[list[Any], Locate]:
    """Objects keyed by feature name (or input name) as rows in the model's feature order;
    for a model without feature names, in the first record's key order, or refused."""
    for index, record in enumerate(records):
        if type(record) is not dict and not isinstance(record, Mapping):
            raise InvalidInput.at(f"{field}[{index}]", "mixes lists and objects", "instance_kind")
    if _by_input_name(handle, list(records[0])):
        specs = handle.input_specs()
        rows = [_input_row(record, specs, f"{field}[{i}]") for i, record in enumerate(records)]
        flat = handle.feature_names or tuple(str(j) for j in range(len(rows[0])))
        return rows, lambda i, j: f"{field}[{i}].{flat[j]}"
    names = handle.feature_names
    if names is None:
        if unnamed == "refuse":
            raise InvalidInput.at(
                f"{field}[0]", "the model does not know its feature names; send each "
                "instance as a list of values in training order", "feature_names",
            )  # fmt: skip
        names = tuple(records[0])
        if not names:
            raise InvalidInput.at(f"{field}[0]", "the instance has no values", "too_short")
        for index, record in enumerate(records):
            if record.keys() != set(names):
                check_names(list(record), names, f"{field}[{index}]", "column")
    known, n = set(names), len(names)
    get = itemgetter(*names) if n > 1 else (lambda record: (record[names[0]],))
    values: list[Any] = []
    for index, record in enumerate(records):
        if len(record) != n or not known.issuperset(record):
            check_names(list(record), names, f"{field}[{index}]", "feature", rules)
        values.append(get(record))
    if any(type(value) is list for row in values for value in row):
        values = [[_scalar(v, field, i, names[j]) for j, v in enumerate(row)]
                  for i, row in enumerate(values)]  # fmt: skip
    final = names
    return values, lambda i, j: f"{field}[{i}].{final[j]}"


def _scalar(value: Any, field: str, index: int, name: str) -> Any:
    if isinstance(value, list):  # TF Serving allows [value] for a one-value feature
        if len(value) != 1:
            msg = f"a feature takes one value, got {len(value)}"
            raise InvalidInput.at(f"{field}[{index}].{name}", msg, "feature_width")
        return value[0]
    return value


def _input_row(instance: Mapping[str, Any], specs: tuple[TensorSpec, ...], loc: str) -> list[Any]:
    check_names(list(instance), [spec.name for spec in specs], loc, "input")
    row: list[Any] = []
    for spec in specs:
        value = instance[spec.name]
        values = value if isinstance(value, list) else [value]
        if spec.width >= 0 and len(values) != spec.width:
            msg = f"input {spec.name!r} takes {spec.width} values, got {len(values)}"
            raise InvalidInput.at(f"{loc}.{spec.name}", msg, "input_width")
        row.extend(values)
    return row


def _columns(columns: Columns, handle: ModelHandle, rules: Rules) -> npt.NDArray[Any]:
    """Named columns (feature or input names) in the model's order."""
    field, data = columns.field, columns.data
    keys = list(data)
    if _by_input_name(handle, keys):
        kept = check_names(
            keys, [spec.name for spec in handle.input_specs()], field, "input", rules
        )
        records = [{name: data[name][i] for name in kept} for i in range(columns.n)]
        by_input, at = _records(records, handle, field, rules=rules)
        features = handle.features or _floats(len(by_input[0]))
        return _table(_transposed(by_input, len(features)), features, at)
    names = handle.feature_names
    if names is None:
        names = tuple(keys)
    else:
        check_names(keys, names, field, "feature", rules)
    features = handle.features or _floats(len(names))
    if len(features) != len(names):
        msg = f"has {len(names)} columns; the model expects {len(features)}"
        raise InvalidInput.at(field, msg, "feature_count")
    order = names

    def loc(i: int, j: int) -> str:
        return f"{field}.{order[j]}[{i}]"

    values: Sequence[Sequence[Any]] = [[_unwrap(v) for v in data[name]] for name in names]
    if rules.numbers_from_strings:
        rows = numbers_from_strings(list(zip(*values, strict=True)), features, loc)
        values = [list(col) for col in zip(*rows, strict=True)]
    return _table(values, features, loc)


def _unwrap(value: Any) -> Any:
    """TF Serving's ``[value]`` for a one-value feature (a longer list is refused later)."""
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def _tensors(tensors: Tensors, handle: ModelHandle, rules: Rules) -> npt.NDArray[Any]:
    """Each of the model's inputs sent once under its name; their columns are the
    model's features, in input order.

    One tensor holding every feature (a model of one input, the common case) is checked
    whole (``typed_matrix``) and is the batch itself when it has the batch's dtype: a
    binary tensor is then a view of the request body. Several inputs are laid side by
    side column by column (``column``), a copy; so is a tensor refused, to name its
    value."""
    specs = handle.input_specs()
    parts = _tensor_parts(tensors, specs, _given(tensors, specs, rules))
    width = sum(1 if values.ndim == 1 else values.shape[1] for _, values in parts)
    features = handle.features or _floats(width)
    if width != len(features):
        msg = f"the inputs have {width} features in all; the model expects {len(features)}"
        raise InvalidInput.at("inputs", msg, "feature_count")
    dtype = uniform_dtype(features)
    if len(parts) == 1 and dtype is not None:
        values = parts[0][1]
        batch = typed_matrix(values if values.ndim == 2 else values[:, None], features, dtype)
        if batch is not None:
            return batch
    columns: list[Any] = []
    where: list[tuple[int, int | None]] = []  # per feature: (request input, column or None)
    for index, values in parts:
        if values.ndim == 1:
            columns.append(values)
            where.append((index, None))
        else:
            columns.extend(values[:, j] for j in range(values.shape[1]))
            where.extend((index, j) for j in range(values.shape[1]))
    return _tensor_table(columns, features, where, [name for name, _ in tensors.inputs])


def no_such_input(index: int, name: str, names: list[str]) -> InvalidInput:
    """The refusal of request input ``index`` named ``name``, which is none of the model's
    input ``names`` (``input_name``)."""
    msg = f"the model has no input {name!r} (its inputs: {', '.join(names)})"
    return InvalidInput.at(f"inputs[{index}]", msg, "input_name")


def _given(tensors: Tensors, specs: tuple[TensorSpec, ...], rules: Rules) -> dict[str, int]:
    """Each model input's index in the request; names it does not have are refused or
    ignored (``rules``)."""
    names = [spec.name for spec in specs]
    given: dict[str, int] = {}
    for index, (name, _) in enumerate(tensors.inputs):
        loc = f"inputs[{index}]"
        if name not in names:
            if rules.extra == "ignore":
                if rules.on_ignored is not None:
                    rules.on_ignored(name)
                continue
            raise no_such_input(index, name, names)
        if name in given:
            raise InvalidInput.at(loc, f"input {name!r} is given twice", "input_name")
        given[name] = index
    missing = [name for name in names if name not in given]
    if missing:
        msg = f"missing input {missing[0]!r} (the model's inputs: {', '.join(names)})"
        raise InvalidInput.at("inputs", msg, "input_name")
    return given


def _tensor_parts(
    tensors: Tensors, specs: tuple[TensorSpec, ...], given: dict[str, int]
) -> list[tuple[int, npt.NDArray[Any]]]:
    """Per model input, in the model's order: its index in the request and its values,
    whose shape is checked against the input's and the others' instance count."""
    parts: list[tuple[int, npt.NDArray[Any]]] = []
    n = None
    for spec in specs:
        index = given[spec.name]
        values = tensors.inputs[index][1]
        shape, width = list(values.shape), spec.width
        fits = (len(shape) == 2 and width in (-1, shape[1])) or (len(shape) == 1 and width == 1)
        if not fits or shape[0] == 0 or (len(shape) == 2 and shape[1] == 0):
            msg = (
                f"input {spec.name!r} has shape {shape}; the model takes {list(spec.shape)} "
                "(-1: any number of instances, at least one)"
            )
            raise InvalidInput.at(f"inputs[{index}]", msg, "shape")
        if n is not None and shape[0] != n:
            first = tensors.inputs[given[specs[0].name]][0]
            msg = f"input {spec.name!r} has {shape[0]} instances; input {first!r} has {n}"
            raise InvalidInput.at(f"inputs[{index}]", msg, "shape")
        n = shape[0]
        parts.append((index, values))
    return parts


def _tensor_table(
    columns: list[Any],
    features: Sequence[Feature],
    where: list[tuple[int, int | None]],
    names: list[str],
) -> npt.NDArray[Any]:
    """``_table`` of tensor columns; a refusal names the request's input and data index
    (``where``: per feature, the input and its column; ``names``: the inputs' names), and
    the input by name when it holds one feature (``input 'color': unknown category``)."""
    refused: list[int] = []  # the feature of the value refused, if any

    def locate(i: int, j: int) -> str:
        refused.append(j)
        index, col = where[j]
        return f"inputs[{index}].data[{i}]" + ("" if col is None else f"[{col}]")

    try:
        return _table(columns, features, locate)
    except InvalidInput as exc:
        if not refused or not exc.details or where[refused[-1]][1] is not None:
            raise
        detail = exc.details[0]
        msg = f"input {names[where[refused[-1]][0]]!r}: {detail['msg']}"
        raise InvalidInput.at(detail["loc"], msg, detail["type"]) from None
