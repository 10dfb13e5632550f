"""CSV cells -> the values they stand for, by each feature's kind, as pandas' ``read_csv``
reads them by default: pandas' missing markers, numbers, booleans; text stays text.

Numbers are ASCII digits only: ``int()`` and ``float()`` also read Arabic-Indic or
full-width digits, which a CSV client means as text. A number no type can hold (an
integer of more digits than any type's range, one past float64's) is refused naming its
cell; ``int()`` would raise a ValueError past 4,300 digits (a 500).

Boundary: standard library and ``serving`` core modules (``serving.inputs.values``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from serving.errors import InvalidInput
from serving.inputs.values import Locate, show
from serving.model.schema import Feature

__all__ = ["from_text", "text_rows"]

#: CSV cells read as missing: pandas' ``read_csv`` default ``na_values``.
_MISSING_TEXT = frozenset(
    [
        "",
        "#N/A",
        "#N/A N/A",
        "#NA",
        "-1.#IND",
        "-1.#QNAN",
        "-NaN",
        "-nan",
        "1.#IND",
        "1.#QNAN",
        "<NA>",
        "N/A",
        "NA",
        "NULL",
        "NaN",
        "None",
        "n/a",
        "nan",
        "null",
    ]
)
# ASCII digits: ``\d`` (and int()) also match Arabic-Indic U+0661 U+0662 or full-width
# U+FF11 U+FF12 as 12.
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")
_NUMBER_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
#: Digits past any integer type's range (uint64 has 20), and far below int()'s limit (4,300).
_MAX_INTEGER_TEXT = 40
_BOOL_TEXT = {"True": True, "TRUE": True, "true": True, "False": False, "FALSE": False,
              "false": False}  # fmt: skip


def from_text(cell: str, f: Feature) -> Any:
    """A CSV cell as the value it stands for in feature ``f``, as pandas' ``read_csv``
    reads it: a missing marker (empty, ``NaN``, ``NA``, ...) is None; numbers and booleans
    are parsed (ASCII digits only); strings stay as they are. A cell that is not of the
    feature's kind stays text, so that checking it names the value.

    :raises ValueError: with the reason, for a number no type holds: an integer of more
        than 40 digits, a number past float64's range.
    """
    if cell in _MISSING_TEXT and f.kind != "any":
        return None
    text = cell.strip()
    if f.kind == "integer" and _INTEGER_TEXT.fullmatch(text):
        if len(text) > _MAX_INTEGER_TEXT:
            name = f.dtype.name if f.dtype.kind in "iu" else "int64"
            raise ValueError(f"{show(cell)} is not an integer the model's {name} input can hold")
        return int(text)
    if f.kind in ("float", "integer") and _NUMBER_TEXT.fullmatch(text):
        number = float(text)
        if math.isinf(number):
            raise ValueError(f"{show(cell)} is outside the float64 range")
        return number
    if (f.kind == "boolean" or f.booleans) and text in _BOOL_TEXT:
        return _BOOL_TEXT[text]
    return cell


def text_rows(
    rows: Sequence[Sequence[str]], features: Sequence[Feature], loc: Locate
) -> list[list[Any]]:
    """CSV rows of text cells (one per feature) as the values they stand for (``from_text``).

    :raises InvalidInput: (422) naming the first cell holding a number no type can (a
        5,000-digit integer raised ``int()``'s ValueError: a 500).
    """
    try:
        return [[from_text(v, f) for v, f in zip(row, features, strict=True)] for row in rows]
    except ValueError:
        pass
    for i, row in enumerate(rows):
        for j, (cell, f) in enumerate(zip(row, features, strict=True)):
            try:
                from_text(cell, f)
            except ValueError as exc:
                raise InvalidInput.at(loc(i, j), str(exc), "out_of_range") from None
    raise AssertionError("unreachable: a cell refused once is refused again")
