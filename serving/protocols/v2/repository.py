"""KServe V2 model configuration and repository extensions, as Triton serves them.

``GET /v2/models/{name}[/versions/{v}]/config`` answers the model's configuration in
Triton's ``ModelConfig`` JSON: ``max_batch_size``, each input and output with its
``data_type`` and ``dims`` (the batch axis left out, as Triton does when
``max_batch_size > 0``), ``dynamic_batching`` (``max_queue_delay_microseconds`` is
``SERVING_MAX_BATCH_LATENCY_MS`` under the window policy, 0 under the adaptive one;
``max_queue_size`` is ``SERVING_MAX_QUEUE_DEPTH`` in instances) and one CPU or GPU
``instance_group`` per Gunicorn worker. ``POST /v2/repository/index`` lists every model
version with its state, and after them each entry of a model repository
(``SERVING_MODEL_REPOSITORY``) that cannot be served, ``UNAVAILABLE`` with the reason
(``unloaded`` for a model explicit control does not serve).
``POST /v2/repository/models/{name}/load`` and ``/unload`` change which models a
repository serves under ``SERVING_MODEL_CONTROL=explicit`` (``serving.server.control``);
``parameters.config``, a JSON string of ``config.json`` fields, replaces the model's
file for that load, as Triton's config override does. Source: Triton's
``docs/protocol/extension_model_configuration.md`` and ``extension_model_repository.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, RootModel

from serving.cache import ModelCache
from serving.model.handle import ModelHandle, TensorSpec
from serving.protocols.schemas import Strict
from serving.protocols.v2.codec import datatype_of
from serving.repository import Refusal
from serving.runtime import ModelRuntime

__all__ = [
    "V2LoadRequest",
    "V2ModelConfig",
    "V2RepositoryIndex",
    "V2RepositoryIndexRequest",
    "V2RepositoryModel",
    "V2UnloadRequest",
    "model_config",
    "repository_index",
]

#: Our runtime states as Triton's model repository names them.
_STATES = {"ready": "READY", "loading": "LOADING", "failed": "UNAVAILABLE", "stopping": "UNLOADING"}


class V2ConfigTensor(BaseModel):
    name: str
    data_type: str = Field(description="TYPE_FP32, TYPE_INT64, TYPE_STRING...")
    dims: list[int] = Field(description="The shape without the batch axis (-1: open).")


class V2ModelConfig(BaseModel):
    """``GET /v2/models/{model_name}[/versions/{model_version}]/config``: Triton's
    ``ModelConfig`` JSON, the fields this server has."""

    model_config = ConfigDict(extra="allow")

    name: str
    platform: str
    max_batch_size: int = Field(description="Most instances in one predict call.")
    input: list[V2ConfigTensor]
    output: list[V2ConfigTensor]
    dynamic_batching: dict[str, Any]
    instance_group: list[dict[str, Any]]


class V2RepositoryIndexRequest(Strict):
    """``POST /v2/repository/index`` body (optional): ``ready`` lists only ready models."""

    ready: bool | None = None


class V2LoadParameters(Strict):
    config: str | None = Field(
        None,
        description="A JSON string of config.json fields serving the model instead of "
        "its file's (Triton's config override); files are not taken",
    )


class V2LoadRequest(Strict):
    """``POST /v2/repository/models/{model_name}/load`` body (optional)."""

    parameters: V2LoadParameters | None = None


class V2UnloadParameters(Strict):
    unload_dependents: bool | None = Field(
        None, description="Taken and ignored: no model here depends on another"
    )


class V2UnloadRequest(Strict):
    """``POST /v2/repository/models/{model_name}/unload`` body (optional)."""

    parameters: V2UnloadParameters | None = None


class V2RepositoryModel(BaseModel):
    name: str
    version: str
    state: str = Field(description="READY, LOADING, UNAVAILABLE or UNLOADING.")
    reason: str = Field(description="Why it is not ready, when it is not.")
    path: str | None = Field(
        None, description="The file (or folder) the version is served from, when served."
    )
    loaded_at: str | None = Field(
        None, description="When the worker answering loaded it, RFC 3339 UTC; once ready."
    )
    sha256: str | None = Field(
        None,
        description="The SHA-256 of the file's bytes as they were loaded, hex; for a "
        "folder a class reads, of its files' sha256sum lines (docs/repository.md).",
    )
    memory_bytes: int | None = Field(
        None,
        description="Memory the worker answering added loading it (its own copy when it "
        "read the file, compiling, warming up): PSS before and after, bytes.",
    )
    shared_memory_bytes: int | None = Field(
        None,
        description="Memory the master added loading the one copy every worker shares "
        "(PSS before and after), bytes; absent when each worker loads its own.",
    )
    memory_imports: list[str] | None = Field(
        None,
        description="Libraries the worker first imported loading it: their memory, once "
        "per process, is in memory_bytes. Absent when none.",
    )
    shared_memory_imports: list[str] | None = Field(
        None,
        description="Libraries the master first imported loading it: their memory is in "
        "shared_memory_bytes. Absent when none.",
    )


class V2RepositoryIndex(RootModel[list[V2RepositoryModel]]):
    """``POST /v2/repository/index``: each model version served, in configuration order."""


def platform_of(handle: ModelHandle) -> str:
    """The ``platform`` of V2 model metadata and configuration: ``onnxruntime_onnx`` for
    what ONNX Runtime answers (an ONNX model, or one compiled to it), else the format."""
    return "onnxruntime_onnx" if handle.engine == "onnxruntime" else handle.format


def model_config(runtime: ModelRuntime, handle: ModelHandle, workers: int) -> dict[str, Any]:
    """Triton's ``ModelConfig`` of one loaded model version (``workers``: Gunicorn's)."""
    settings = runtime.settings
    delay_us = 0 if settings.batch_policy == "adaptive" else settings.max_batch_latency_ms * 1000
    kind = "KIND_GPU" if handle.device_id is not None else "KIND_CPU"
    group: dict[str, Any] = {"name": handle.name, "kind": kind, "count": workers}
    if handle.device_id is not None:
        group["gpus"] = [handle.device_id]
    return {
        "name": handle.name,
        "platform": platform_of(handle),
        "version_policy": {"specific": {"versions": [handle.version]}},
        "max_batch_size": settings.max_batch_size,
        "input": [_tensor(spec) for spec in handle.input_specs()],
        "output": [_tensor(spec) for spec in runtime.outputs],
        "dynamic_batching": {
            "preferred_batch_size": [settings.max_batch_size],
            "max_queue_delay_microseconds": round(delay_us),
            "preserve_ordering": True,
            "default_queue_policy": {
                "timeout_action": "REJECT",
                "default_timeout_microseconds": round(settings.request_timeout_ms * 1000),
                "allow_timeout_override": False,
                "max_queue_size": settings.max_queue_depth,
            },
        },
        "instance_group": [group],
    }


def _tensor(spec: TensorSpec) -> dict[str, Any]:
    datatype = datatype_of(spec.dtype)
    data_type = "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"
    tensor: dict[str, Any] = {"name": spec.name, "data_type": data_type}
    dims = list(spec.shape[1:])
    if dims:
        tensor["dims"] = dims
    else:  # one value per instance: Triton writes dims [1] reshaped to a scalar
        tensor["dims"] = [1]
        tensor["reshape"] = {"shape": []}
    return tensor


def repository_index(
    models: ModelCache, ready_only: bool, refused: Sequence[Refusal] = ()
) -> list[dict[str, Any]]:
    """Every model version served, in configuration order, with its state, the reason
    it is not ready (``""`` when it is), the path it is served from, the SHA-256 of the
    bytes loaded, when this worker loaded it and the memory that added (here, and in the
    master for its shared copy); then, unless ``ready_only``, each repository
    entry ``refused`` (``Settings.refused_models()``; version ``""`` for a whole model)."""
    index = []
    for runtime in models.runtimes:
        state = runtime.state
        if ready_only and state != "ready":
            continue
        reason = runtime.problem() or (str(runtime.error) if runtime.error is not None else "")
        entry: dict[str, Any] = {
            "name": runtime.model_name,
            "version": runtime.model_version,
            "state": _STATES[state],
            "reason": reason,
        }
        if runtime.settings.path is not None:
            entry["path"] = str(runtime.settings.path)
        if runtime.handle is not None and runtime.handle.sha256 is not None:
            entry["sha256"] = runtime.handle.sha256
        for field in ("memory_bytes", "shared_memory_bytes"):
            if getattr(runtime, field) is not None:
                entry[field] = getattr(runtime, field)
        for field in ("memory_imports", "shared_memory_imports"):
            if getattr(runtime, field):
                entry[field] = list(getattr(runtime, field))
        if runtime.loaded_at is not None:
            when = datetime.fromtimestamp(runtime.loaded_at, UTC)
            entry["loaded_at"] = when.isoformat(timespec="seconds").replace("+00:00", "Z")
        index.append(entry)
    if not ready_only:
        index.extend(
            {"name": r.model, "version": r.version, "state": "UNAVAILABLE", "reason": r.reason}
            for r in refused
        )
    return index
