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
conform unless the feature may be missing; a ``BYTES`` element equal to the request's or
the input's ``parameters.null_value`` (``serving.protocols.v2.parameters``) is one too.
``BF16`` inputs are refused, as are
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
from typing import Any

import numpy as np
import numpy.typing as npt

from serving.errors import InvalidInput, PayloadTooLarge
from serving.inputs.conform import no_such_input
from serving.inputs.instances import Tensors
from serving.inputs.rules import Rules
from serving.model.handle import ModelHandle, Outputs
from serving.protocols.v2.parameters import null_tokens
from serving.protocols.v2.schemas import (
    Datatype,
    V2InferRequest,
    V2RequestInput,
    V2RequestOutput,
)
from serving.protocols.v2.tensor_values import (
    binary_strings,
    binary_values,
    check_bool_bytes,
    json_values,
)

__all__ = [
    "HEADER_LENGTH",
    "datatype_of",
    "decode",
    "encode_outputs",
    "names_before_values",
    "split_body",
]

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


#: The protocol's name of each numpy element type it has (a dict: one look-up a tensor).
_NAMES: dict[np.dtype[Any], str] = {kind: name for name, kind in _NUMPY.items()}


def datatype_of(dtype: np.dtype[Any]) -> Datatype:
    """The protocol's name for a numpy element type; strings and objects are ``BYTES``."""
    return _NAMES.get(dtype, "BYTES")  # type: ignore[return-value]


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
    JSON data holds ``null`` as float64 with NaN; ``BYTES`` elements equal to the input's
    ``null_value`` as None). Binary data are views of ``binary``,
    not copies. Every input's shape is checked before any is decoded.

    :param binary: the body after the JSON header (binary tensor data extension), as
        ``split_body`` copies it.
    :param max_instances: ``SERVING_MAX_INSTANCES_PER_REQUEST``.
    :raises PayloadTooLarge: (413) an input of more instances than ``max_instances``.
    :raises InvalidInput: naming the input: ``BF16``, values the datatype cannot hold,
        data length != product(shape), binary sizes that do not add up to the body, a
        shape of no elements; or a shared-memory tensor, the classification extension, a
        parameter not taken (``parameters.null_tokens``).
    """
    _refuse_unsupported(body)
    tokens = null_tokens(body)
    chunks = _chunks(body.inputs, binary)
    kinds = [
        _check_declared(tensor, chunks[index], f"inputs[{index}]", max_instances)
        for index, tensor in enumerate(body.inputs)
    ]
    decoded: list[tuple[str, npt.NDArray[Any]]] = []
    for index, (tensor, kind, chunk) in enumerate(zip(body.inputs, kinds, chunks, strict=True)):
        if chunk is None:
            values = json_values(tensor, kind, f"inputs[{index}]")
        elif kind.kind == "O":
            values = binary_strings(tensor, chunk, f"inputs[{index}]")
        else:
            values = binary_values(kind, chunk)
            if kind == np.bool_:
                check_bool_bytes(values, f"inputs[{index}]")
        if tokens[index] is not None:  # BYTES: the elements naming a missing value
            values[values == tokens[index]] = None
        decoded.append((tensor.name, values.reshape(tensor.shape)))
    return Tensors(decoded)


def names_before_values(body: V2InferRequest, handle: ModelHandle, rules: Rules) -> None:
    """Called while refusing a tensor's values: raise the refusal of an input the model
    does not have instead (unless ``rules`` ignore such names): ``["pro", 2]`` sent as
    ``input-0`` to a model whose inputs are its columns has a wrong name, not a value."""
    names = [spec.name for spec in handle.input_specs()]
    for index, tensor in enumerate(body.inputs):
        if tensor.name not in names and rules.extra != "ignore":
            raise no_such_input(index, tensor.name, names)


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
