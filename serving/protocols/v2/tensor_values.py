"""One KServe V2 input tensor's values, from its JSON ``data`` or its binary chunk, as a
numpy array of its datatype (``serving.protocols.v2.codec`` says the dtype path and what
is copied): JSON values built in C and checked by the datatype (another JSON type, an
integer out of range, a number that becomes infinite), a refused tensor walked in Python
only to name its first bad value; binary data as a view; ``BYTES`` as ``str``.

Every refusal is ``InvalidInput`` naming the input and the value.
"""

from __future__ import annotations

import math
import struct
from itertools import chain
from typing import Any

import numpy as np
import numpy.typing as npt

from serving.errors import InvalidInput
from serving.inputs.values import show
from serving.protocols.v2.schemas import V2RequestInput

__all__ = ["binary_strings", "binary_values", "check_bool_bytes", "json_values"]


def _flatten(data: list[Any]) -> tuple[list[Any], set[type]]:
    """Row-major ``data`` as one flat list, and the types of its values. Evenly nested
    lists are joined in C (``chain.from_iterable``), one level at a time."""
    flat = data
    while True:
        types = set(map(type, flat))
        if list not in types:
            return flat, types
        if types != {list}:
            break
        flat = list(chain.from_iterable(flat))
    walked: list[Any] = []

    def walk(items: list[Any]) -> None:
        for value in items:
            if isinstance(value, list):
                walk(value)
            else:
                walked.append(value)

    walk(flat)
    return walked, set(map(type, walked))


def _typed(flat: list[Any], types: set[type], kind: np.dtype[Any]) -> npt.NDArray[Any] | None:
    """``flat`` as an array of ``kind`` built by numpy in C, when every value is of a type
    ``kind`` takes and fits it (floats: no value becomes infinite, an integer datatype:
    none out of range); else None, for ``_json_values`` to name the value refused."""
    if kind.kind == "O":
        return _strings(flat) if types <= {str, type(None)} else None
    if kind.kind == "b":
        return np.array(flat, dtype=kind) if types <= {bool} else None
    if kind.kind in "iu":  # with null: float64 and NaN, built by _json_values
        try:
            return np.array(flat, dtype=kind) if types <= {int} else None
        except OverflowError:
            return None
    return _floats(flat, types, kind) if types <= {int, float, type(None)} else None


def _floats(flat: list[Any], types: set[type], kind: np.dtype[Any]) -> npt.NDArray[Any] | None:
    """JSON numbers (``null``: NaN) as floats of ``kind``; None when one becomes infinite."""
    if type(None) in types:
        flat = [math.nan if value is None else value for value in flat]
    try:
        if kind.itemsize < 8:
            with np.errstate(over="ignore"):  # past FP32's range: inf, refused below
                values = np.array(flat, dtype=kind)
        else:  # float64 holds every JSON float; errstate costs about 3 us
            values = np.array(flat, dtype=kind)
    except OverflowError:  # an int past float64's range
        return None
    return None if np.isinf(values).any() else values


def _strings(flat: list[Any]) -> npt.NDArray[Any]:
    values = np.empty(len(flat), dtype=object)
    values[:] = flat
    return values


