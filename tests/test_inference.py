"""The shared request path's checks, as every protocol reports them."""

from __future__ import annotations

import numpy as np
import pytest

from serving.conform import check_range
from serving.errors import InvalidInput


@pytest.mark.parametrize(
    ("field", "names", "loc"),
    [
        ("instances", None, "instances[1][0]"),
        ("inputs", ("mean radius", "b"), "inputs: instance 1, feature 0 ('mean radius')"),
        ("csv (instance 0 is line 2)", None, "csv (instance 0 is line 2): instance 1, feature 0"),
    ],
)
def test_check_range_names_the_value_in_the_protocols_own_terms(
    field: str, names: tuple[str, ...] | None, loc: str
) -> None:
    rows = np.array([[1.0, 2.0], [1e39, 2.0]])
    with pytest.raises(InvalidInput) as caught:
        check_range(rows, np.float32, None, field, names)
    assert caught.value.details[0]["loc"] == loc
    assert str(caught.value).startswith(f"{loc}: 1e+39 is outside the model's float32 range")
