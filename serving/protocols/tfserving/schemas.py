"""TF Serving REST bodies (``/v1/models/...``), as TensorFlow Serving's ``api_rest.md``
defines them, validated as ``/predict`` is (no unknown fields; values are JSON scalars
checked against the model's schema, strings for ``DT_STRING`` features; validation stops
at the first error).

Source: https://www.tensorflow.org/tfx/serving/api_rest (predict, classify and regress,
model status, model metadata). ``b64`` binary values are not served.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from serving.protocols.schemas import Rows, Strict, Value

__all__ = [
    "TFClassifyResponse",
    "TFErrorResponse",
    "TFExamplesRequest",
    "TFMetadataResponse",
    "TFPredictRequest",
    "TFPredictResponse",
    "TFRegressResponse",
    "TFStatusResponse",
]

#: A named value in an object instance: a scalar for a one-column input or feature, else
#: the input's values.
NamedValue = Value | list[Value]
#: Row format objects: one per instance, keyed by feature or input name.
NamedObjects = Annotated[list[dict[str, NamedValue]], Field(fail_fast=True)]
#: Columnar format object: each feature or input name -> one value per instance.
NamedColumns = Annotated[dict[str, list[NamedValue]], Field(fail_fast=True)]


class TFPredictRequest(Strict):
    """``POST /v1/models/{name}[/versions/{version}]:predict``: exactly one of ``instances``
    (row format) or ``inputs`` (columnar format)."""

    signature_name: str | None = Field(
        None, description="Only serving_default (the model's one signature) is served."
    )
    instances: (
        Annotated[Rows, Field(min_length=1)]
        | Annotated[NamedObjects, Field(min_length=1)]
        | Annotated[list[Value], Field(min_length=1)]
        | None
    ) = Field(
        None,
        union_mode="left_to_right",
        description="Row format, one entry per instance: a list of the feature values in "
        "the model's order, a number (one-feature models), or an object keyed by feature "
        "name or by input name (metadata lists both).",
    )
    inputs: Rows | NamedColumns | list[Value] | None = Field(
        None,
        union_mode="left_to_right",
        description="Columnar format: the one input tensor (n_instances, n_features), or "
        "an object mapping each feature or input name to its values, one per instance.",
    )

    @model_validator(mode="after")
    def _one_format(self) -> TFPredictRequest:
        if (self.instances is None) == (self.inputs is None):
            raise ValueError("send exactly one of instances (row format) or inputs (columnar)")
        return self


class TFPredictResponse(BaseModel):
    """Row format requests get ``predictions``, columnar ones ``outputs``. With one model
    output, its value per instance; with several (a classifier's ``predictions`` and
    ``probabilities``), an object per instance (row) or an object of per-output lists
    (columnar)."""

    predictions: list[Any] | None = None
    outputs: list[Any] | dict[str, list[Any]] | None = None


class TFExamplesRequest(Strict):
    """``POST /v1/models/{name}[/versions/{version}]:classify`` (or ``:regress``): TF
    Serving's examples, each an object keyed by feature name (or input name), and an
    optional ``context`` of features every example shares (a name in both is refused, as
    TF Serving's "features that appear here MUST NOT appear in examples")."""

    signature_name: str | None = Field(
        None, description="Only serving_default (the model's one signature) is served."
    )
    context: dict[str, NamedValue] | None = Field(
        None, description="Features shared by every example, keyed by feature name."
    )
    examples: Annotated[NamedObjects, Field(min_length=1)] = Field(
        description="One object per example, keyed by feature name (or by input name: a "
        "list of the input's values)."
    )


class TFClassifyResponse(BaseModel):
    """``:classify``: per example, each class label (a string, as TF Serving's) with its
    probability, in the model's class order."""

    result: list[list[tuple[str, float]]]


class TFRegressResponse(BaseModel):
    """``:regress``: per example, the regression model's one predicted number."""

    result: list[float]


class TFStatus(BaseModel):
    error_code: Literal["OK", "UNAVAILABLE", "UNKNOWN"]
    error_message: str


class TFVersionStatus(BaseModel):
    version: str
    state: Literal["LOADING", "AVAILABLE", "UNLOADING", "END"]
    status: TFStatus


class TFStatusResponse(BaseModel):
    """``GET /v1/models/{name}[/versions/{version}]``: TF Serving's GetModelStatusResponse."""

    model_version_status: list[TFVersionStatus]


class TFDim(BaseModel):
    size: str = Field(description="Axis length as a decimal string, -1 when open (batch).")
    name: str = ""


class TFTensorShape(BaseModel):
    dim: list[TFDim]
    unknown_rank: bool = False


class TFTensorInfo(BaseModel):
    dtype: str = Field(description="DT_FLOAT, DT_DOUBLE, DT_INT64, DT_STRING, ...")
    tensor_shape: TFTensorShape
    name: str


class TFSignature(BaseModel):
    inputs: dict[str, TFTensorInfo]
    outputs: dict[str, TFTensorInfo]
    method_name: str = "tensorflow/serving/predict"


class TFSignatureDefs(BaseModel):
    signature_def: dict[str, TFSignature]


class TFMetadata(BaseModel):
    signature_def: TFSignatureDefs
    feature_names: list[str] | None = Field(
        description="The model's feature names in column order (instance objects and "
        "columnar inputs may be keyed by them); null when the model does not know them."
    )


class TFModelSpec(BaseModel):
    name: str
    signature_name: str = ""
    version: str


class TFMetadataResponse(BaseModel):
    """``GET /v1/models/{name}[/versions/{version}]/metadata``: GetModelMetadataResponse,
    plus the feature names."""

    model_config = ConfigDict(protected_namespaces=())

    model_spec: TFModelSpec
    metadata: TFMetadata


class TFErrorResponse(BaseModel):
    """TF Serving's error shape ``{"error": message}``, plus our stable ``code``."""

    error: str
    code: str = Field(description="Stable machine-readable code, e.g. invalid_input.")
