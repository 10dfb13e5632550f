"""KServe V2 tensors <-> the batcher's ``(n_instances, n_features)`` float64 matrix.

Inputs: each of the model's inputs (``ModelHandle.input_specs()``) must be sent once under
its name, ``shape`` ``[n, width]`` (or ``[n]`` for a one-column input), with ``data`` as
JSON (flat or nested, row-major) or as raw little-endian bytes (Triton's binary tensor
data extension). Any numeric ``datatype`` is accepted for any input: values become
float64 like ``/predict``'s JSON numbers, and ``run_batch`` refuses those the model's own
input type cannot hold. ``BYTES`` and ``BF16`` inputs are refused.

Outputs: each named output array becomes ``{name, datatype, shape, data}`` (flattened), or
its raw bytes after the JSON header when ``binary_data`` is asked for; string labels are
``BYTES`` (binary: 4-byte little-endian length, then the UTF-8 bytes, per element).

Every refusal is ``InvalidInput`` naming the input (``inputs[1]``) and what was wrong.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from serving.errors import InvalidInput
from serving.handle import Outputs, TensorSpec
from serving.schemas_v2 import Datatype, V2RequestInput, V2RequestOutput

__all__ = ["HEADER_LENGTH", "datatype_of", "encode_outputs", "input_rows", "split_body"]

#: The binary extension's header: the JSON part's length in bytes.
HEADER_LENGTH = "Inference-Header-Content-Length"

_NUMPY: dict[str, np.dtype[Any]] = {
    name: np.dtype(kind)
    for name, kind in [
        ("BOOL", np.bool_), ("UINT8", np.uint8), ("UINT16", np.uint16), ("UINT32", np.uint32),
        ("UINT64", np.uint64), ("INT8", np.int8), ("INT16", np.int16), ("INT32", np.int32),
        ("INT64", np.int64), ("FP16", np.float16), ("FP32", np.float32), ("FP64", np.float64),
    ]
}  # fmt: skip


def _invalid(loc: str, msg: str, kind: str) -> InvalidInput:
    return InvalidInput(f"{loc}: {msg}", [{"loc": loc, "msg": msg, "type": kind}])


def datatype_of(dtype: np.dtype[Any]) -> Datatype:
    """The protocol's name for a numpy element type; strings and objects are ``BYTES``."""
    for name, kind in _NUMPY.items():
        if dtype == kind:
            return name  # type: ignore[return-value]
    return "BYTES"


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    """``(json_header, binary_tail)`` of a request body; the tail is empty without the
    ``Inference-Header-Content-Length`` header.

    :raises InvalidInput: when the header is not an integer within the body's length.
    """
    if header_length is None:
        return body, b""
    loc = f"headers.{HEADER_LENGTH}"
    digits = header_length.strip()
    # ASCII only: str.isdigit() also accepts "²" or "٣", which int() refuses or reads.
    if not (digits.isascii() and digits.isdigit()):
        raise _invalid(loc, f"{header_length[:32]!r} is not a byte count", "header")
    # Longer than the body's own length in digits: more than the body, and never int()ed
    # (past 4,300 digits int() raises ValueError).
    length = int(digits) if len(digits) <= len(str(len(body))) else len(body) + 1
    if length > len(body):
        shown = digits if len(digits) <= 32 else f"{digits[:32]}... ({len(digits)} digits)"
        raise _invalid(loc, f"{shown} is more than the body's {len(body)} bytes", "header")
    return body[:length], body[length:]


def _flatten(data: list[Any]) -> list[Any]:
    if not any(isinstance(value, list) for value in data):
        return data
    flat: list[Any] = []

    def walk(items: list[Any]) -> None:
        for value in items:
            if isinstance(value, list):
                walk(value)
            else:
                flat.append(value)

    walk(data)
    return flat


