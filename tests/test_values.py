"""Typed columns from request values (``serving.inputs.values``), on their own."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from serving.errors import InvalidInput
from serving.inputs.values import column
from serving.model.schema import feature


class NoLists(np.ndarray):  # type: ignore[type-arg]
    """An array that refuses to become a list: a column built without a Python pass."""

    def tolist(self) -> Any:
        raise AssertionError("tolist() on the fast path")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_values_a_typed_float_column_is_checked_without_a_list(dtype: type) -> None:
    values = np.array([1.5, -2.0, 3.25], dtype=dtype).view(NoLists)
    f = feature("x", "float", np.float32)

    out = column(values, f, lambda i: f"inputs[0].data[{i}]")

    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [1.5, -2.0, 3.25])


def test_values_a_typed_column_still_names_its_first_refused_value() -> None:
    values = np.array([1.0, np.nan, np.inf])
    f = feature("x", "float", np.float32)

    with pytest.raises(InvalidInput) as caught:
        column(values, f, lambda i: f"inputs[0].data[{i}]")

    assert caught.value.details[0]["loc"] == "inputs[0].data[1]"
    assert caught.value.details[0]["type"] == "missing_value"
