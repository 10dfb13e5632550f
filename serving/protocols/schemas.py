"""Bodies every protocol shares (pydantic v2): ``parse_body``, the service's error shape,
and the probes' responses. Each protocol's own bodies are in its ``schemas.py``.

Requests are validated straight from the raw body bytes (``model_validate_json``): the
envelope strictly (unknown fields are refused, so a typo such as ``instance`` is a 422,
not silently ignored), the instances' values (``Value``) only as JSON scalars: they are
checked against the model's input schema by ``serving.inputs.conform``, which stops at the first
bad value (pydantic would collect an error per value: 6 s of CPU and 4 GB for a body of
500,000 wrong values). JSON integers stay Python ints, so int64 values are exact.

Validation stops at the first error, as ``conform`` does: pydantic otherwise makes one
error per bad element and per union branch (a million bare numbers as ``instances``:
2 million errors, 14-39 s and up to 2.3 GB before the 422). So every list and dict of a
request is ``fail_fast`` (``Rows``, ``Objects``), unions are tried left to right (each
branch stops at its first bad element), and the first unknown field ends validation
(``Strict``) rather than one error per key.
Responses on the hot path are serialized with orjson from plain dicts; the response
models below document them (and tests validate real responses against them).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Self, TypeVar

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    model_validator,
)
from pydantic_core import PydanticCustomError

from serving.errors import InvalidInput, MalformedJSON

__all__ = [
    "ErrorBody",
    "ErrorResponse",
    "HealthResponse",
    "LivenessResponse",
    "OpenAPIDocument",
    "Objects",
    "Rows",
    "Strict",
    "Value",
    "parse_body",
]

#: One value of an instance, as JSON has it: a number, a string, a boolean or null
#: (missing). Its type is checked against the model's schema by ``serving.inputs.conform``.
Value = Annotated[Any, WithJsonSchema({"type": ["number", "string", "boolean", "null"]})]

#: At most this many error details are returned; the message says how many there were.
MAX_ERROR_DETAILS = 20


#: One list of values per instance (row-major); validation stops at the first entry that
#: is not a list (``fail_fast``). In a union, give the field ``union_mode="left_to_right"``:
#: each branch then stops at its first bad entry, one error per branch in all.
Rows = Annotated[list[list[Value]], Field(fail_fast=True)]
#: One object per instance keyed by name; validation stops at the first that is not one.
Objects = Annotated[list[dict[str, Value]], Field(fail_fast=True)]


class Strict(BaseModel):
    """Strict JSON: numbers are finite JSON numbers, unknown fields are refused: the first
    one, once the known fields are valid (``extra="forbid"`` would make an error of each
    unknown key: 300,000 for a 3 MB body, 7 s and 240 MB)."""

    model_config = ConfigDict(
        strict=True,
        extra="allow",
        allow_inf_nan=False,
        protected_namespaces=(),
        json_schema_extra={"additionalProperties": False},
    )

    @model_validator(mode="after")
    def _refuse_unknown_fields(self) -> Self:
        if self.model_extra:
            name = next(iter(self.model_extra))
            raise PydanticCustomError(
                "extra_forbidden", "Extra inputs are not permitted", {"field": name}
            )
        return self


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
    max_queue_depth: int
    execution_provider: str | None
    engine: str | None = Field(
        None,
        description="What answers once loaded: onnxruntime (an ONNX model, or a scikit-learn "
        "model compiled to it: SERVING_COMPILE), else the model's library (sklearn, "
        "xgboost, lightgbm) or python.",
    )


class HealthResponse(BaseModel):
    """``GET /healthz``: 200 only when ``status`` is ``ready``, 503 otherwise.

    With API keys configured and none presented, only ``status`` and ``workers`` (counts,
    no ``errors``); every other field needs a key.
    """

    model_config = ConfigDict(protected_namespaces=())

    status: Literal["loading", "ready", "failed", "stopping"]
    model_name: str | None = None
    model_version: str | None = None
    queue_depth: int | None = Field(
        None, description="Instances queued in the default model's batcher."
    )
    max_queue_depth: int | None = Field(
        None,
        description="The default model's queue limit; past it requests get 503 overloaded "
        "(each model has its own: see models).",
    )
    execution_provider: str | None = Field(
        None,
        description="Where the model runs once loaded: ONNX Runtime's provider "
        "(CUDAExecutionProvider, CPUExecutionProvider) or cpu for Python models.",
    )
    models: list[ModelHealth] | None = Field(
        None, description="Every model version this worker serves."
    )
    workers: dict[str, Any] | None = Field(
        default=None,
        description="Under Gunicorn: workers accepting connections (total) and of them "
        "ready; loading/failed counts and, with a key, each failed worker's last load error.",
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
    ``list[dict[str, float]]``; as deep, further along the list: objects with one list
    among them fail at the list as objects, at the first object as lists), with the
    member names dropped from their locations."""
    branches: dict[str | None, list[Any]] = {}
    for err in errors:
        branches.setdefault(_union_branch(err["loc"]), []).append(err)
    if len(branches) > 1:
        errors = max(branches.values(), key=_reach)
    for err in errors:
        err["loc"] = tuple(p for p in err["loc"] if not (isinstance(p, str) and "[" in p))
        if err["type"] == "extra_forbidden" and "field" in err.get("ctx", {}):
            err["loc"] = (*err["loc"], err["ctx"]["field"])  # named by ``Strict``
    return errors


def _reach(errors: list[Any]) -> tuple[int, tuple[int, ...]]:
    """How far into the input a union member's errors got: their depth, then their
    positions (the indexes in their locations)."""
    deepest = max(errors, key=lambda e: len(e["loc"]))
    return len(deepest["loc"]), tuple(p for p in deepest["loc"] if isinstance(p, int))


