"""TF Serving bodies <-> the data plane: row format (``instances``), columnar format
(``inputs``) and examples (``:classify``, ``:regress``) -> ``serving.inputs.instances``,
model outputs -> TF Serving's response values.

Formats as TF Serving's REST API defines them. Rows are lists of values in the model's
order (``Frame``), numbers for one-feature models (``Frame`` of one-wide rows), or
objects (``Records``); columnar is the one input tensor (``Frame``) or an object of
columns (``Columns``); examples are objects (``Records``) with the ``context`` added to
each. Objects are keyed by feature name or by input name (a list of the input's
``width`` values); ``serving.inputs.conform`` tells which from the model.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from serving.errors import InvalidInput
from serving.inputs.instances import Columns, Frame, Instances, Records
from serving.model.handle import Outputs
from serving.protocols.tfserving.schemas import TFExamplesRequest, TFPredictRequest

__all__ = [
    "classify_result",
    "columnar_outputs",
    "decode",
    "decode_examples",
    "regress_result",
    "row_predictions",
]


def _rows(values: list[Any], field: str) -> Instances:
    """Row-major values: lists (a row each), objects, or numbers (one-feature rows)."""
    first = values[0]
    if isinstance(first, dict):
        return Records(values, field)
    if isinstance(first, list):
        return Frame(values, field=field)
    return Frame([[value] for value in values], field=field)


def decode(body: TFPredictRequest) -> Instances:
    """The instances of a validated body (its schema requires exactly one format).

    :raises InvalidInput: (422) for columnar ``inputs`` with no instances, or named
        columns of different lengths (naming the column).
    """
    if body.instances is not None:
        return _rows(body.instances, "instances")
    inputs = body.inputs
    assert inputs is not None  # the schema requires one of the two
    if not isinstance(inputs, dict):
        if not inputs:
            raise InvalidInput.at("inputs", "no instances", "too_short")
        return _rows(inputs, "inputs")
    if not inputs:
        raise InvalidInput.at("inputs", "no named inputs", "too_short")
    counts = {name: len(values) for name, values in inputs.items()}
    n = next(iter(counts.values()))
    for name, count in counts.items():
        if count != n:
            msg = f"has {count} values; every named input needs one per instance ({n})"
            raise InvalidInput.at(f"inputs.{name}", msg, "instance_count")
    if n == 0:
        raise InvalidInput.at("inputs", "no instances", "too_short")
    return Columns(inputs, n)


def decode_examples(body: TFExamplesRequest) -> Records:
    """The examples of a validated ``:classify``/``:regress`` body, each with the
    ``context`` features added.

    :raises InvalidInput: (422) for a feature named in both an example and the context.
    """
    context = body.context
    if not context:
        return Records(body.examples, "examples")
    rows = []
    for i, example in enumerate(body.examples):
        for name in example.keys() & context.keys():
            msg = "is also in context; a feature is in the context or in each example"
            raise InvalidInput.at(f"examples[{i}].{name}", msg, "duplicate_feature")
        rows.append(context | example)
    return Records(rows, "examples")


def classify_result(outputs: Outputs, classes: tuple[Any, ...] | None) -> list[Any]:
    """TF Serving's ``:classify`` ``result``: per example, ``[label, score]`` for each class
    (labels as strings, in the model's class order), from ``probabilities``.

    :raises InvalidInput: (422) for a model without class probabilities.
    """
    probabilities = outputs.get("probabilities")
    if probabilities is None or not classes:
        msg = (
            "the model gives no class probabilities: :classify needs a classifier with "
            "predict_proba (use :predict)"
        )
        raise InvalidInput.at(":classify", msg, "method")
    labels = [str(label) for label in classes]
    return [list(zip(labels, row, strict=True)) for row in _tolist(probabilities)]


def regress_result(outputs: Outputs, classes: tuple[Any, ...] | None) -> list[Any]:
    """TF Serving's ``:regress`` ``result``: the one predicted number per example.

    :raises InvalidInput: (422) for a classifier, or predictions that are not one number
        per example.
    """
    predictions = np.asarray(outputs["predictions"])
    if predictions.ndim == 2 and predictions.shape[1] == 1:
        predictions = predictions[:, 0]
    if classes or predictions.ndim != 1 or predictions.dtype.kind not in "fiub":
        what = "a classifier's labels" if classes else "not one number per example"
        msg = f"the model's predictions are {what}: :regress needs a regression model"
        raise InvalidInput.at(":regress", msg, "method")
    if predictions.dtype.kind != "f":
        predictions = predictions.astype(np.float64)
    return _tolist(predictions)


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
    """One entry per instance, as plain Python values, except narrow floats: a float32
    stays a numpy value, which orjson writes in its shortest float32 form, as ``/predict``
    does (``0.65431726``, not float64's ``0.6543172597885132``). NaN becomes null."""
    array = np.asarray(array)
    if array.dtype.kind == "f" and array.dtype.itemsize < 8:
        return list(np.ascontiguousarray(array))
    values: list[Any] = array.tolist()
    return values