def _json_values(tensor: V2RequestInput, kind: np.dtype[Any], loc: str) -> npt.NDArray[Any]:
    """``tensor.data`` as a flat float64 array, each value checked against ``datatype``."""
    if tensor.data is None:
        msg = f"input {tensor.name!r} has no data (send data, or parameters.binary_data_size)"
        raise _invalid(loc, msg, "missing_data")
    flat = _flatten(tensor.data)
    expected = math.prod(tensor.shape)
    if len(flat) != expected:
        msg = f"input {tensor.name!r} has {len(flat)} values; shape {tensor.shape} needs {expected}"
        raise _invalid(loc, msg, "data_length")
    if kind.kind == "b":
        fits = [type(value) is bool for value in flat]
        want = "true or false"
    elif kind.kind in "iu":
        info = np.iinfo(kind)
        fits = [type(value) is int and info.min <= value <= info.max for value in flat]
        want = f"an integer within {tensor.datatype}'s range"
    else:
        limit = float(np.finfo(kind).max)
        # abs(NaN) <= limit is False, and a huge int is compared without overflow
        fits = [type(value) in (int, float) and abs(value) <= limit for value in flat]
        want = f"a finite number within {tensor.datatype}'s range"
    if not all(fits):
        index = fits.index(False)
        msg = f"input {tensor.name!r}: data[{index}] = {repr(flat[index])[:32]} is not {want}"
        raise _invalid(loc, msg, "datatype")
    return np.array(flat, dtype=np.float64)


def _binary_values(
    tensor: V2RequestInput, kind: np.dtype[Any], chunk: bytes, loc: str
) -> npt.NDArray[Any]:
    if tensor.data is not None:
        msg = f"input {tensor.name!r} has both data and parameters.binary_data_size"
        raise _invalid(loc, msg, "binary_data")
    expected = math.prod(tensor.shape) * kind.itemsize
    if len(chunk) != expected:
        msg = (
            f"input {tensor.name!r} has binary_data_size {len(chunk)}; shape {tensor.shape} "
            f"of {tensor.datatype} needs {expected} bytes"
        )
        raise _invalid(loc, msg, "binary_data")
    values = np.frombuffer(chunk, dtype=kind.newbyteorder("<")).astype(np.float64)
    if kind.kind == "f" and not np.isfinite(values).all():
        index = int(np.argmin(np.isfinite(values)))
        msg = f"input {tensor.name!r}: value {index} is {values[index]}, not a finite number"
        raise _invalid(loc, msg, "datatype")
    return values


def _chunks(inputs: Sequence[V2RequestInput], binary: bytes) -> list[bytes | None]:
    """Each input's bytes of the binary tail (None: it sent JSON data), in request order."""
    chunks: list[bytes | None] = []
    offset = 0
    for index, tensor in enumerate(inputs):
        size = tensor.parameters.binary_data_size if tensor.parameters else None
        if size is not None and offset + size > len(binary):
            msg = f"input {tensor.name!r}: binary_data_size {size} runs past the body's end"
            raise _invalid(f"inputs[{index}]", msg, "binary_data")
        chunks.append(None if size is None else binary[offset : offset + size])
        offset += size or 0
    if offset != len(binary):
        msg = f"the body has {len(binary) - offset} bytes after the inputs' binary data"
        raise _invalid(f"headers.{HEADER_LENGTH}", msg, "binary_data")
    return chunks


def _rows(
    tensor: V2RequestInput, spec: TensorSpec, values: npt.NDArray[np.float64], loc: str
) -> npt.NDArray[np.float64]:
    """``values`` as ``(n_instances, width)`` after checking ``tensor.shape`` fits ``spec``."""
    shape, width = tensor.shape, spec.width
    fits = (len(shape) == 2 and width in (-1, shape[1])) or (len(shape) == 1 and width == 1)
    if not fits or shape[0] == 0 or (len(shape) == 2 and shape[1] == 0):
        msg = (
            f"input {tensor.name!r} has shape {shape}; the model takes {list(spec.shape)} "
            "(-1: any number of instances, at least one)"
        )
        raise _invalid(loc, msg, "shape")
    return values.reshape(shape[0], -1)