M = TypeVar("M", bound=BaseModel)

#: Where a body holding one of these fields goes, for a route that does not know them.
_ELSEWHERE = {
    "dataframe_split": "MLflow's body: POST it to /invocations",
    "dataframe_records": "MLflow's body: POST it to /invocations",
    "inputs": "KServe V2's or TF Serving's body: POST it to /v2/models/{name}/infer or "
    "/v1/models/{name}:predict",
    "instances": "the body of /predict, or TF Serving's /v1/models/{name}:predict",
}
#: Most unknown field names said in a message.
_MAX_NAMED = 5


def _unknown_fields(model: type[BaseModel], body: bytes) -> str:
    """``; given but unknown: 'a', 'b'`` (and where such a body goes) for the top-level
    fields of the JSON object ``body`` that ``model`` does not have; empty when none."""
    try:
        given = orjson.loads(body)
    except orjson.JSONDecodeError:
        return ""
    if not isinstance(given, dict):
        return ""
    unknown = [name for name in given if name not in model.model_fields]
    if not unknown:
        return ""
    named = ", ".join(repr(name[:64]) for name in unknown[:_MAX_NAMED])
    more = f" (and {len(unknown) - _MAX_NAMED} more)" if len(unknown) > _MAX_NAMED else ""
    hint = next((_ELSEWHERE[name] for name in unknown if name in _ELSEWHERE), None)
    return f"; given but unknown: {named}{more}" + (f" ({hint})" if hint else "")


def _fields_taken(model: type[BaseModel], unknown: Any) -> str:
    """`` (the body's fields: 'a', 'b')`` for a body holding the field ``unknown``, and
    where a pandas DataFrame's ``to_json(orient="split")`` goes when it looks like one."""
    fields = ", ".join(repr(name) for name in model.model_fields)
    split = unknown in ("columns", "index", "data") and "dataframe_split" in model.model_fields
    hint = "; a DataFrame's to_json(orient='split') goes under 'dataframe_split'" if split else ""
    return f" (the body's fields: {fields}{hint})"


def _message(error: Any) -> str:
    """pydantic's message, in the service's words where they are unclear."""
    ctx, loc = error.get("ctx") or {}, error.get("loc", ())
    forms = {"dict_type": "an object", "list_type": "a list"}
    rows = len(loc) == 2 and loc[0] in ("instances", "dataframe_records")
    if error["type"] in forms and rows and isinstance(loc[1], int) and loc[1] > 0:
        form = forms[error["type"]]  # the form the union took from the first item
        return (
            f"not {form}, as {loc[0]}[0] is: every instance of one request takes the form "
            "of the first"
        )
    if error["type"] == "too_short" and "min_length" in ctx:
        least = ctx["min_length"]
        return f"needs at least {least} item{'s' if least != 1 else ''}, got {ctx['actual_length']}"
    return str(error["msg"])


def parse_body(model: type[M], body: bytes) -> M:
    """Validate raw JSON ``body`` bytes into ``model`` in one pass.

    :raises MalformedJSON: (400) when ``body`` is not JSON.
    :raises InvalidInput: (422) when it does not match ``model``; ``details`` name each
        location as ``instances[3][5]``; for an integer too long to parse (JSON sets no
        limit) as for ``1e309``: a value that does not fit.
    """
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        if errors[0]["type"] == "json_invalid" and "number out of range" in errors[0]["msg"]:
            raise _too_long(body) from None
        if errors[0]["type"] == "json_invalid":
            raise MalformedJSON(f"request body is not valid JSON: {errors[0]['msg']}") from None
        errors = _relevant(errors)
        details = [
            {"loc": _loc(err["loc"]), "msg": _message(err), "type": err["type"]}
            for err in errors[:MAX_ERROR_DETAILS]
        ]
        first = details[0]
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        if len(errors[0]["loc"]) == 1:  # a field of the body
            if errors[0]["type"] == "missing":
                more += _unknown_fields(model, body)  # error path only: parsed once more
            elif errors[0]["type"] == "extra_forbidden":
                more += _fields_taken(model, errors[0]["loc"][0])
        raise InvalidInput(f"{first['loc']}: {first['msg']}{more}", details) from None


#: Most digits of an integer the JSON parser reads (Python's ``int(str)`` limit).
_MAX_DIGITS = 4300
_TOO_LONG = object()


def _too_long(body: bytes) -> InvalidInput:
    """The ``InvalidInput`` for a body holding an integer of more than 4,300 digits, at
    its location: the body is parsed once more (the error path only) with the standard
    library, which hands each integer's digits to a hook instead of converting them."""
    msg = "an integer of more than 4,300 digits does not fit a number (nor does 1e309)"
    loc = "body"
    try:
        document = json.loads(
            body, parse_int=lambda digits: _TOO_LONG if len(digits.lstrip("-")) > _MAX_DIGITS else 0
        )
        path = _path_to(document, _TOO_LONG)
        if path is not None:
            loc = _loc(path)
    except (ValueError, RecursionError):
        pass
    return InvalidInput(f"{loc}: {msg}", [{"loc": loc, "msg": msg, "type": "finite_number"}])


def _path_to(document: Any, target: object) -> tuple[int | str, ...] | None:
    """The location of the first ``target`` in a parsed JSON ``document`` (keys and
    indexes), or None; iterative, so no nesting depth recurses."""
    stack: list[tuple[Any, tuple[int | str, ...]]] = [(document, ())]
    while stack:
        node, path = stack.pop()
        if node is target:
            return path
        if isinstance(node, dict):
            stack.extend((value, (*path, key)) for key, value in reversed(node.items()))
        elif isinstance(node, list):
            stack.extend((value, (*path, i)) for i, value in reversed(list(enumerate(node))))
    return None
