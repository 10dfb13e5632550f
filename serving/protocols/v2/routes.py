"""Open Inference Protocol (KServe V2) over REST: ``/v2/...``, as Triton clients speak it.

Inference goes the same way as ``/predict``: ``codec.decode`` turns the input tensors into
``Tensors``, ``DataPlane.infer`` checks them against the model and queues them on its
batcher, so V2 and ``/predict`` requests are merged into the same predict calls. The
binary tensor data extension is supported both ways; so are Triton's statistics
(``serving.protocols.v2.stats``, summed over all workers), model configuration and model
repository index (``serving.protocols.v2.repository``) extensions.

Status codes: 400 for every invalid request (the protocol defines no other; our 422
``invalid_input`` answers 400 here, same ``code``), 404 unknown model, 409 a version not
served here, 413 over a size limit, 503 not ready or overloaded, 504 timeout, 500 the model
failed. Health and readiness are 200 for true and 400 for false, as Triton answers. Error
bodies are the protocol's ``{"error": "<message>"}`` plus our ``"code"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from flask import Blueprint, Response, request

from serving import __version__
from serving.context import CLOSE_CONNECTION, Call
from serving.dataplane import DataPlane
from serving.errors import InvalidInput, ServingError
from serving.model.handle import ModelHandle, TensorSpec
from serving.openapi import Operation, errors
from serving.protocols.base import (
    Answer,
    ErrorStyle,
    Example,
    ProtocolSpec,
    Route,
    dataplane,
    json_answer,
    json_response,
    model_before_body,
)
from serving.protocols.bodies import read_body
from serving.protocols.schemas import parse_body
from serving.protocols.v2.codec import (
    HEADER_LENGTH,
    datatype_of,
    decode,
    encode_outputs,
    names_before_values,
    split_body,
)
from serving.protocols.v2.repository import (
    V2LoadRequest,
    V2ModelConfig,
    V2RepositoryIndex,
    V2RepositoryIndexRequest,
    V2UnloadRequest,
    model_config,
    platform_of,
    repository_index,
)
from serving.protocols.v2.schemas import (
    V2Error,
    V2InferRequest,
    V2InferResponse,
    V2Live,
    V2ModelMetadata,
    V2ModelReady,
    V2Ready,
    V2ServerMetadata,
)
from serving.protocols.v2.stats import V2InferenceStatistics, model_statistics
from serving.repository import ModelConfig, overridden
from serving.server import control
from serving.server.board import installed_board, readiness

__all__ = ["EXTENSIONS", "OPERATIONS", "PROTOCOL", "bp"]

bp = Blueprint("v2", __name__)

#: Protocol extensions this server implements (``GET /v2``).
EXTENSIONS = ["binary_tensor_data", "statistics", "model_configuration", "model_repository"]

_MODEL = "/v2/models/{model_name}"
_VERSION = "/v2/models/{model_name}/versions/{model_version}"
_FALSE = {400: "False (not live, not ready)"}

OPERATIONS = [
    Operation("get", "/v2", "Server metadata: name, version, extensions",
              {200: V2ServerMetadata} | errors(V2Error, 401), tag="kserve-v2"),
    Operation("get", "/v2/health/live", "Liveness: 200 live, 400 only a restart helps",
              {200: V2Live, 400: V2Live}, tag="kserve-v2", security=False, descriptions=_FALSE,
              traced=False),
    Operation("get", "/v2/health/ready", "Readiness: 200 when every model is ready, else 400",
              {200: V2Ready, 400: V2Ready}, tag="kserve-v2", security=False, descriptions=_FALSE,
              traced=False),
    *[
        Operation("get", path, "Model metadata: versions, platform, inputs and outputs",
                  {200: V2ModelMetadata} | errors(V2Error, 401, 404, 409, 503), tag="kserve-v2")
        for path in (_MODEL, _VERSION)
    ],
    *[
        Operation("get", f"{path}/ready", "Model readiness: 200 ready, 400 not (yet)",
                  {200: V2ModelReady, 400: V2ModelReady} | errors(V2Error, 401, 404, 409),
                  tag="kserve-v2", descriptions=_FALSE, traced=False)
        for path in (_MODEL, _VERSION)
    ],
    *[
        Operation("post", f"{path}/infer", "Inference (JSON tensors, or the binary tensor data "
                  "extension: a JSON header of Inference-Header-Content-Length bytes, then "
                  "raw tensors)",
                  {200: V2InferResponse}
                  | errors(V2Error, 400, 401, 404, 408, 409, 413, 500, 501, 503, 504),
                  request=V2InferRequest, tag="kserve-v2",
                  descriptions={400: "Invalid request (the error names the input)"})
        for path in (_MODEL, _VERSION)
    ],
    *[
        Operation("get", f"{path}/stats", "Statistics extension: request counts and cumulative "
                  "ns per stage, and predict calls by batch size, summed over all workers",
                  {200: V2InferenceStatistics} | errors(V2Error, 401, 404, 409), tag="kserve-v2")
        for path in ("/v2/models", _MODEL, _VERSION)
    ],
    *[
        Operation("get", f"{path}/config", "Model configuration extension: max batch size, "
                  "inputs and outputs, dynamic batching (Triton's ModelConfig JSON)",
                  {200: V2ModelConfig} | errors(V2Error, 401, 404, 409, 503), tag="kserve-v2")
        for path in (_MODEL, _VERSION)
    ],
    Operation("post", "/v2/repository/index", "Model repository extension: every model version "
              "and its state (READY, LOADING, UNAVAILABLE, UNLOADING)",
              {200: V2RepositoryIndex} | errors(V2Error, 400, 401, 413, 501),
              request=V2RepositoryIndexRequest, tag="kserve-v2"),
    Operation("post", "/v2/repository/models/{model_name}/load", "Model repository "
              "extension: serve the model (again, with its versions now, or with "
              "parameters.config); answers once every worker serves it. "
              "SERVING_MODEL_CONTROL=explicit only",
              {200: None} | errors(V2Error, 400, 401, 404, 409, 413, 501, 503, 504),
              request=V2LoadRequest, tag="kserve-v2",
              descriptions={400: "Invalid request, or the model could not be loaded (the "
                            "server serves on as before)",
                            409: "Model control is not explicit"}),
    Operation("post", "/v2/repository/models/{model_name}/unload", "Model repository "
              "extension: stop serving the model; answers once no worker serves it. "
              "SERVING_MODEL_CONTROL=explicit only",
              {200: None} | errors(V2Error, 400, 401, 404, 409, 413, 501, 503, 504),
              request=V2UnloadRequest, tag="kserve-v2",
              descriptions={409: "Model control is not explicit, or it is the last model "
                            "served"}),
]  # fmt: skip


def _error_body(
    status: int, code: str, message: str, details: list[dict[str, Any]]
) -> dict[str, Any]:
    return {"error": message, "code": code}


@bp.get("/v2")
def server_metadata() -> Response:
    return json_response({"name": "serving", "version": __version__, "extensions": EXTENSIONS})


@bp.get("/v2/health/live")
def live() -> Response:
    """As ``/livez``: false only once a model's runtime has failed (only a restart helps)."""
    alive = dataplane().models.state != "failed"
    return json_response({"live": alive}, 200 if alive else 400)


