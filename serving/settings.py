"""The one settings object, read once from ``SERVING_*`` environment variables.

``load_settings()`` is called by ``gunicorn.conf.py`` in the master (so a bad value
stops start-up before any worker forks) and by ``create_app()`` when no settings are
passed. Nothing else in the service reads ``os.environ`` for its settings; the
README's settings table lists exactly the fields below (a test checks it).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    DirectoryPath,
    Field,
    FilePath,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from serving.custom import CLASS_PATTERN
from serving.errors import SettingsError
from serving.loaders import find_artifact, format_from_path
from serving.providers import parse_providers

__all__ = [
    "DEMO_MODEL_PATH",
    "ModelFormat",
    "ModelSpec",
    "Settings",
    "load_settings",
    "usable_cpus",
]

ModelFormat = Literal["pickle", "joblib", "onnx", "python"]

#: The bundled demo: StandardScaler + LogisticRegression on scikit-learn's breast-cancer
#: data (30 features), rebuilt by ``examples/build_demo_model.py``.
DEMO_MODEL_PATH = Path(__file__).parent / "demo" / "breast_cancer.joblib"


class ModelSpec(BaseModel):
    """One entry of ``SERVING_MODELS``: a model version to keep warm, with its own batcher.

    Batching fields left out take the server-wide ``SERVING_*`` value.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,128}$", description="Name in URLs and metrics.")
    version: str = Field("1", pattern=r"^[A-Za-z0-9_.:-]{1,128}$", description="Version served.")
    path: FilePath | DirectoryPath = Field(
        description="The model artifact, or a directory holding exactly one (or what the "
        "class of a python model reads)."
    )
    format: ModelFormat | None = Field(None, description="pickle, joblib, onnx or python.")
    class_: str | None = Field(
        None,
        alias="class",
        pattern=CLASS_PATTERN,
        description="package.module:ClassName of a python model; implies format python.",
    )
    sha256: str | None = Field(None, pattern=r"^[0-9a-fA-F]{64}$")
    max_batch_size: int | None = Field(None, ge=1, le=4096)
    max_batch_latency_ms: float | None = Field(None, ge=0, le=10_000, allow_inf_nan=False)
    batch_policy: Literal["adaptive", "window"] | None = None
    max_queue_depth: int | None = Field(None, ge=1)
    labels: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")], str] = Field(
        default_factory=dict,
        description="TF Serving version_labels of this model name: label -> a version "
        'listed for it, e.g. {"stable": "1", "canary": "2"}.',
    )

    @model_validator(mode="after")
    def _check_format(self) -> ModelSpec:
        check_format(self.path, self.format, self.class_, self.sha256)
        return self


def check_format(
    path: Path | None, fmt: str | None, class_path: str | None, sha256: str | None = None
) -> None:
    """Refuse a model whose format cannot be known or contradicts its class.

    :raises ValueError: naming the problem: no class for format python, a class with another
        format, no single artifact in a directory, an unknown extension, or a SHA-256 for a
        directory a class reads (a digest pins one file).
    """
    if sha256 is not None and class_path is not None and path is not None and path.is_dir():
        raise ValueError("a SHA-256 pins one file; a class reading a directory has none")
    if class_path is not None and fmt not in (None, "python"):
        raise ValueError(f"a model class is set, so the format is python, not {fmt}")
    if fmt == "python" and class_path is None:
        raise ValueError("format python needs SERVING_MODEL_CLASS (or class in SERVING_MODELS)")
    if path is None or fmt == "python" or class_path is not None:
        return
    artifact = find_artifact(path) if path.is_dir() else path  # ValueError naming the files
    if fmt is None:
        format_from_path(artifact)  # raises ValueError naming the extension


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask where the OS has one (Linux), else
    ``os.cpu_count()``. Under ``taskset -c 0`` or a container's cpuset on a 64-core host
    this is 1, where ``os.cpu_count()`` says 64 and one worker per CPU would oversubscribe."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


