"""The server's settings, read once from ``SERVING_*`` environment variables, and each
model's own settings built from them (``Settings.model_settings()``).

``load_settings()`` is called by ``gunicorn.conf.py`` in the master (so a bad value
stops start-up before any worker forks) and by ``create_app()`` when no settings are
passed. Nothing else in the service reads ``os.environ`` for its settings; the
settings table of docs/settings.md lists exactly the fields below and the model fields
of ``serving.model_settings`` (a test checks it).
"""

from __future__ import annotations

import os
import re
from typing import Any, Literal

from pydantic import (
    Field,
    FilePath,
    SecretStr,
    ValidationError,
    field_validator,
)
from pydantic_core import PydanticUndefined
from pydantic_settings import SettingsConfigDict

from serving.errors import SettingsError
from serving.model.artifacts import artifact_of, format_from_path
from serving.model_settings import (
    DEMO_MODEL_PATH,
    BatchLatencyMs,
    BatchPolicy,
    BatchSize,
    Compile,
    ModelFields,
    ModelFormat,
    ModelSettings,
    ModelSpec,
    Positive,
    QueueDepth,
    Threads,
    Tolerance,
    model_default,
)
from serving.observe.settings import ObserveFields

__all__ = [
    "settings_table",
    "DEMO_MODEL_PATH",
    "ModelFormat",
    "ModelSettings",
    "ModelSpec",
    "Settings",
    "load_settings",
    "usable_cpus",
]


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask where the OS has one (Linux), else
    ``os.cpu_count()``. Under ``taskset -c 0`` or a container's cpuset on a 64-core host
    this is 1, where ``os.cpu_count()`` says 64 and one worker per CPU would oversubscribe."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


