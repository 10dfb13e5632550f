"""TF Serving request tensors -> the ``(n_instances, n_features)`` float64 rows every
protocol hands the batcher, and model outputs -> TF Serving's response values.

Row format (``instances``) and columnar format (``inputs``) as TF Serving's REST API
defines them. Objects are keyed either by feature name (``handle.feature_names``, one
number each) or by input name (``handle.input_specs()``: a number for a one-column input,
else a list of its ``width`` values); the scheme is picked from the first key, and the
columns are laid out in the model's order, as ``to_matrix`` does for ``/predict``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from serving.api.frames import check_names, invalid
from serving.api.inference import check_instance_count, to_matrix
from serving.handle import ModelHandle, Outputs

__all__ = ["columnar_matrix", "columnar_outputs", "row_matrix", "row_predictions"]

NamedValue = float | list[float]


def _by_input_name(handle: ModelHandle, keys: Sequence[str]) -> bool:
    """True when objects are keyed by input name rather than by feature name."""
    features = handle.feature_names or ()
    inputs = [spec.name for spec in handle.input_specs()]
    first = next(iter(keys), None)
    if first is not None and first in features:
        return False
    return first in inputs or not features


def _input_row(instance: Mapping[str, NamedValue], handle: ModelHandle, loc: str) -> list[float]:
    specs = handle.input_specs()
    check_names(list(instance), [spec.name for spec in specs], loc, "input")
    row: list[float] = []
    for spec in specs:
        value = instance[spec.name]
        values = value if isinstance(value, list) else [value]
        if spec.width >= 0 and len(values) != spec.width:
            msg = f"input {spec.name!r} takes {spec.width} values, got {len(values)}"
            raise invalid(f"{loc}.{spec.name}", msg, "input_width")
        row.extend(values)
    return row


def _scalar(value: NamedValue, loc: str) -> float:
    if isinstance(value, list):
        if len(value) != 1:
            raise invalid(loc, f"a feature takes one value, got {len(value)}", "feature_width")
        return value[0]
    return value


def _object_rows(
    objects: Sequence[Mapping[str, NamedValue]], handle: ModelHandle, field: str
) -> npt.NDArray[np.float64]:
    if _by_input_name(handle, list(objects[0])):
        rows = [_input_row(obj, handle, f"{field}[{i}]") for i, obj in enumerate(objects)]
        return to_matrix(rows, handle, field)
    named = [
        {key: _scalar(value, f"{field}[{i}].{key}") for key, value in obj.items()}
        for i, obj in enumerate(objects)
    ]
    return to_matrix(named, handle, field)


def row_matrix(
    instances: list[list[float]] | list[float] | list[dict[str, NamedValue]],
    handle: ModelHandle,
    field: str = "instances",
) -> npt.NDArray[np.float64]:
    """Row format: lists of values in the model's order, numbers (one-feature models), or
    objects keyed by feature or input name.

    :raises InvalidInput: (422) naming the instance and the wrong length, or the missing
        or unknown name.
    """
    first = instances[0]
    if isinstance(first, dict):
        return _object_rows(instances, handle, field)  # type: ignore[arg-type]
    if isinstance(first, list):
        return to_matrix(instances, handle, field)  # type: ignore[arg-type]
    return to_matrix([[value] for value in instances], handle, field)  # type: ignore[list-item]


def columnar_matrix(
    inputs: list[list[float]] | list[float] | dict[str, list[NamedValue]],
    handle: ModelHandle,
) -> npt.NDArray[np.float64]:
    """Columnar format: the one input tensor ``(n_instances, n_features)`` (or
    ``(n_instances,)`` for one feature), or an object mapping each feature or input name
    to its values, one per instance.

    :raises InvalidInput: (422) when the named values differ in length, or as ``row_matrix``.
    :raises PayloadTooLarge: (413) over ``SERVING_MAX_INSTANCES_PER_REQUEST``.
    """
    if not isinstance(inputs, dict):
        if not inputs:
            raise invalid("inputs", "no instances", "too_short")
        check_instance_count(len(inputs))
        return row_matrix(inputs, handle, "inputs")
    if not inputs:
        raise invalid("inputs", "no named inputs", "too_short")
    counts = {name: len(values) for name, values in inputs.items()}
    n = next(iter(counts.values()))
    for name, count in counts.items():
        if count != n:
            msg = f"has {count} values; every named input needs one per instance ({n})"
            raise invalid(f"inputs.{name}", msg, "instance_count")
    if n == 0:
        raise invalid("inputs", "no instances", "too_short")
    check_instance_count(n)
    keys = list(inputs)
    if _by_input_name(handle, keys):
        check_names(keys, [spec.name for spec in handle.input_specs()], "inputs", "input")
    elif handle.feature_names is not None:
        check_names(keys, handle.feature_names, "inputs", "feature")
    objects = [{name: values[i] for name, values in inputs.items()} for i in range(n)]
    return _object_rows(objects, handle, "inputs")


def row_predictions(outputs: Outputs) -> list[Any]:
    """TF Serving's row-format ``predictions``: with one output, its value per instance;
    with several, one object per instance keyed by output name."""
    if len(outputs) == 1:
        return _tolist(next(iter(outputs.values())))
    columns = {name: _tolist(value) for name, value in outputs.items()}
    return [
        dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)
    ]


def columnar_outputs(outputs: Outputs) -> list[Any] | dict[str, list[Any]]:
    """TF Serving's columnar ``outputs``: the one output's values, or an object of them."""
    if len(outputs) == 1:
        return _tolist(next(iter(outputs.values())))
    return {name: _tolist(value) for name, value in outputs.items()}


def _tolist(array: npt.NDArray[Any]) -> list[Any]:
    """Plain Python values (labels of any dtype); orjson writes NaN and Infinity as null."""
    values: list[Any] = np.asarray(array).tolist()
    return values