class Settings(BaseSettings):
    """Every setting of the service; each field is the environment variable ``SERVING_<NAME>``.

    Usage::

        settings = Settings(max_batch_size=8)          # explicit values win over the environment
        settings = load_settings()                     # from SERVING_* only, errors in one line
    """

    model_config = SettingsConfigDict(env_prefix="SERVING_", frozen=True, extra="forbid")

    model_path: FilePath | None = Field(
        None, description="Model artifact to serve; unset serves the bundled breast-cancer demo."
    )
    model_format: ModelFormat | None = Field(
        None,
        description="pickle, joblib, onnx or python; unset means python when model_class is "
        "set, else from the file extension.",
    )
    model_class: str | None = Field(
        None,
        pattern=CLASS_PATTERN,
        description="package.module:ClassName of your own model class (load(path), "
        "predict(instances)); implies model_format python.",
    )
    model_dir: DirectoryPath | None = Field(
        None,
        description="Directory holding the model, such as KServe's /mnt/models: the one "
        "artifact in it is served (a python model's class gets the directory itself); "
        "instead of model_path.",
    )
    model_name: str | None = Field(
        None, min_length=1, description="Name reported in responses; unset means the file stem."
    )
    model_version: str = Field("1", min_length=1, description="Version reported and pinned.")
    max_models: int = Field(
        8, ge=1, description="Most entries SERVING_MODELS may have (each costs a model copy)."
    )
    models: Annotated[list[ModelSpec] | None, NoDecode] = Field(
        None,
        description="Several models/versions to keep warm in each worker: a JSON list of "
        "{name, version, path, format, class, sha256, max_batch_size, max_batch_latency_ms, "
        "batch_policy, max_queue_depth, labels}, or the path of a JSON file holding one. The first "
        "entry is what /predict serves; replaces SERVING_MODEL_PATH and friends.",
    )
    max_batch_size: int = Field(
        32, ge=1, le=4096, description="Most instances merged into one predict call."
    )
    max_batch_latency_ms: float = Field(
        10.0,
        ge=0,
        le=10_000,
        allow_inf_nan=False,
        description="window policy: longest a batch's first instance waits for more, "
        "in milliseconds.",
    )
    batch_policy: Literal["adaptive", "window"] = Field(
        "adaptive",
        description="adaptive: flush what is queued as soon as the model is free; "
        "window: wait up to max_batch_latency_ms to fill a batch.",
    )
    max_instances_per_request: int = Field(
        1024, ge=1, description="Most instances one request may carry (413 above)."
    )
    max_body_bytes: int = Field(
        2 * 1024 * 1024, ge=1024, description="Largest request body in bytes (413 above)."
    )
    load_timeout_s: float = Field(
        300,
        gt=0,
        allow_inf_nan=False,
        description="Longest a worker may take to load and warm up the model, in seconds; "
        "past it the server stops with an error naming the model.",
    )
    max_queue_depth: int = Field(
        2048,
        ge=1,
        description="Most instances waiting in a worker's batcher; a request that would pass "
        "it is answered 503 overloaded at once.",
    )
    request_timeout_ms: float = Field(
        30_000,
        gt=0,
        allow_inf_nan=False,
        description="Longest a request waits for its predictions, in milliseconds (504 after; "
        "its instances still queued are dropped).",
    )
    inference_timeout_ms: float = Field(
        60_000,
        gt=0,
        allow_inf_nan=False,
        description="A predict call running longer than this, in milliseconds, makes the "
        "worker not ready and recycles it.",
    )
    workers: int = Field(
        default_factory=usable_cpus,
        ge=1,
        description="Gunicorn worker processes; unset means one per CPU this process may run "
        "on (its affinity mask: taskset, a cpuset), not one per CPU of the host.",
    )
    threads: int | None = Field(
        None, ge=1, description="Request threads per worker; unset means 2 x max_batch_size."
    )
    bind: str = Field(
        "127.0.0.1:8000",
        pattern=r"^(unix:/.+|fd://\d+|(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):\d{1,5})$",
        description="Gunicorn bind address: HOST:PORT, [IPv6]:PORT, unix:/PATH or fd://N.",
    )
    timeout_s: int = Field(
        30, ge=1, description="Gunicorn worker timeout (silent worker is killed), in seconds."
    )
    graceful_timeout_s: int | None = Field(
        None,
        ge=1,
        description="Time a stopping worker has to drain, in seconds; unset means "
        "request_timeout_ms plus 5 s, so every accepted request can finish.",
    )
    max_requests: int = Field(
        0,
        ge=0,
        description="Recycle a worker after this many requests (0: never), with up to "
        "max_requests_jitter more so workers do not recycle together.",
    )
    max_requests_jitter: int = Field(
        0, ge=0, description="Random extra requests before a recycle (Gunicorn's jitter)."
    )
    blas_threads: int = Field(
        1, ge=1, description="BLAS/OpenMP threads per worker, pinned with threadpoolctl."
    )
    cpu_affinity: Literal["auto", "none"] = Field(
        "auto",
        description="auto: pin each worker to its own blas_threads CPUs (round-robin over the "
        "CPUs the server may use); none: let the kernel move threads between CPUs.",
    )
    switch_interval_ms: float | None = Field(
        None,
        gt=0,
        le=100,
        allow_inf_nan=False,
        description="Python's GIL switch interval per worker (sys.setswitchinterval), in "
        "milliseconds; unset keeps Python's 5 ms. See docs/batching.md.",
    )
    api_keys: SecretStr | None = Field(
        None,
        description="Comma-separated API keys (16+ characters each); when set (or "
        "api_keys_file), prediction routes need Authorization: Bearer <key> or X-API-Key.",
    )
    api_keys_file: FilePath | None = Field(
        None, description="File of API keys, one per line (# comments)."
    )
    metrics_require_auth: bool = Field(
        False, description="Also require an API key for /metrics (probes stay open)."
    )
    model_sha256: str | None = Field(
        None,
        pattern=r"^[0-9a-fA-F]{64}$",
        description="Expected SHA-256 of the model file, checked before loading it.",
    )
    allow_world_writable_model: bool = Field(
        False,
        description="Load a model file anyone may write (refused by default: pickle and "
        "joblib run code when loaded).",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        allow_inf_nan=False,
        description="Longest a client may take to send a request's line and headers, in "
        "seconds; then the connection is closed, so a slow client holds no worker thread.",
    )
    keep_model_n_jobs: bool = Field(
        False,
        description="Keep the n_jobs a scikit-learn model was trained with; by default every "
        "n_jobs parameter (pipeline steps included) is set to 1 at load, logged once.",
    )
    onnx_providers: str = Field(
        "auto",
        description="ONNX Runtime execution providers: auto (CUDA when a GPU is usable, else "
        "CPU) or a comma list in order of preference such as cuda,cpu or tensorrt,cuda,cpu; "
        "a GPU provider this host cannot run stops start-up.",
    )
    cuda_device: int | None = Field(
        None,
        ge=0,
        description="CUDA device for every worker; unset means worker k uses device "
        "k mod the number of GPUs.",
    )
    onnx_optimized_model_path: Path | None = Field(
        None,
        description="Where to save the optimized ONNX graph and reuse it from on later "
        "starts (same source file, providers and onnxruntime), so workers start faster.",
    )
    metrics_dir: Path | None = Field(
        None,
        description="prometheus-client multiprocess directory, wiped at start; unset means "
        "PROMETHEUS_MULTIPROC_DIR or a new temporary directory.",
    )
    access_log: bool = Field(
        True,
        description="One JSON line per request on stdout: request id, route, status, "
        "latency, instances, batch size, model version.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Gunicorn and service log level."
    )
    payload_log: Literal["off", "request", "response", "all"] = Field(
        "off",
        description="Payload logging (serving.payload_log): the decoded instances of each "
        "request, the outputs of each answer, or both, sent to payload_log_url.",
    )
    payload_log_url: str | None = Field(
        None,
        pattern=r"^(https?|file)://.+",
        description="Payload log sink: http(s)://... gets one CloudEvent per record; "
        "file:///path.jsonl one JSON line per record (each worker its own file).",
    )
    payload_log_mode: Literal["binary", "structured"] = Field(
        "binary", description="CloudEvents HTTP content mode of the payload log."
    )
    payload_log_sample: float = Field(
        1.0, ge=0, le=1, allow_inf_nan=False, description="Share of requests logged, 0 to 1."
    )
    payload_log_queue_size: int = Field(
        10_000,
        ge=1,
        description="Records a worker holds for its sink; more are dropped and counted "
        "(payload_log_dropped_total), never waited for.",
    )
    payload_log_timeout_ms: float = Field(
        2000, gt=0, description="Longest one HTTP post of a record may take, in milliseconds."
    )
    payload_log_retries: int = Field(
        3, ge=0, le=10, description="HTTP retries of a record (backoff 0.1 s, doubling)."
    )
    payload_log_file_max_bytes: int = Field(
        100 * 2**20, ge=1024, description="Size at which a payload log file is rotated, bytes."
    )
    payload_log_file_backups: int = Field(
        5, ge=0, description="Rotated payload log files kept per worker."
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower_log_level(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("bind")
    @classmethod
    def _check_port(cls, value: str) -> str:
        if (
            not value.startswith(("unix:", "fd://"))
            and not 0 < int(value.rsplit(":", 1)[1]) < 65536
        ):
            raise ValueError("port must be 1..65535")
        return value

    @field_validator("models", mode="before")
    @classmethod
    def _read_models(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        try:
            inline = value.lstrip().startswith(("[", "{"))
            return json.loads(value if inline else Path(value).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"neither a JSON list nor a readable JSON file: {exc}") from None

    @field_validator("models")
    @classmethod
    def _check_models(
        cls, models: list[ModelSpec] | None, info: ValidationInfo
    ) -> list[ModelSpec] | None:
        if models is None:
            return None
        limit = info.data.get("max_models", 8)
        if not models:
            raise ValueError("is an empty list")
        if len(models) > limit:
            raise ValueError(f"lists {len(models)} models, more than SERVING_MAX_MODELS={limit}")
        seen = set()
        for spec in models:
            if (spec.name, spec.version) in seen:
                raise ValueError(f"lists model {spec.name!r} version {spec.version!r} twice")
            seen.add((spec.name, spec.version))
        labels: dict[tuple[str, str], str] = {}
        for spec in models:
            for label, version in spec.labels.items():
                if (spec.name, version) not in seen:
                    raise ValueError(
                        f"model {spec.name!r}: label {label!r} names version {version!r}, "
                        "which is not listed"
                    )
                if labels.setdefault((spec.name, label), version) != version:
                    raise ValueError(f"model {spec.name!r}: label {label!r} names two versions")
        return models

    @field_validator("onnx_providers")
    @classmethod
    def _check_providers(cls, value: str) -> str:
        parse_providers(value)  # raises ValueError naming the unknown entry
        return value

    @field_validator("model_dir")
    @classmethod
    def _check_model_dir(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is not None and info.data.get("model_path") is not None:
            raise ValueError("set SERVING_MODEL_PATH or SERVING_MODEL_DIR, not both")
        if value is not None and info.data.get("model_class") is None:
            find_artifact(value)  # raises ValueError naming what the directory holds
        return value

    @field_validator("metrics_dir")
    @classmethod
    def _check_metrics_dir(cls, value: Path | None) -> Path | None:
        if value is not None and value.exists() and not value.is_dir():
            raise ValueError("exists and is not a directory")
        return value

    @model_validator(mode="after")
    def _check_format(self) -> Settings:
        path = self.model_path or self.model_dir
        check_format(path, self.model_format, self.model_class, self.model_sha256)
        if self.payload_log != "off" and self.payload_log_url is None:
            raise ValueError("SERVING_PAYLOAD_LOG needs SERVING_PAYLOAD_LOG_URL (the sink)")
        return self

    @property
    def model_specs(self) -> list[ModelSpec]:
        """``models``, or the one model of ``model_path``/``model_name``/``model_version``."""
        if self.models is not None:
            return list(self.models)
        return [
            ModelSpec(
                name=self.resolved_model_name,
                version=self.model_version,
                path=self.resolved_model_path,
                format=self.model_format,
                sha256=self.model_sha256,
                **{"class": self.model_class},
            )
        ]

    def version_labels(self, name: str) -> dict[str, str]:
        """Model ``name``'s TF Serving version labels (label -> version), from every
        ``SERVING_MODELS`` entry of that name."""
        labels: dict[str, str] = {}
        for spec in self.models or ():
            if spec.name == name:
                labels.update(spec.labels)
        return labels

    def for_model(self, spec: ModelSpec) -> Settings:
        """These settings narrowed to one model: its path, name, version and batching."""
        update: dict[str, object] = {
            "model_path": spec.path,
            "model_dir": None,
            "model_format": spec.format,
            "model_class": spec.class_,
            "model_name": spec.name,
            "model_version": spec.version,
            "model_sha256": spec.sha256,
            "models": None,
        }
        for name in ("max_batch_size", "max_batch_latency_ms", "batch_policy", "max_queue_depth"):
            if getattr(spec, name) is not None:
                update[name] = getattr(spec, name)
        return self.model_copy(update=update)

    @property
    def resolved_model_path(self) -> Path:
        """``model_path``, else ``model_dir``, else the bundled demo; for a directory, the one
        artifact in it, unless a python model's class reads the directory itself."""
        path = self.model_path or self.model_dir or DEMO_MODEL_PATH
        if path.is_dir() and self.model_class is None:
            return find_artifact(path)
        return path

    @property
    def resolved_model_format(self) -> str:
        """``model_format``; else python when ``model_class`` is set; else the format the
        resolved path's extension implies."""
        if self.model_format is not None:
            return self.model_format
        return "python" if self.model_class else format_from_path(self.resolved_model_path)

    @property
    def resolved_model_name(self) -> str:
        """``model_name``, or the model file's stem (``breast_cancer`` for the demo)."""
        return self.model_name or self.resolved_model_path.stem

    @property
    def drain_timeout_s(self) -> int:
        """Gunicorn's graceful timeout: ``graceful_timeout_s``, or the request deadline + 5 s."""
        if self.graceful_timeout_s is not None:
            return self.graceful_timeout_s
        return int(self.request_timeout_ms / 1000) + 5

    @property
    def worker_threads(self) -> int:
        """Threads per worker: ``threads``, or twice ``max_batch_size`` so a batch can fill."""
        return self.threads or 2 * self.max_batch_size


#: Variables Kubernetes injects for a Service named "serving" (SERVING_SERVICE_HOST, SERVING_PORT,
#: SERVING_PORT_8000_TCP_ADDR, ...): not ours, not typos.
_INJECTED = re.compile(r"^SERVING_(SERVICE_[A-Z_]+|PORT(_\d+_[A-Z]+(_[A-Z]+)?)?)$")


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """``SERVING_*`` names in ``environ`` that are no setting (likely typos), sorted."""
    known = {f"SERVING_{name.upper()}" for name in Settings.model_fields}
    return sorted(
        name
        for name in environ
        if name.startswith("SERVING_") and name not in known and not _INJECTED.match(name)
    )


def load_settings() -> Settings:
    """Read the settings from the environment.

    :raises SettingsError: for the first invalid variable, naming it, the value it got
        and what it accepts.
    """
    try:
        return Settings()
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = err["loc"]
        field = str(loc[0]) if loc else "model_format"
        info = Settings.model_fields.get(field)
        accepts = f" ({info.description})" if info is not None and info.description else ""
        value = os.environ.get(f"SERVING_{field.upper()}")
        got = f"got {value!r}: " if value is not None and len(loc) < 2 else ""
        inner = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc[1:])
        where = f"{inner.lstrip('.')}: " if inner else ""
        message = f"{where}{got}{err['msg']}{accepts if not inner else ''}"
        raise SettingsError(f"SERVING_{field.upper()}", message) from None