def json_values(tensor: V2RequestInput, kind: np.dtype[Any], loc: str) -> npt.NDArray[Any]:
    """``tensor.data`` as a flat array of its ``datatype`` (``BYTES`` as ``str`` objects;
    an integer datatype with ``null`` as float64 with NaN, ``BOOL`` with ``null`` as
    objects, ``None`` for null), built once by numpy from the
    JSON values; a value of another type, or one the datatype cannot hold, is refused.

    The values are looked at in Python only to name a refused one, or to build an integer
    tensor holding ``null``. Whether a value suits the model's feature (finite, missing
    allowed, within its range) is ``serving.inputs.conform``'s check, done once for every tensor.
    """
    if tensor.data is None:
        msg = f"input {tensor.name!r} has no data (send data, or parameters.binary_data_size)"
        raise InvalidInput.at(loc, msg, "missing_data")
    flat, types = _flatten(tensor.data)
    expected = math.prod(tensor.shape)
    if len(flat) != expected:
        msg = f"input {tensor.name!r} has {len(flat)} values; shape {tensor.shape} needs {expected}"
        raise InvalidInput.at(loc, msg, "data_length")
    values = _typed(flat, types, kind)
    if values is not None:
        return values
    if kind.kind == "O":
        fits = [type(value) is str or value is None for value in flat]
        want = "a string (or null): BYTES elements are JSON strings"
    elif kind.kind == "b":
        fits = [type(value) is bool or value is None for value in flat]
        want = "true or false, or null"
    elif kind.kind in "iu":
        info = np.iinfo(kind)
        # null is a missing value (an integer feature that may be missing is float64 with
        # NaN in the batch, as pandas holds it), for conform to accept or refuse
        fits = [
            value is None or (type(value) is int and info.min <= value <= info.max)
            for value in flat
        ]
        want = f"an integer within {tensor.datatype}'s range, or null"
    else:
        limit = float(np.finfo(kind).max)
        # NaN (tritonclient writes numpy's NaN as JSON NaN) and null are missing values,
        # for conform to accept or refuse; a huge int is compared without overflow
        fits = [
            value is None
            or (type(value) is float and math.isnan(value))
            or (type(value) in (int, float) and abs(value) <= limit)
            for value in flat
        ]
        want = f"a finite number within {tensor.datatype}'s range, or null"
    if not all(fits):
        index = fits.index(False)
        where = f"data[{index}]"
        if len(tensor.shape) == 2 and tensor.shape[1] > 1:  # data is row-major, maybe flat
            where += " (instance {}, column {})".format(*divmod(index, tensor.shape[1]))
        msg = f"input {tensor.name!r}: {where} = {show(flat[index])} is not {want}"
        raise InvalidInput.at(loc, msg, "datatype")
    if kind.kind == "b":  # holding null: objects, as /predict's booleans with a missing one
        return _strings(flat)
    # Every value fits: an integer tensor holding null (float64, NaN for null)
    return np.array([math.nan if v is None else v for v in flat], dtype=np.float64)


def binary_values(kind: np.dtype[Any], chunk: memoryview) -> npt.NDArray[Any]:
    """Little-endian elements of ``kind`` (their count checked by ``_check_declared``): a
    view of ``chunk``, no copy, on a little-endian host where the chunk is aligned for
    ``kind`` (an earlier input of an odd size in bytes can leave it not); else a copy."""
    values = np.frombuffer(chunk, dtype=kind.newbyteorder("<"))
    if values.dtype != kind or not values.flags.aligned:
        values = values.astype(kind)
    return values


def check_bool_bytes(values: npt.NDArray[np.bool_], loc: str) -> None:
    """:raises InvalidInput: for a ``BOOL`` byte other than 0 or 1 (numpy would hold it as
    a bool of that byte: True to numpy, another value to a model reading the bytes)."""
    raw = values.view(np.uint8)
    if raw.size and raw.max() > 1:
        index = int(np.argmax(raw > 1))
        msg = f"{int(raw[index])} is not a BOOL byte (0 or 1)"
        raise InvalidInput.at(f"{loc}.data[{index}]", msg, "bool_type")


def binary_strings(tensor: V2RequestInput, chunk: memoryview, loc: str) -> npt.NDArray[Any]:
    """``BYTES`` elements of the binary extension (each a 4-byte little-endian length,
    then its bytes) as ``str`` objects; at most ``len(chunk) / 4`` of them
    (``_check_declared``).

    :raises InvalidInput: when the lengths do not add up to the chunk, or an element is
        not UTF-8.
    """
    count = math.prod(tensor.shape)
    values = np.empty(count, dtype=object)
    offset = 0
    for index in range(count):
        if offset + 4 > len(chunk):
            msg = f"input {tensor.name!r}: element {index} runs past its binary data"
            raise InvalidInput.at(loc, msg, "binary_data")
        (size,) = struct.unpack_from("<I", chunk, offset)
        raw = chunk[offset + 4 : offset + 4 + size]
        if len(raw) != size:
            msg = f"input {tensor.name!r}: element {index} runs past its binary data"
            raise InvalidInput.at(loc, msg, "binary_data")
        try:
            values[index] = str(raw, "utf-8")
        except UnicodeDecodeError:
            msg = f"input {tensor.name!r}: element {index} is not UTF-8 text"
            raise InvalidInput.at(loc, msg, "datatype") from None
        offset += 4 + size
    if offset != len(chunk):
        msg = f"input {tensor.name!r}: {len(chunk) - offset} bytes after its {count} elements"
        raise InvalidInput.at(loc, msg, "binary_data")
    return values
