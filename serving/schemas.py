"""Request and response bodies shared by the blueprints (pydantic v2).

Requests are validated strictly, straight from the raw body bytes
(``model_validate_json``): a number must be a JSON number (not ``"1.5"``, not ``true``),
finite (``NaN``, ``Infinity`` and ``1e999`` are refused), and unknown fields are refused
so a typo such as ``instance`` is a 422, not silently ignored. Responses on the hot path
are serialized with orjson from plain dicts; the response models below document them
(and tests validate real responses against them).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from serving.errors import InvalidInput, MalformedJSON

__all__ = [
    "ErrorBody",
    "ErrorResponse",
    "HealthResponse",
    "LivenessResponse",
    "OpenAPIDocument",
    "PredictRequest",
    "PredictResponse",
    "parse_body",
]

#: At most this many error details are returned; the message says how many there were.
MAX_ERROR_DETAILS = 20


class _Strict(BaseModel):
    model_config = ConfigDict(
        strict=True, extra="forbid", allow_inf_nan=False, protected_namespaces=()
    )


class PredictRequest(_Strict):
    """``POST /predict``: ``instances`` is ``(n_instances, n_features)`` numbers, row-major."""

    instances: (
        Annotated[list[list[float]], Field(min_length=1)]
        | Annotated[list[dict[str, float]], Field(min_length=1)]
    ) = Field(
        description="One instance per entry: a list of feature values in the model's "
        "order, or an object keyed by feature name (models that know their feature names).",
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


class LivenessResponse(BaseModel):
    """``GET /livez``: ``alive`` (200), or ``failed`` (503) when only a restart helps."""

    status: Literal["alive", "failed"]


class OpenAPIDocument(BaseModel):
    """``GET /openapi.json``: an OpenAPI 3.1 document."""

    model_config = ConfigDict(extra="allow")

    openapi: str
    info: dict[str, Any]
    paths: dict[str, Any]


class ModelHealth(BaseModel):
    """One model version of the worker, in ``/healthz``."""

    name: str
    version: str
    status: Literal["loading", "ready", "failed", "stopping"]
    queue_depth: int
    execution_provider: str | None


class HealthResponse(BaseModel):
    """``GET /healthz``: 200 only when ``status`` is ``ready``, 503 otherwise."""

    model_config = ConfigDict(protected_namespaces=())

    status: Literal["loading", "ready", "failed", "stopping"]
    model_name: str
    model_version: str
    queue_depth: int = Field(description="Instances queued in this worker's batcher.")
    max_queue_depth: int = Field(description="Queue limit; past it requests get 503 overloaded.")
    execution_provider: str | None = Field(
        description="Where the model runs once loaded: ONNX Runtime's provider "
        "(CUDAExecutionProvider, CPUExecutionProvider) or cpu for Python models."
    )
    models: list[ModelHealth] = Field(description="Every model version this worker serves.")
    workers: dict[str, Any] | None = Field(
        default=None,
        description="Under Gunicorn: workers accepting connections (total) and of them "
        "ready; loading/failed counts and each failed worker's last load error when any.",
    )


class ErrorBody(BaseModel):
    code: str = Field(description="Stable machine-readable code, e.g. invalid_input.")
    message: str
    details: list[dict[str, Any]] = Field(default_factory=list)


class ErrorResponse(BaseModel):
    """The one error shape: ``{"error": {"code", "message", "details"}}``."""

    error: ErrorBody


def _loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


def _union_branch(loc: tuple[int | str, ...]) -> str | None:
    """The union member a location passes through (pydantic names it by its type, such as
    ``list[list[float]]``), or None."""
    return next((p for p in loc if isinstance(p, str) and "[" in p), None)


def _relevant(errors: list[Any]) -> list[Any]:
    """For a union field, the errors of the member the input got furthest into (a list of
    lists with one bad value fails deeper in ``list[list[float]]`` than in
    ``list[dict[str, float]]``), with the member names dropped from their locations."""
    branches: dict[str | None, list[Any]] = {}
    for err in errors:
        branches.setdefault(_union_branch(err["loc"]), []).append(err)
    if len(branches) > 1:
        errors = max(branches.values(), key=lambda errs: max(len(e["loc"]) for e in errs))
    for err in errors:
        err["loc"] = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))
    return errors


M = TypeVar("M", bound=BaseModel)


def parse_body(model: type[M], body: bytes) -> M:
    """Validate raw JSON ``body`` bytes into ``model`` in one pass.

    :raises MalformedJSON: (400) when ``body`` is not JSON.
    :raises InvalidInput: (422) when it does not match ``model``; ``details`` name each
        location as ``instances[3][5]``.
    """
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        if errors[0]["type"] == "json_invalid":
            raise MalformedJSON(f"request body is not valid JSON: {errors[0]['msg']}") from None
        errors = _relevant(errors)
        details = [
            {"loc": _loc(err["loc"]), "msg": err["msg"], "type": err["type"]}
            for err in errors[:MAX_ERROR_DETAILS]
        ]
        first = details[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise InvalidInput(f"{first['loc']}: {first['msg']}{more}", details) from None