@bp.get("/v2/health/ready")
def ready() -> Response:
    """As ``/healthz``: true only when every worker has every model ready."""
    is_ready, _ = readiness(dataplane().models.state)
    return json_response({"ready": is_ready}, 200 if is_ready else 400)


@bp.get("/v2/models/<model_name>", defaults={"model_version": None})
@bp.get("/v2/models/<model_name>/versions/<model_version>")
def model_metadata(model_name: str, model_version: str | None) -> Response:
    """:raises ModelNotFound: (404). :raises VersionConflict: (409). :raises NotReady: (503)
    while the model loads (its inputs and outputs are known once it is loaded)."""
    plane = dataplane()
    runtime, handle = plane.ready(model_name, model_version)
    specs = handle.input_specs()
    names = _feature_names(specs, handle.feature_names)
    body = {
        "name": handle.name,
        "versions": plane.models.versions(handle.name),
        "platform": platform_of(handle),
        "inputs": [_tensor(spec, share) for spec, share in zip(specs, names, strict=True)],
        "outputs": [_tensor(spec, None) for spec in runtime.outputs],
    }
    return json_response(body)


def _tensor(spec: TensorSpec, feature_names: list[str] | None) -> dict[str, Any]:
    tensor: dict[str, Any] = {
        "name": spec.name, "datatype": datatype_of(spec.dtype), "shape": list(spec.shape)
    }  # fmt: skip
    if feature_names is not None:
        tensor["parameters"] = {"feature_names": feature_names}
    return tensor


