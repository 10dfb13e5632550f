"""``POST /predict`` bodies (pydantic v2), validated as ``serving.protocols.schemas``
describes: unknown fields refused, values checked against the model by the data plane,
validation stopped at the first error."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from serving.protocols.schemas import Objects, Rows, Strict

__all__ = ["PredictRequest", "PredictResponse"]


class PredictRequest(Strict):
    """``POST /predict``: ``instances`` is ``(n_instances, n_features)`` values, row-major."""

    instances: Annotated[Rows, Field(min_length=1)] | Annotated[Objects, Field(min_length=1)] = (
        Field(
            union_mode="left_to_right",
            description="One instance per entry: a list of feature values in the model's "
            "order, or an object keyed by feature name (models that know their feature names). "
            "Values are numbers, strings (categorical features), booleans or null (missing).",
        )
    )
    model: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        description="The model to ask (any served name); default: the first of SERVING_MODELS.",
    )
    model_version: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        description="Pin the model version; a replica serving another answers 409.",
    )
    outputs: list[str] | None = Field(
        None,
        min_length=1,
        max_length=64,
        fail_fast=True,
        description="Also return these named model outputs (an ONNX graph's other outputs) "
        "under outputs, one row per instance.",
    )


class PredictResponse(BaseModel):
    """One prediction per instance, in request order."""

    model_config = ConfigDict(protected_namespaces=())

    predictions: list[Any] = Field(description="Class label or value per instance.")
    probabilities: list[list[float | None]] | None = Field(
        None, description="(n_instances, n_classes), columns in the order of classes."
    )
    classes: list[Any] | None = Field(None, description="Class labels, probability column order.")
    outputs: dict[str, list[Any]] | None = Field(
        None, description="The named outputs the request asked for, one row per instance."
    )
    model_name: str
    model_version: str
    latency_ms: float = Field(description="Server-side time from request to answer, in ms.")
