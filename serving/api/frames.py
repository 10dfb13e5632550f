"""Tabular request bodies -> the ``(n_instances, n_features)`` float64 rows of the shared
request path: named columns (DataFrame ``split``/``records`` JSON, CSV with a header row)
reordered to the model's feature names, or taken positionally when the model knows none.

CSV is read with the standard ``csv`` module, as pandas' ``read_csv`` reads it by default
(first row = column names, blank lines skipped), but strictly: every cell must be a
finite decimal number.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from serving.api.inference import to_matrix
from serving.errors import InvalidInput
from serving.handle import ModelHandle

__all__ = ["check_names", "frame_matrix", "invalid", "parse_csv", "records_matrix"]

_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


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


def frame_matrix(
    columns: Sequence[str] | Sequence[int] | None,
    data: Sequence[Sequence[float]],
    handle: ModelHandle,
    field: str,
    columns_field: str,
) -> npt.NDArray[np.float64]:
    """``data`` rows whose values are named by ``columns``, in the model's feature order.

    :param field: where the rows are in the request (``dataframe_split.data``), and
        ``columns_field`` where their names are, for error locations.
    :raises InvalidInput: (422) for a row whose length is not the column count, a missing,
        unknown or repeated column name, or (as ``to_matrix``) a wrong feature count.
    """
    if columns is not None:
        for index, row in enumerate(data):
            if len(row) != len(columns):
                msg = f"has {len(row)} values for {len(columns)} columns"
                raise invalid(f"{field}[{index}]", msg, "row_length")
        if columns and isinstance(columns[0], int):  # pandas' RangeIndex labels: positions
            if sorted(columns) != list(range(len(columns))):
                msg = f"integer column labels must be the positions 0..{len(columns) - 1}"
                raise invalid(columns_field, msg, "column_positions")
            order = [list(columns).index(k) for k in range(len(columns))]
            return to_matrix([[row[j] for j in order] for row in data], handle, field)
        if handle.feature_names is not None:
            names = [str(column) for column in columns]
            check_names(names, handle.feature_names, columns_field, "feature")
            order = [names.index(name) for name in handle.feature_names]
            data = [[row[j] for j in order] for row in data]
    return to_matrix(data, handle, field)


def records_matrix(
    records: Sequence[Mapping[str, float]], handle: ModelHandle, field: str
) -> npt.NDArray[np.float64]:
    """Objects keyed by column name, in the model's feature order; for a model without
    feature names, in the first record's key order (every record must have its keys).

    :raises InvalidInput: (422) naming the record and the missing or unknown name.
    """
    if handle.feature_names is not None:
        return to_matrix(records, handle, field)
    names = list(records[0])
    for index, record in enumerate(records):
        if record.keys() != set(names):
            check_names(list(record), names, f"{field}[{index}]", "column")
    return to_matrix([[record[name] for name in names] for record in records], handle, field)


def parse_csv(body: bytes) -> tuple[list[str], list[list[float]]]:
    """``text/csv`` bytes (UTF-8, optional BOM) -> column names and rows of numbers.

    :raises InvalidInput: (422) when the body is not UTF-8, has no header or no data row,
        or a cell is not a finite number (naming the line and column).
    """
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise invalid("body", f"text/csv body is not UTF-8 ({exc.reason})", "encoding") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        lines = [(reader.line_num, row) for row in reader if row]
    except csv.Error as exc:
        raise invalid("body", f"not readable as CSV: {exc}", "csv") from None
    if not lines:
        raise invalid("body", "text/csv body is empty: expected a header row", "csv")
    header = lines[0][1]
    if len(lines) == 1:
        raise invalid("body", "text/csv body has a header row and no data rows", "too_short")
    rows: list[list[float]] = []
    for line, row in lines[1:]:
        if len(row) != len(header):
            msg = f"line {line} has {len(row)} values for {len(header)} columns"
            raise invalid(f"csv[{len(rows)}]", msg, "row_length")
        values = []
        for column, cell in zip(header, row, strict=True):
            value = cell.strip()
            number = float(value) if _NUMBER.fullmatch(value) else math.nan
            if not math.isfinite(number):
                msg = f"line {line}, column {column!r}: {cell[:40]!r} is not a finite number"
                raise invalid(f"csv[{len(rows)}].{column}", msg, "float_parsing")
            values.append(number)
        rows.append(values)
    return header, rows
