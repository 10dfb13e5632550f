"""Request and response bodies of the Open Inference Protocol (KServe V2) over REST.

As in ``serving.protocols.schemas``, requests are validated strictly from the raw bytes
(unknown top-level fields are refused; validation stops at the first error), except the
free-form ``parameters`` objects the protocol leaves open: their known keys are typed,
others are kept and ignored. Tensor ``data`` is any JSON array here (row-major, flat or
nested); ``serving.protocols.v2.codec`` checks it against the tensor's ``datatype`` and
``shape``. Source: the KServe "Open Inference Protocol" REST spec and Triton's binary
tensor data extension.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from serving.protocols.schemas import Strict

__all__ = [
    "Datatype",
    "V2Error",
    "V2InferRequest",
    "V2InferResponse",
    "V2Live",
    "V2ModelMetadata",
    "V2ModelReady",
    "V2Ready",
    "V2RequestInput",
    "V2RequestOutput",
    "V2ResponseOutput",
    "V2ServerMetadata",
    "V2TensorMetadata",
]

#: The protocol's tensor element types.
Datatype = Literal[
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BF16", "BYTES",
]  # fmt: skip


def _integral(value: Any) -> Any:
    """``2.0`` as ``2``: JSON Schema's ``integer`` (which the OpenAPI document shows) admits
    numbers with a zero fractional part, and some clients write sizes as floats."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


#: A count (a shape dimension, a byte size): a non-negative integer.
Count = Annotated[int, Field(ge=0), BeforeValidator(_integral)]


class _Parameters(BaseModel):
    """A protocol ``parameters`` object: known keys typed, any other key kept."""

    model_config = ConfigDict(strict=True, extra="allow")


class V2InputParameters(_Parameters):
    binary_data_size: Count | None = Field(
        None,
        description="Binary tensor data extension: this input's bytes follow the JSON "
        "header (Inference-Header-Content-Length) in request order, little-endian.",
    )
    null_value: str | None = Field(
        None,
        description="A BYTES input's elements equal to this string are missing values, "
        "as JSON null is (overrides the request's null_value).",
    )


class V2RequestInput(Strict):
    """One input tensor: ``shape`` ``[n_instances, width]`` (or ``[n_instances]``)."""

    name: str = Field(min_length=1, max_length=256)
    shape: list[Count] = Field(max_length=8, fail_fast=True)
    datatype: Datatype
    parameters: V2InputParameters | None = None
    data: list[Any] | None = Field(
        None,
        description="The values in row-major order, as one flat array or nested arrays; "
        "absent when parameters.binary_data_size is given.",
    )


class V2OutputParameters(_Parameters):
    binary_data: bool | None = Field(
        None, description="Answer this output as binary data after the JSON header."
    )


class V2RequestOutput(Strict):
    """An output the caller wants; without ``outputs`` every output is returned."""

    name: str = Field(min_length=1, max_length=256)
    parameters: V2OutputParameters | None = None


class V2RequestParameters(_Parameters):
    binary_data_output: bool | None = Field(
        None, description="Default of binary_data for every output (tritonclient sends it)."
    )
    null_value: str | None = Field(
        None,
        description="Every BYTES input's elements equal to this string are missing values, "
        "as JSON null is (tritonclient: infer(..., parameters={'null_value': 'None'})).",
    )


class V2InferRequest(Strict):
    """``POST /v2/models/{model_name}[/versions/{model_version}]/infer``."""

    id: str | None = Field(None, max_length=256, description="Echoed in the response.")
    parameters: V2RequestParameters | None = None
    inputs: list[V2RequestInput] = Field(min_length=1, max_length=256, fail_fast=True)
    outputs: list[V2RequestOutput] | None = Field(None, max_length=64, fail_fast=True)


class V2ResponseOutput(BaseModel):
    """One output tensor, ``shape`` ``[n_instances, ...]``, ``data`` flattened row-major
    (or ``parameters.binary_data_size`` bytes after the JSON header)."""

    name: str
    datatype: Datatype
    shape: list[int]
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = None


class V2InferResponse(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    model_name: str
    model_version: str
    id: str | None = Field(None, description="The request's id, when it had one.")
    outputs: list[V2ResponseOutput]


class V2TensorMetadata(BaseModel):
    """A model input or output: ``shape`` has -1 for the batch axis."""

    name: str
    datatype: Datatype
    shape: list[int]
    parameters: dict[str, Any] | None = Field(
        None, description="feature_names: the name of each column of an input, in order."
    )


class V2ModelMetadata(BaseModel):
    name: str
    versions: list[str] = Field(description="Every version of this model served here.")
    platform: str = Field(
        description="onnxruntime_onnx when ONNX Runtime answers (an ONNX model, or a "
        "scikit-learn model compiled to it), else the artifact format (joblib...)."
    )
    inputs: list[V2TensorMetadata]
    outputs: list[V2TensorMetadata]


class V2ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class V2Live(BaseModel):
    """``GET /v2/health/live``: 200 when live, 400 when only a restart helps."""

    live: bool


class V2Ready(BaseModel):
    """``GET /v2/health/ready``: 200 when every model is ready, 400 otherwise."""

    ready: bool


class V2ModelReady(BaseModel):
    name: str
    ready: bool


class V2Error(BaseModel):
    """The protocol's error shape, plus the service's stable ``code``."""

    error: str
    code: str = Field(description="Stable machine-readable code, e.g. invalid_input.")
