"""KServe V2 bodies <-> the data plane: input tensors -> ``serving.inputs.instances.Tensors``,
model outputs -> output tensors.

Inputs: each tensor's ``data`` as JSON (flat or nested, row-major) or as raw
little-endian bytes (Triton's binary tensor data extension), checked against its
``datatype`` and ``shape`` and decoded to an array of that shape and element type, without
the model: ``serving.inputs.conform`` then matches the names to the model's inputs (each sent
once, ``[n, width]`` or ``[n]`` for a one-column input) and refuses values the model's
own input type cannot hold. Each tensor keeps its datatype (``FP32`` is float32, ``INT64``
int64, exact end to end): a tensor of the model's own type and shape becomes its batch
without a conversion. ``BYTES`` become ``str`` (UTF-8) for string features; an integer
tensor whose JSON data holds ``null`` becomes float64 with NaN (as a feature that may be
missing is held). ``null`` in JSON, NaN in JSON or binary: a missing value, refused by
conform unless the feature may be missing. ``BF16`` inputs are refused, as are
shared-memory tensors and the classification extension.

The dtype path of a tensor, and what is copied:

- binary: the body's tail is copied once by ``split_body`` (writable, aligned), and each
  tensor is a numpy view of it (``np.frombuffer``): no conversion, no Python per value;
- JSON: pydantic has parsed the values into Python lists; numpy builds the array of the
  datatype from them in C (``FP32``: float32 at once, no float64 between). The codec's
  check is the datatype's: a value of another JSON type (``set(map(type, ...))``, in C),
  an integer out of range (numpy's ``OverflowError``), a number that becomes infinite in
  the datatype (one ``np.isinf``). Only a refused tensor is walked in Python, to name
  its first bad value.

Outputs: each named output array becomes ``{name, datatype, shape, data}`` (flattened), or
its raw bytes after the JSON header when ``binary_data`` is asked for; string labels are
``BYTES`` (binary: 4-byte little-endian length, then the UTF-8 bytes, per element).

Every declared shape is checked before anything of its size exists: its instances
(``shape[0]``) against ``SERVING_MAX_INSTANCES_PER_REQUEST``, its elements against what
the request holds (one JSON value each, ``itemsize`` bytes each, at least the 4-byte
length each for ``BYTES``). So an array is only ever as large as the body that fills it
(a 121-byte request declaring ``[268435456]`` ``BYTES`` allocated 2.6 GB before).

Every refusal is ``InvalidInput`` naming the input (``inputs[1]``) and what was wrong.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np
import numpy.typing as npt

from serving.errors import InvalidInput, PayloadTooLarge
from serving.inputs.instances import Tensors
from serving.inputs.values import show
from serving.model.handle import Outputs
from serving.protocols.v2.schemas import (
    Datatype,
    V2InferRequest,
    V2RequestInput,
    V2RequestOutput,
)

__all__ = ["HEADER_LENGTH", "datatype_of", "decode", "encode_outputs", "split_body"]

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


def datatype_of(dtype: np.dtype[Any]) -> Datatype:
    """The protocol's name for a numpy element type; strings and objects are ``BYTES``."""
    for name, kind in _NUMPY.items():
        if dtype == kind:
            return name  # type: ignore[return-value]
    return "BYTES"


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, bytearray]:
    """``(json_header, binary_tail)`` of a request body; the tail is empty without the
    ``Inference-Header-Content-Length`` header.

    The tail is copied once, into a ``bytearray``: its tensors are numpy views of it
    (``decode``), so the model may write into its input, and its first byte is aligned
    for any element type (the header's length is not, so a view of ``body`` would not be).

    :raises InvalidInput: when the header is not an integer within the body's length.
    """
    if header_length is None:
        return body, bytearray()
    loc = f"headers.{HEADER_LENGTH}"
    digits = header_length.strip()
    # ASCII only: str.isdigit() also accepts "²" or "٣", which int() refuses or reads.
    if not (digits.isascii() and digits.isdigit()):
        raise InvalidInput.at(loc, f"{header_length[:32]!r} is not a byte count", "header")
    # Longer than the body's own length in digits: more than the body, and never int()ed
    # (past 4,300 digits int() raises ValueError).
    length = int(digits) if len(digits) <= len(str(len(body))) else len(body) + 1
    if length > len(body):
        shown = digits if len(digits) <= 32 else f"{digits[:32]}... ({len(digits)} digits)"
        raise InvalidInput.at(loc, f"{shown} is more than the body's {len(body)} bytes", "header")
    return body[:length], bytearray(memoryview(body)[length:])


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