def _feature_names(
    specs: tuple[TensorSpec, ...], names: tuple[str, ...] | None
) -> list[list[str] | None]:
    """Each input's share of the model's feature names (its ``width`` columns, in order)."""
    if names is None:
        return [None] * len(specs)
    if len(specs) == 1:
        return [list(names)]
    widths = [spec.width for spec in specs]
    if -1 in widths or sum(widths) != len(names):
        return [None] * len(specs)
    starts = [sum(widths[:k]) for k in range(len(widths))]
    return [list(names[start : start + width]) for start, width in zip(starts, widths, strict=True)]


@bp.get("/v2/models/<model_name>/ready", defaults={"model_version": None})
@bp.get("/v2/models/<model_name>/versions/<model_version>/ready")
def model_ready(model_name: str, model_version: str | None) -> Response:
    runtime = dataplane().models.resolve(model_name, model_version)
    is_ready = runtime.state == "ready"
    body = {"name": runtime.model_name, "ready": is_ready}
    return json_response(body, 200 if is_ready else 400)


def infer(
    plane: DataPlane,
    call: Call,
    environ: Mapping[str, Any],
    *,
    model_name: str,
    model_version: str | None = None,
) -> Answer:
    """One inference request: JSON, or JSON header + binary tensors (any Content-Type, as
    tritonclient sends none; the body size limit is ``SERVING_MAX_BODY_BYTES`` either way).

    :raises InvalidInput: (400 here) naming the input or output that is wrong.
    :raises UnreadableBody: (400) for a compressed body (Content-Encoding is not supported).
    """
    body: V2InferRequest | None = None
    try:
        header, binary = split_body(
            read_body(environ, plane.settings), environ.get(_HEADER_LENGTH_KEY)
        )
        body = parse_body(V2InferRequest, header)
        wanted = [out.name for out in body.outputs] if body.outputs else None
        inputs = decode(body, binary, plane.settings.max_instances_per_request)
    except ServingError as exc:
        model_before_body(plane, model_name, model_version)
        handle = plane.models.resolve(model_name, model_version).handle
        if body is not None and isinstance(exc, InvalidInput) and handle is not None:
            names_before_values(body, handle, plane.rules)  # as good values would get
        raise
    answer = plane.infer(call, model_name, model_version, inputs, outputs=wanted)
    binary_default = bool(body.parameters and body.parameters.binary_data_output)
    tensors, tail = encode_outputs(answer.outputs, body.outputs, binary_default)
    return _infer_answer(answer.handle, body.id, tensors, tail)


#: The WSGI environ key of the binary extension's header length.
_HEADER_LENGTH_KEY = "HTTP_" + HEADER_LENGTH.upper().replace("-", "_")


def _infer_answer(
    handle: ModelHandle, request_id: str | None, tensors: list[dict[str, Any]], tail: bytes
) -> Answer:
    body: dict[str, Any] = {"model_name": handle.name, "model_version": handle.version}
    if request_id is not None:
        body["id"] = request_id
    body["outputs"] = tensors
    if not any("parameters" in tensor for tensor in tensors):
        return json_answer(body)
    header = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
    headers = ((HEADER_LENGTH, str(len(header))),)
    return Answer(header + tail, content_type="application/octet-stream", headers=headers)


@bp.get("/v2/models/stats", defaults={"model_name": None, "model_version": None})
@bp.get("/v2/models/<model_name>/stats", defaults={"model_version": None})
@bp.get("/v2/models/<model_name>/versions/<model_version>/stats")
def statistics(model_name: str | None, model_version: str | None) -> Response:
    """Every model version's statistics, or those of ``model_name`` (each version, or
    ``model_version``), summed over all workers (``serving.protocols.v2.stats``).

    :raises ModelNotFound: (404). :raises VersionConflict: (409).
    """
    plane = dataplane()
    models = plane.models
    if model_name is None:
        wanted = [(r.model_name, r.model_version) for r in models.runtimes]
    elif model_version is None:
        models.resolve(model_name)  # 404 when not served
        wanted = [(model_name, version) for version in models.versions(model_name)]
    else:
        runtime = models.resolve(model_name, model_version)
        wanted = [(runtime.model_name, runtime.model_version)]
    stats = model_statistics(plane.metrics.collect(), wanted)
    return json_response({"model_stats": stats})


