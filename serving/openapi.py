"""The OpenAPI 3.1 document of the service, built from the Pydantic models the blueprints
validate with, so the document and the validation cannot drift apart.

Each blueprint module lists its routes as ``OPERATIONS`` (method, path template, request
and response models per status); ``build_document`` turns them into one document, with
every model once under ``components/schemas`` (``pydantic.json_schema.models_json_schema``).
A test checks that every Flask route has an operation and the other way round.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

__all__ = ["Operation", "build_document", "errors"]

#: Standard descriptions of the statuses the service answers.
STATUS_TEXT = {
    200: "OK",
    400: "Malformed or unreadable body",
    401: "Missing or wrong API key",
    404: "Unknown model or route",
    408: "The request took longer than SERVING_REQUEST_TIMEOUT_MS to arrive",
    409: "The pinned model version is not served here",
    413: "Body or instance count over the limit",
    415: "Unsupported Content-Type",
    422: "The body is not a valid request (error names the instance and feature)",
    500: "The model failed on this request's instances",
    503: "Not ready (loading, stopping) or overloaded; retry (Retry-After)",
    504: "No answer within SERVING_REQUEST_TIMEOUT_MS",
}


@dataclass(frozen=True)
class Operation:
    """One route of one blueprint, as the OpenAPI document shows it.

    :param path: OpenAPI template (``/v2/models/{model_name}/infer``); Flask's
        ``<model_name>`` converters map to ``{model_name}``.
    :param responses: status -> response body model (``None``: no JSON body, e.g. the
        Prometheus text of ``/metrics``, described by ``text_responses``).
    :param request: the JSON request body's model, if any.
    :param text_request_media_types: other media types the request body may have, whose
        body is text (``text/csv``), not ``request``'s JSON.
    :param descriptions: status -> description where ``STATUS_TEXT``'s does not fit the
        route (a KServe V2 health route's 400 means "false").
    :param traced: False for a probe or a scrape (health, readiness, ``/metrics``): no
        trace span, whatever the caller samples (every few seconds from each prober).
    """

    method: Literal["get", "post"]
    path: str
    summary: str
    responses: Mapping[int, type[BaseModel] | None]
    request: type[BaseModel] | None = None
    tag: str = "service"
    request_media_types: tuple[str, ...] = ("application/json",)
    #: Text bodies the route also takes (``text/csv``), documented as strings.
    text_request_media_types: tuple[str, ...] = ()
    text_responses: Mapping[int, str | tuple[str, ...]] = field(default_factory=dict)
    security: bool = True
    descriptions: Mapping[int, str] = field(default_factory=dict)
    traced: bool = True


def errors(model: type[BaseModel], *statuses: int) -> dict[int, type[BaseModel] | None]:
    """``{status: model}`` for each error status of a route."""
    return dict.fromkeys(statuses, model)


def build_document(
    operations: Iterable[Operation],
    *,
    title: str,
    version: str,
    api_keys: bool,
    instances: dict[str, dict[str, Any]] | None = None,
    examples: Mapping[str, Any] | None = None,
    parameters: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``operations``.

    :param api_keys: document the ``Authorization: Bearer`` / ``X-API-Key`` schemes on
        every operation with ``security`` (``SERVING_API_KEYS`` is set).
    :param instances: JSON Schemas of the served models' instances, by component name
        (``serving.model.schema.instance_json_schema``), added under ``components/schemas``.
    :param examples: path -> an example JSON request body for that path's POST operation
        (what Swagger UI's "Try it out" sends).
    :param parameters: path parameter name -> the example value it is prefilled with
        (``model_name``: the default model's).
    """
    operations = list(operations)
    keyed: list[tuple[tuple[str, JsonSchemaMode], type[BaseModel]]] = []
    for op in operations:
        if op.request is not None:
            keyed.append(((op.request.__name__, "validation"), op.request))
        for model in op.responses.values():
            if model is not None:
                keyed.append(((model.__name__, "serialization"), model))
    unique = {key: model for key, model in keyed}
    refs, schemas = models_json_schema(
        [(model, mode) for (_, mode), model in unique.items()],
        ref_template="#/components/schemas/{model}",
    )
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        example = (examples or {}).get(op.path)
        paths.setdefault(op.path, {})[op.method] = _path_item(
            op, refs, api_keys, example, parameters or {}
        )
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": paths,
        "components": {"schemas": {**schemas.get("$defs", {}), **(instances or {})}},
    }
    if api_keys:
        document["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"},
            "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
        }
    return document


def _path_item(
    op: Operation,
    refs: Mapping[Any, Any],
    api_keys: bool,
    example: Any = None,
    examples: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """One operation's OpenAPI object: summary, id, path parameters (with an example from
    ``examples`` by name), request body (with ``example`` when given), responses per
    status and, with API keys, its security."""
    item: dict[str, Any] = {
        "summary": op.summary,
        "operationId": _operation_id(op),
        "tags": [op.tag],
        "responses": {},
    }
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        | ({"example": (examples or {})[name]} if name in (examples or {}) else {})
        for name in re.findall(r"{(\w+)}", op.path)
    ]
    if parameters:
        item["parameters"] = parameters
    if op.request is not None:
        content = {
            media: {"schema": refs[(op.request, "validation")]} for media in op.request_media_types
        }
        content |= {media: {"schema": {"type": "string"}} for media in op.text_request_media_types}
        if example is not None and "application/json" in content:
            content["application/json"]["example"] = example
        item["requestBody"] = {"required": True, "content": content}
    for status, model in sorted(op.responses.items()):
        text = op.descriptions.get(status) or STATUS_TEXT.get(status, str(status))
        response: dict[str, Any] = {"description": text}
        if model is not None:
            response["content"] = {"application/json": {"schema": refs[(model, "serialization")]}}
        elif status in op.text_responses:
            types = op.text_responses[status]
            types = (types,) if isinstance(types, str) else types
            response["content"] = {media: {"schema": {"type": "string"}} for media in types}
        item["responses"][str(status)] = response
    if api_keys and op.security:
        item["security"] = [{"bearer": []}, {"apiKey": []}]
    return item


def _operation_id(op: Operation) -> str:
    words = re.sub(r"[{}]", "", op.path).replace(":", "/").strip("/").split("/")
    slash = "_slash" if op.path.endswith("/") and op.path != "/" else ""
    return (
        op.method + "_" + "_".join(w.replace("-", "_").replace(".", "_") for w in words if w)
    ) + slash