def _json_values(tensor: V2RequestInput, kind: np.dtype[Any], loc: str) -> npt.NDArray[Any]:
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


def _check_declared(
    tensor: V2RequestInput, chunk: memoryview | None, loc: str, max_instances: int
) -> np.dtype[Any]:
    """The tensor's element type, once its declared shape is known to fit the request,
    before anything of that shape is allocated.

    :raises PayloadTooLarge: (413) ``shape[0]`` over ``max_instances``.
    :raises InvalidInput: naming the input: a datatype not supported, a shape of no
        elements, binary data of another size than the shape needs (``BYTES``: less than
        the 4-byte length of each element), both ``data`` and binary data.
    """
    if tensor.datatype not in _NUMPY and tensor.datatype != "BYTES":
        msg = f"input {tensor.name!r}: datatype {tensor.datatype} is not supported"
        raise InvalidInput.at(loc, msg, "datatype")
    shape = tensor.shape
    if shape and shape[0] > max_instances:
        what, setting = f"input {tensor.name!r}", "SERVING_MAX_INSTANCES_PER_REQUEST"
        raise PayloadTooLarge(what, shape[0], max_instances, setting, "instances")
    count = math.prod(shape)
    if count == 0:  # any other dimension may be huge: numpy could not hold its shape
        msg = f"input {tensor.name!r} has shape {shape}: no values (at least one instance)"
        raise InvalidInput.at(loc, msg, "shape")
    kind = _NUMPY.get(tensor.datatype, np.dtype(object))
    if chunk is None:
        return kind  # JSON values: counted against the shape before any array is built
    if tensor.data is not None:
        msg = f"input {tensor.name!r} has both data and parameters.binary_data_size"
        raise InvalidInput.at(loc, msg, "binary_data")
    if kind.kind == "O" and count * 4 > len(chunk):
        msg = (
            f"input {tensor.name!r}: shape {shape} has {count} elements, at least "
            f"{count * 4} bytes (a 4-byte length each); binary_data_size is {len(chunk)} bytes"
        )
        raise InvalidInput.at(loc, msg, "binary_data")
    if kind.kind != "O" and len(chunk) != count * kind.itemsize:
        msg = (
            f"input {tensor.name!r} has binary_data_size {len(chunk)}; shape {shape} "
            f"of {tensor.datatype} needs {count * kind.itemsize} bytes"
        )
        raise InvalidInput.at(loc, msg, "binary_data")
    return kind


def _binary_values(kind: np.dtype[Any], chunk: memoryview) -> npt.NDArray[Any]:
    """Little-endian elements of ``kind`` (their count checked by ``_check_declared``): a
    view of ``chunk``, no copy, on a little-endian host where the chunk is aligned for
    ``kind`` (an earlier input of an odd size in bytes can leave it not); else a copy."""
    values = np.frombuffer(chunk, dtype=kind.newbyteorder("<"))
    if values.dtype != kind or not values.flags.aligned:
        values = values.astype(kind)
    return values


def _check_bool_bytes(values: npt.NDArray[np.bool_], loc: str) -> None:
    """:raises InvalidInput: for a ``BOOL`` byte other than 0 or 1 (numpy would hold it as
    a bool of that byte: True to numpy, another value to a model reading the bytes)."""
    raw = values.view(np.uint8)
    if raw.size and raw.max() > 1:
        index = int(np.argmax(raw > 1))
        msg = f"{int(raw[index])} is not a BOOL byte (0 or 1)"
        raise InvalidInput.at(f"{loc}.data[{index}]", msg, "bool_type")