class Settings(ObserveFields, ModelFields):
    """Every setting of the service; each field is the environment variable ``SERVING_<NAME>``.
    Each model's code takes its own ``ModelSettings`` (``model_settings()``), not these.

    Usage::

        settings = Settings(max_batch_size=8)          # explicit values win over the environment
        settings = load_settings()                     # from SERVING_* only, errors in one line
        default_model = settings.model_settings()[0]
    """

    model_config = SettingsConfigDict(env_prefix="SERVING_", frozen=True, extra="forbid")

    max_batch_size: BatchSize = Field(
        model_default("max_batch_size"), description="Most instances merged into one predict call"
    )
    max_batch_latency_ms: BatchLatencyMs = Field(
        model_default("max_batch_latency_ms"),
        description=(
            "`window` policy: longest a batch's first instance waits for more; `adaptive`: "
            "longest a batch waits for requests already on their way to it (at most one "
            "predict call's time), in milliseconds"
        ),
    )
    batch_policy: BatchPolicy = Field(
        model_default("batch_policy"),
        description=(
            "`adaptive`: when the model is free, what is queued goes at once, with the "
            "requests the worker is decoding (a lone request runs on its own thread, no "
            "hand-off); `window`: wait up to `max_batch_latency_ms` to fill a batch"
        ),
    )
    max_instances_per_request: int = Field(
        1024, ge=1, description="Most instances in one request (413 above)"
    )
    max_body_bytes: int = Field(
        2 * 1024 * 1024, ge=1024, description="Largest request body in bytes (413 above)"
    )
    extra_columns: Literal["refuse", "ignore"] = Field(
        "refuse",
        description=(
            "A column, key or input the model does not have, on `/predict`, KServe V2 and "
            "TF Serving: `refuse` (422 naming it) or `ignore` it, as scikit-learn "
            "in-process does (each name logged once per worker). `/invocations` follows "
            "MLflow's scoring server whatever this says: extra columns ignored, numbers "
            'sent as strings (`"12"`) read by the model\'s schema'
        ),
    )
    load_timeout_s: Positive = Field(
        model_default("load_timeout_s"),
        description=(
            "Longest a worker may take to load and warm up the model, and the master to "
            "load the models it shares; past it the server stops with a line naming the "
            "model (on a reload: the old workers serve on)"
        ),
    )
    max_queue_depth: QueueDepth = Field(
        model_default("max_queue_depth"),
        description=(
            "Most instances waiting in a worker's batcher; a request that would pass it "
            "gets 503 `overloaded` at once (a request alone in the queue is always taken)"
        ),
    )
    request_timeout_ms: Positive = Field(
        model_default("request_timeout_ms"),
        description=(
            "Longest a request waits for its predictions (504 `timeout` after; its "
            "instances still queued are dropped, not computed)"
        ),
    )
    inference_timeout_ms: Positive = Field(
        model_default("inference_timeout_ms"),
        description=(
            "A predict call running longer makes the worker not ready (`/healthz` and "
            "`/livez` 503) and recycles it"
        ),
    )
    workers: int = Field(
        default_factory=usable_cpus,
        ge=1,
        description=(
            "Gunicorn worker processes; the default counts the CPUs of the affinity mask "
            "(taskset, a container cpuset), not of the host"
        ),
        json_schema_extra={"shown_default": "CPUs this process may use"},
    )
    threads: int | None = Field(
        None,
        ge=1,
        description="Request threads per worker (gthread)",
        json_schema_extra={"shown_default": "2 x `max_batch_size`"},
    )
    bind: str = Field(
        "127.0.0.1:8000",
        pattern=r"^(unix:/.+|fd://\d+|(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):\d{1,5})$",
        description=(
            "Gunicorn bind address: `HOST:PORT`, `[IPv6]:PORT`, `unix:/PATH` or `fd://N` "
            "(`0.0.0.0:8000` in a container)"
        ),
    )
    timeout_s: int = Field(30, ge=1, description="Gunicorn worker timeout in seconds")
    graceful_timeout_s: int | None = Field(
        None,
        ge=1,
        description=(
            "Seconds a stopping worker has to drain (default: long enough for every "
            "accepted request to finish)"
        ),
        json_schema_extra={"shown_default": "request timeout + 5 s"},
    )
    max_requests: int = Field(
        0,
        ge=0,
        description=(
            "Recycle a worker after this many requests (a leak guard), one worker at a "
            "time: it leaves only when no other worker is loading and the previous "
            "leaver's replacement is ready (forked as soon as that one left); the "
            "replacement loads before it accepts, so no request fails"
        ),
        json_schema_extra={"shown_default": "`0` (never)"},
    )
    max_requests_jitter: int = Field(
        0,
        ge=0,
        description=(
            "Up to this many more requests per worker (recycles are one at a time regardless)"
        ),
    )
    blas_threads: Threads = Field(
        model_default("blas_threads"),
        description="BLAS/OpenMP (and ONNX Runtime intra-op) threads per worker",
    )
    share_model: Literal["auto", "off"] = Field(
        "auto",
        description=(
            "`auto`: the master loads pickle, joblib and skops models once, before it forks,"
            " and every worker (respawns, recycles and reloads too) shares its memory; ONNX"
            " models and your own classes are still loaded in each worker (see docs/models.md, "
            '"One copy of the model per host"); `off`: every worker loads its own copy. Per '
            "model as `share` in `SERVING_MODELS` and a repository's `config.json`"
        ),
    )
    compile: Compile = Field(
        model_default("compile"),
        description=(
            "`auto`: each worker compiles a scikit-learn tree model or an XGBoost model to "
            "ONNX Runtime at load and serves it that way once its answers equal its "
            "library's on its parity rows (labels exactly, probabilities within "
            "`SERVING_COMPILE_TOLERANCE`), unless it is too large to copy into every worker "
            '(see docs/models.md, "Compiled to ONNX Runtime"); `on`: any scikit-learn or '
            "XGBoost model whose parity rows agree, whatever its size; `off`: never. Per "
            "model as `compile` in `SERVING_MODELS` and a repository's `config.json`"
        ),
    )
    compile_tolerance: Tolerance = Field(
        model_default("compile_tolerance"),
        description=(
            "Largest absolute difference from its library's a compiled model's "
            "probabilities and regression outputs may show on its parity rows; larger, and "
            "the library serves it"
        ),
    )
    cpu_affinity: Literal["adaptive", "auto", "none"] = Field(
        "adaptive",
        description=(
            "`adaptive`: pin each worker to its own `SERVING_BLAS_THREADS` CPUs while it "
            "serves about one request at a time (cheaper GIL hand-offs between its threads:"
            " lower latency), on every CPU once busy (a pinned worker cannot leave a CPU "
            "nginx or the clients also need); `auto`: pinned always; `none`: never. Only "
            "CPUs of the process's own mask; each pinned worker claims its CPUs across the "
            "host (lock files in /dev/shm), so two servers never share one while another "
            "is free; a mask set from outside (`taskset`) stops the pinning"
        ),
    )
    switch_interval_ms: float | None = Field(
        None,
        gt=0,
        le=100,
        allow_inf_nan=False,
        description=(
            "GIL switch interval per worker (`sys.setswitchinterval`), in milliseconds; "
            "see docs/batching.md"
        ),
        json_schema_extra={"shown_default": "Python's 5 ms"},
    )
    api_keys: SecretStr | None = Field(
        None,
        description=(
            "Comma-separated API keys (16+ characters each); when set, prediction routes "
            "need `Authorization: Bearer <key>` or `X-API-Key: <key>` (401 otherwise)"
        ),
    )
    api_keys_file: FilePath | None = Field(
        None,
        description=(
            "File of API keys, one per line, `#` comments; refused at start when a user "
            "other than root and the server's could replace it (as a model file)"
        ),
    )
    metrics_require_auth: bool = Field(
        False,
        description=(
            "Also require a key for `/metrics` (`/livez` and `/healthz` stay open for "
            "probes; `/healthz` shows its detail only with a key)"
        ),
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        allow_inf_nan=False,
        description=(
            "Longest a client may take to send a request line and headers, or leave its "
            "response unread, in seconds; then its connection is closed (heads, and "
            "bodies with a Content-Length, are read by the worker's main loop: a slow "
            "client holds no worker thread)"
        ),
    )

    @field_validator("bind")
    @classmethod
    def _check_port(cls, value: str) -> str:
        if (
            not value.startswith(("unix:", "fd://"))
            and not 0 < int(value.rsplit(":", 1)[1]) < 65536
        ):
            raise ValueError("port must be 1..65535")
        return value

    def model_settings(self) -> tuple[ModelSettings, ...]:
        """Each model's own settings, in ``SERVING_MODELS`` order (the first is the default
        model), or the repository's (``SERVING_MODEL_REPOSITORY``: models by name, each
        one's versions newest first), or the one model of ``SERVING_MODEL_PATH``: its
        artifact (a directory's one), format, name, version, and batching, loading and
        sharing settings, the server-wide value where its entry leaves one out. Reads the
        file system (a directory's artifact, a format from its extension): call it once,
        at start.

        :raises ValueError: when an artifact can no longer be found (the settings checked
            it when they were read).
        """
        return tuple(self._model(spec) for spec in (self.entries() or [self.single_spec()]))

    def _model(self, spec: ModelSpec) -> ModelSettings:
        path = artifact_of(spec.path, spec.class_)
        overrides = {
            name: getattr(spec, name) for name in _PER_MODEL if getattr(spec, name) is not None
        }
        return self.model_defaults(
            name=spec.name, version=spec.version, path=path,
            format=spec.format or ("python" if spec.class_ else format_from_path(path)),
            model_class=spec.class_, sha256=spec.sha256, labels=spec.labels, **overrides,
        )  # fmt: skip

    def model_defaults(self, **fields: Any) -> ModelSettings:
        """A ``ModelSettings`` of ``fields`` (``name``, ``version``, ``format`` at least),
        the server-wide values for the rest: a model handed over in memory gets these
        (``create_app(models=[handle])``). No I/O."""
        trusted = tuple(t.strip() for t in self.skops_trusted_types.split(",") if t.strip())
        defaults: dict[str, Any] = {name: getattr(self, name) for name in _BATCHING}
        defaults |= {
            "load_timeout_s": self.load_timeout_s,
            "inference_timeout_ms": self.inference_timeout_ms,
            "request_timeout_ms": self.request_timeout_ms,
            "blas_threads": self.blas_threads,
            "keep_n_jobs": self.keep_model_n_jobs,
            "skops_trusted_types": trusted,
            "onnx_providers": self.onnx_providers,
            "onnx_optimized_model_path": self.onnx_optimized_model_path,
            "cuda_device": self.cuda_device,
            "allow_world_writable": self.allow_world_writable_model,
            "share": self.share_model,
            "compile": self.compile,
            "compile_tolerance": self.compile_tolerance,
        }
        return ModelSettings(**(defaults | fields))

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


