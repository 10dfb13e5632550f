"""MLflow scoring bodies <-> the data plane: ``dataframe_split``, ``dataframe_records``,
``instances``, ``inputs`` and ``text/csv`` -> ``serving.inputs.instances``, without the model.

Named columns stay named (``Frame`` with ``columns``, ``Records``, ``Columns``):
``serving.inputs.conform`` reorders them to the model's feature names, or takes them
positionally when the model knows none. pandas' default integer column labels are
positions: the codec puts the values in position order and sends unnamed rows.

CSV is read with the standard ``csv`` module, as pandas' ``read_csv`` reads it by default
(first row = column names, blank lines skipped, an unnamed first column is the index);
each cell is read by its feature's kind (numbers, strings, pandas' missing markers).
"""

from __future__ import annotations

import csv
import io
import itertools

from serving.errors import InvalidInput, PayloadTooLarge
from serving.inputs.instances import Columns, Frame, Instances, Records
from serving.protocols.mlflow.schemas import DataframeSplit, MlflowRequest

__all__ = ["decode", "decode_csv", "parse_csv"]


def decode_csv(body: bytes, max_rows: int | None = None) -> Frame:
    """A ``text/csv`` body as rows named by its header.

    :raises InvalidInput: (422) as ``parse_csv``.
    :raises PayloadTooLarge: (413) as ``parse_csv``.
    """
    columns, rows = parse_csv(body, max_rows)
    return Frame(rows, columns, field="csv", columns_field="csv.header", text=True)


def decode(body: MlflowRequest) -> Instances:
    """The instances of whichever data field ``body`` has (the schema allows exactly one).

    :raises InvalidInput: (422) for index labels that do not match the rows, integer
        column labels that are not the positions, rows whose length is not the column
        count, empty ``inputs``, or ``inputs`` columns of different lengths.
    """
    if body.dataframe_split is not None:
        return _split(body.dataframe_split)
    if body.dataframe_records is not None:
        return Records(body.dataframe_records, "dataframe_records", "key_order")
    if body.instances is not None:
        if isinstance(body.instances[0], dict):
            return Records(body.instances, "instances", "key_order")
        return Frame(body.instances, field="instances")
    inputs = body.inputs
    assert inputs is not None
    if not isinstance(inputs, dict):
        if not inputs:
            raise InvalidInput.at("inputs", "no instances", "too_short")
        return Frame(inputs, field="inputs")
    if not inputs:
        raise InvalidInput.at("inputs", "no columns", "too_short")
    columns = list(inputs)
    n = len(inputs[columns[0]])
    for name in columns:
        if len(inputs[name]) != n:
            msg = f"has {len(inputs[name])} values; every column needs one per instance ({n})"
            raise InvalidInput.at(f"inputs.{name}", msg, "instance_count")
    if n == 0:
        raise InvalidInput.at("inputs", "no instances", "too_short")
    return Columns(inputs, n, "inputs")


def _split(split: DataframeSplit) -> Frame:
    """pandas' ``orient="split"``; integer column labels (a ``RangeIndex``) are positions."""
    field, columns_field = "dataframe_split.data", "dataframe_split.columns"
    if split.index is not None and len(split.index) != len(split.data):
        msg = f"has {len(split.index)} labels for {len(split.data)} rows"
        raise InvalidInput.at("dataframe_split.index", msg, "index_length")
    columns = split.columns
    if not columns or not isinstance(columns[0], int):
        names = None if columns is None else [str(column) for column in columns]
        return Frame(split.data, names, field, columns_field)
    for index, row in enumerate(split.data):
        if len(row) != len(columns):
            msg = f"has {len(row)} values for {len(columns)} columns"
            raise InvalidInput.at(f"{field}[{index}]", msg, "row_length")
    if sorted(columns) != list(range(len(columns))):
        msg = f"integer column labels must be the positions 0..{len(columns) - 1}"
        raise InvalidInput.at(columns_field, msg, "column_positions")
    order = [list(columns).index(k) for k in range(len(columns))]
    return Frame([[row[j] for j in order] for row in split.data], None, field, columns_field)


def parse_csv(body: bytes, max_rows: int | None = None) -> tuple[list[str], list[list[str]]]:
    """``text/csv`` bytes (UTF-8, optional BOM) -> column names and rows of text cells,
    read as pandas' ``read_csv`` reads them by default (first row = column names, blank
    lines skipped). A first column with an empty name is pandas' default index (what
    ``DataFrame.to_csv()`` writes) and is dropped. Cells are typed later, by each
    feature's kind (``serving.inputs.cells.from_text``).

    :param max_rows: ``SERVING_MAX_INSTANCES_PER_REQUEST``: reading stops at the row past
        it, so a body of many tiny rows costs no more than the limit's worth of rows.
    :raises InvalidInput: (422) when the body is not UTF-8, has no header or no data row,
        or a row's length is not the header's (naming the line).
    :raises PayloadTooLarge: (413) when it has more than ``max_rows`` data rows.
    """
    try:
        text = body.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidInput.at(
            "body", f"text/csv body is not UTF-8 ({exc.reason})", "encoding"
        ) from None
    reader = csv.reader(io.StringIO(text, newline=""))
    most = None if max_rows is None else max_rows + 2  # the header, and one row too many
    try:
        lines = list(itertools.islice(((reader.line_num, row) for row in reader if row), most))
    except csv.Error as exc:
        raise InvalidInput.at("body", f"not readable as CSV: {exc}", "csv") from None
    if max_rows is not None and len(lines) > max_rows + 1:
        raise PayloadTooLarge(
            "request", None, max_rows, "SERVING_MAX_INSTANCES_PER_REQUEST", "instances"
        )
    if not lines:
        raise InvalidInput.at("body", "text/csv body is empty: expected a header row", "csv")
    header = lines[0][1]
    if len(lines) == 1:
        raise InvalidInput.at(
            "body", "text/csv body has a header row and no data rows", "too_short"
        )
    rows: list[list[str]] = []
    for line, row in lines[1:]:
        if len(row) != len(header):
            msg = f"line {line} has {len(row)} values for {len(header)} columns"
            raise InvalidInput.at(f"csv[{len(rows)}]", msg, "row_length")
        rows.append(row)
    if header[0] == "" and len(header) > 1:  # pandas' unnamed index column
        return header[1:], [row[1:] for row in rows]
    return header, rows