@bp.get("/v2/models/<model_name>/config", defaults={"model_version": None})
@bp.get("/v2/models/<model_name>/versions/<model_version>/config")
def configuration(model_name: str, model_version: str | None) -> Response:
    """:raises ModelNotFound: (404). :raises VersionConflict: (409). :raises NotReady: (503)
    while the model loads (its inputs and outputs are known once it is loaded)."""
    plane = dataplane()
    runtime, handle = plane.ready(model_name, model_version)
    return json_response(model_config(runtime, handle, plane.settings.workers))


@bp.post("/v2/repository/index", provide_automatic_options=False)
def repository() -> Response:
    """Every model version served; the optional body ``{"ready": true}`` keeps the ready
    ones. tritonclient sends no body and no Content-Type.

    :raises InvalidInput: (400 here) for a body that is not ``{"ready": bool}``.
    """
    plane = dataplane()
    body = read_body(request.environ, plane.settings)
    wanted = parse_body(V2RepositoryIndexRequest, body) if body else None
    refused = control.explain(installed_board(), plane.models.refused)
    index = repository_index(plane.models, bool(wanted and wanted.ready), refused)
    data = orjson.dumps(index)
    return Response(data, mimetype="application/json")


@bp.post("/v2/repository/models/<model_name>/load", provide_automatic_options=False)
def load(model_name: str) -> Response:
    """Serve ``model_name`` of the repository, with ``parameters.config`` when sent (the
    ``config.json`` fields but ``class``, ``format`` and ``sha256``, which only the file
    sets).

    :raises ControlRefused: (409) unless ``SERVING_MODEL_CONTROL=explicit``. :raises
        InvalidInput: (400) a body or config that is not valid. :raises ModelNotFound,
        LoadFailed, ControlTimeout: as ``serving.server.control.load``.
    """
    settings = dataplane().settings
    body = read_body(request.environ, settings)
    wanted = parse_body(V2LoadRequest, body) if body else None
    text = wanted.parameters.config if wanted and wanted.parameters else None
    config = None
    if text is not None:
        try:
            config = orjson.loads(text)
        except orjson.JSONDecodeError:
            raise InvalidInput.at("parameters.config", "not JSON", "value_error") from None
        try:
            overridden(ModelConfig(), config)  # the fields it may set, valid
        except ValueError as exc:
            message = str(exc).removeprefix("parameters.config: ")
            raise InvalidInput.at("parameters.config", message, "value_error") from None
    request.environ[CLOSE_CONNECTION] = True  # this worker may be on its way out
    control.load(settings, model_name, config)
    return Response(b"", 200)


@bp.post("/v2/repository/models/<model_name>/unload", provide_automatic_options=False)
def unload(model_name: str) -> Response:
    """Stop serving ``model_name``.

    :raises ControlRefused: (409) unless ``SERVING_MODEL_CONTROL=explicit``, or for the
        last model served. :raises InvalidInput: (400) a body that is not valid.
    """
    settings = dataplane().settings
    body = read_body(request.environ, settings)
    if body:
        parse_body(V2UnloadRequest, body)
    request.environ[CLOSE_CONNECTION] = True
    control.unload(settings, model_name)
    return Response(b"", 200)


#: Errors as ``{"error": message, "code"}``; every invalid request is a 400 (Triton's).
PROTOCOL = ProtocolSpec(
    bp,
    OPERATIONS,
    ErrorStyle(_error_body, invalid_input_status=400),
    ("/v2/",),
    routes=(
        Route("/v2/models/<model_name>/infer", infer),
        Route("/v2/models/<model_name>/versions/<model_version>/infer", infer),
    ),
    examples=lambda example: {
        path: infer_example(example) for path in (f"{_MODEL}/infer", f"{_VERSION}/infer")
    },
)


def infer_example(example: Example) -> dict[str, Any]:
    """A V2 infer body of ``example``: the model's one tensor of every feature
    (``[1, n_features]``), or one ``[1]`` tensor per feature when their types differ."""
    specs = example.handle.input_specs()
    if len(specs) == 1:
        spec = specs[0]
        shape = [1, len(example.values)] if len(spec.shape) > 1 else [1]
        tensors = [(spec, shape, example.values)]
    else:
        tensors = [(spec, [1], [value]) for spec, value in zip(specs, example.values, strict=True)]
    return {"inputs": [
        {"name": spec.name, "shape": shape, "datatype": datatype_of(spec.dtype), "data": data}
        for spec, shape, data in tensors
    ]}  # fmt: skip