#: The batching fields a ``SERVING_MODELS`` entry may set for itself.
_BATCHING = ("max_batch_size", "max_batch_latency_ms", "batch_policy", "max_queue_depth")
#: Every field a ``SERVING_MODELS`` entry (or a repository's ``config.json``) may set for itself.
_PER_MODEL = (*_BATCHING, "compile", "share")

#: A model validator's message naming its variable (pydantic prefixes "Value error, ").
_NAMED = re.compile(r"^(?:Value error, )?(?P<variable>SERVING_[A-Z_]+): (?P<problem>.*)$", re.S)


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
        named = _NAMED.match(err["msg"]) if not loc else None
        if named:  # a check of several fields names its variable: "SERVING_X: ..."
            raise SettingsError(named["variable"], named["problem"]) from None
        field = str(loc[0]) if loc else "model_format"
        info = Settings.model_fields.get(field)
        accepts = f" ({info.description})" if info is not None and info.description else ""
        value = os.environ.get(f"SERVING_{field.upper()}")
        got = f"got {value!r}: " if value is not None and len(loc) < 2 else ""
        # fields and indexes only: not pydantic's names of a union's branches
        steps = [p for p in loc[1:] if isinstance(p, int) or str(p).isidentifier()]
        inner = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in steps)
        where = f"{inner.lstrip('.')}: " if inner else ""
        message = f"{where}{got}{err['msg']}{accepts if not inner else ''}"
        raise SettingsError(f"SERVING_{field.upper()}", message) from None


def settings_table() -> str:
    """docs/settings.md's table (markdown), generated from the fields as Gunicorn's docs
    are from its settings: ``SERVING_<NAME>``, the default (a field's
    ``json_schema_extra["shown_default"]`` where it is computed at start), and its
    description. ``python -m serving.settings`` prints it; a test checks docs/settings.md."""
    rows = ["| Variable | Default | Meaning |", "|---|---|---|"]
    for name, info in Settings.model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        shown = extra.get("shown_default")
        default = None if info.default is PydanticUndefined else info.default
        rows.append(
            f"| `SERVING_{name.upper()}` | {shown or _shown(default)} | {info.description} |"
        )
    return "\n".join(rows) + "\n"


def _shown(default: object) -> str:
    """A default as the table shows it: ``unset``, `` `true` ``, `` `10` ``, `` `auto` ``."""
    if default is None or default == "":
        return "unset"
    if isinstance(default, bool):
        return f"`{str(default).lower()}`"
    if isinstance(default, float) and default.is_integer():
        default = int(default)
    return f"`{default}`"


if __name__ == "__main__":
    print(settings_table(), end="")