def _binary_strings(tensor: V2RequestInput, chunk: memoryview, loc: str) -> npt.NDArray[Any]:
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


def _chunks(inputs: Sequence[V2RequestInput], binary: bytearray) -> list[memoryview | None]:
    """Each input's bytes of the binary tail, a view of it (None: the input sent JSON
    data), in request order."""
    chunks: list[memoryview | None] = []
    view = memoryview(binary)
    offset = 0
    for index, tensor in enumerate(inputs):
        size = tensor.parameters.binary_data_size if tensor.parameters else None
        if size is not None and offset + size > len(binary):
            msg = f"input {tensor.name!r}: binary_data_size {size} runs past the body's end"
            raise InvalidInput.at(f"inputs[{index}]", msg, "binary_data")
        chunks.append(None if size is None else view[offset : offset + size])
        offset += size or 0
    if offset != len(binary):
        msg = f"the body has {len(binary) - offset} bytes after the inputs' binary data"
        raise InvalidInput.at(f"headers.{HEADER_LENGTH}", msg, "binary_data")
    return chunks


def _refuse_unsupported(body: V2InferRequest) -> None:
    """:raises InvalidInput: for shared-memory tensors and the classification extension."""
    for index, tensor in enumerate(body.inputs):
        if tensor.parameters and "shared_memory_region" in (tensor.parameters.model_extra or {}):
            msg = "shared memory is not supported: send the data in the body"
            raise InvalidInput.at(f"inputs[{index}]", msg, "shared_memory")
    for index, out in enumerate(body.outputs or ()):
        extra = (out.parameters.model_extra or {}) if out.parameters else {}
        if "shared_memory_region" in extra:
            msg = "shared memory is not supported: outputs come back in the body"
            raise InvalidInput.at(f"outputs[{index}]", msg, "shared_memory")
        if "classification" in extra:
            msg = "the classification extension is not supported: ask for 'probabilities'"
            raise InvalidInput.at(f"outputs[{index}]", msg, "classification")


def decode(body: V2InferRequest, binary: bytearray, max_instances: int) -> Tensors:
    """The request's input tensors, in request order, each as an array of its declared
    ``shape`` and ``datatype`` (``BYTES`` as ``str`` objects; an integer datatype whose
    JSON data holds ``null`` as float64 with NaN). Binary data are views of ``binary``,
    not copies. Every input's shape is checked before any is decoded.

    :param binary: the body after the JSON header (binary tensor data extension), as
        ``split_body`` copies it.
    :param max_instances: ``SERVING_MAX_INSTANCES_PER_REQUEST``.
    :raises PayloadTooLarge: (413) an input of more instances than ``max_instances``.
    :raises InvalidInput: naming the input: ``BF16``, values the datatype cannot hold,
        data length != product(shape), binary sizes that do not add up to the body, a
        shape of no elements; or a shared-memory tensor, the classification extension.
    """
    _refuse_unsupported(body)
    chunks = _chunks(body.inputs, binary)
    kinds = [
        _check_declared(tensor, chunks[index], f"inputs[{index}]", max_instances)
        for index, tensor in enumerate(body.inputs)
    ]
    decoded: list[tuple[str, npt.NDArray[Any]]] = []
    for index, (tensor, kind, chunk) in enumerate(zip(body.inputs, kinds, chunks, strict=True)):
        if chunk is None:
            values = _json_values(tensor, kind, f"inputs[{index}]")
        elif kind.kind == "O":
            values = _binary_strings(tensor, chunk, f"inputs[{index}]")
        else:
            values = _binary_values(kind, chunk)
            if kind == np.bool_:
                _check_bool_bytes(values, f"inputs[{index}]")
        decoded.append((tensor.name, values.reshape(tensor.shape)))
    return Tensors(decoded)


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