def input_rows(
    inputs: Sequence[V2RequestInput],
    binary: bytes,
    specs: tuple[TensorSpec, ...],
    n_features: int | None,
) -> npt.NDArray[np.float64]:
    """The ``(n_instances, n_features)`` float64 matrix of a request's ``inputs``: each
    input's columns side by side, in ``specs`` order.

    :param binary: the body after the JSON header (binary tensor data extension).
    :raises InvalidInput: naming the input: unknown, missing or repeated name, datatype not
        numeric or values it cannot hold, data length != product(shape), a shape that does
        not fit the model's input, inputs with different instance counts, binary sizes
        that do not add up to the body.
    """
    chunks = _chunks(inputs, binary)
    names = [spec.name for spec in specs]
    given: dict[str, int] = {}
    for index, tensor in enumerate(inputs):
        loc = f"inputs[{index}]"
        if tensor.name not in names:
            msg = f"the model has no input {tensor.name!r} (its inputs: {', '.join(names)})"
            raise _invalid(loc, msg, "input_name")
        if tensor.name in given:
            raise _invalid(loc, f"input {tensor.name!r} is given twice", "input_name")
        given[tensor.name] = index
    missing = [name for name in names if name not in given]
    if missing:
        msg = f"missing input {missing[0]!r} (the model's inputs: {', '.join(names)})"
        raise _invalid("inputs", msg, "input_name")
    columns: list[npt.NDArray[np.float64]] = []
    for spec in specs:
        index = given[spec.name]
        tensor, loc = inputs[index], f"inputs[{index}]"
        if tensor.datatype not in _NUMPY:
            msg = (
                f"input {tensor.name!r}: datatype {tensor.datatype} is not supported; send "
                f"numbers (the model computes in {datatype_of(spec.dtype)})"
            )
            raise _invalid(loc, msg, "datatype")
        kind = _NUMPY[tensor.datatype]
        chunk = chunks[index]
        if chunk is None:
            values = _json_values(tensor, kind, loc)
        else:
            values = _binary_values(tensor, kind, chunk, loc)
        rows = _rows(tensor, spec, values, loc)
        if columns and len(rows) != len(columns[0]):
            first = inputs[given[specs[0].name]].name
            msg = (
                f"input {tensor.name!r} has {len(rows)} instances; input {first!r} has "
                f"{len(columns[0])}"
            )
            raise _invalid(loc, msg, "shape")
        columns.append(rows)
    matrix = columns[0] if len(columns) == 1 else np.hstack(columns)
    if n_features is not None and matrix.shape[1] != n_features:
        msg = f"the inputs have {matrix.shape[1]} features in all; the model expects {n_features}"
        raise _invalid("inputs", msg, "feature_count")
    return np.ascontiguousarray(matrix, dtype=np.float64)


def _bytes_elements(array: npt.NDArray[Any]) -> list[bytes]:
    return [v if isinstance(v, bytes) else str(v).encode() for v in array.reshape(-1).tolist()]


def encode_outputs(
    outputs: Outputs, wanted: Sequence[V2RequestOutput] | None, binary_default: bool
) -> tuple[list[dict[str, Any]], bytes]:
    """The response's ``outputs`` (every output unless ``wanted`` names some) and the
    binary tail of those answered as binary data (``binary_data``, else ``binary_default``).

    Names in ``wanted`` must be keys of ``outputs`` (checked by the caller).
    """
    requested = {out.name: out for out in wanted} if wanted else dict.fromkeys(outputs)
    tensors: list[dict[str, Any]] = []
    tail: list[bytes] = []
    for name, out in requested.items():
        array = np.asarray(outputs[name])
        datatype = datatype_of(array.dtype)
        tensor: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        binary = out.parameters.binary_data if out is not None and out.parameters else None
        if binary if binary is not None else binary_default:
            if datatype == "BYTES":
                raw = b"".join(struct.pack("<I", len(v)) + v for v in _bytes_elements(array))
            else:
                raw = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
            tensor["parameters"] = {"binary_data_size": len(raw)}
            tail.append(raw)
        elif datatype == "BYTES":
            tensor["data"] = [v.decode(errors="replace") for v in _bytes_elements(array)]
        else:
            tensor["data"] = np.ascontiguousarray(array).reshape(-1)
        tensors.append(tensor)
    return tensors, b"".join(tail)
