"""MLflow / SageMaker scoring bodies (``POST /invocations``, ``GET /ping``), as MLflow's
pyfunc scoring server (``mlflow models serve``) defines them, validated as strictly as
``/predict``: unknown fields refused, values checked against the model's schema,
validation stopped at the first error.

Source: MLflow's "Deploy MLflow models" docs, scoring-server request formats:
``dataframe_split`` (pandas ``orient="split"``), ``dataframe_records`` (``orient="records"``),
``instances`` and ``inputs`` (TF Serving style), each with optional ``params``; and
``text/csv`` (a header row of column names, read here with the ``csv`` module).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, model_validator

from serving.protocols.schemas import Objects, Rows, Strict, Value

__all__ = [
    "DataframeSplit",
    "MlflowErrorResponse",
    "MlflowRequest",
    "MlflowResponse",
    "PingResponse",
]

#: The body fields that carry the data; a request has exactly one of them.
DATA_FIELDS = ("dataframe_split", "dataframe_records", "instances", "inputs")
#: ``inputs`` as an object of columns: each name -> one value per instance.
Columns = Annotated[dict[str, list[Value]], Field(fail_fast=True)]


class DataframeSplit(Strict):
    """A pandas DataFrame in ``orient="split"``: ``data`` rows, ``columns`` their names."""

    columns: (
        Annotated[list[str], Field(min_length=1, fail_fast=True)]
        | Annotated[list[int], Field(min_length=1, fail_fast=True)]
        | None
    ) = Field(
        None,
        union_mode="left_to_right",
        description="Column names, reordered to the model's feature names when it knows "
        "them; without them (or for a model without names) columns are positional. "
        "Integers (pandas' default column labels) are feature positions 0..n-1.",
    )
    data: Rows = Field(min_length=1, description="(n_instances, n_columns).")
    index: list[int | str] | None = Field(None, fail_fast=True, description="Row labels; not used.")


class MlflowRequest(Strict):
    """``POST /invocations`` JSON: exactly one of the four data fields."""

    dataframe_split: DataframeSplit | None = None
    dataframe_records: Objects | None = Field(
        None, min_length=1, description="One object per instance, keyed by column name."
    )
    instances: (
        Annotated[Rows, Field(min_length=1)] | Annotated[Objects, Field(min_length=1)] | None
    ) = Field(
        None,
        union_mode="left_to_right",
        description="Rows of values, or objects keyed by column name.",
    )
    inputs: Rows | Columns | None = Field(
        None,
        union_mode="left_to_right",
        description="Rows of values, or an object of columns (name -> values).",
    )
    params: dict[str, Any] | None = Field(
        None,
        description="Inference parameters. Ignored, as MLflow ignores them for a model "
        "whose signature declares none (scikit-learn models here declare none).",
    )

    @model_validator(mode="after")
    def _one_data_field(self) -> MlflowRequest:
        given = [name for name in DATA_FIELDS if getattr(self, name) is not None]
        if len(given) != 1:
            got = ", ".join(given) if given else "none"
            raise ValueError(f"send exactly one of {', '.join(DATA_FIELDS)} (got {got})")
        return self


class MlflowResponse(BaseModel):
    """One prediction per instance, in request order: what ``mlflow.pyfunc`` answers, a
    class label or value, or the class probabilities for an MLflow folder whose
    ``MLmodel`` names ``predict_fn: predict_proba``."""

    predictions: list[Any]


class PingResponse(BaseModel):
    """``GET /ping``: 200 when every model of the worker is ready, else 503."""

    status: Literal["loading", "ready", "failed", "stopping"]


class MlflowErrorResponse(BaseModel):
    """MLflow's error shape, plus our stable ``code``."""

    error_code: str = Field(
        description="MLflow's error code: MALFORMED_REQUEST (400), INVALID_PARAMETER_VALUE "
        "(422: values the model's schema refuses), BAD_REQUEST (other 4xx), "
        "UNAUTHENTICATED (401), TEMPORARILY_UNAVAILABLE (503), DEADLINE_EXCEEDED (504), "
        "INTERNAL_ERROR (500)."
    )
    message: str
    code: str = Field(description="Stable machine-readable code, e.g. invalid_input.")
