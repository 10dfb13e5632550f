"""Model settings: what model(s) a worker serves and how each is loaded and batched.

Two kinds of object, as MLServer keeps ``ModelSettings`` apart from its server
``Settings``:

- ``ModelFields``: the ``SERVING_MODEL_*``, ``SERVING_MODELS`` and ONNX Runtime
  environment variables, the part of the environment that names models
  (``serving.settings.Settings`` extends it with the server's: batching defaults,
  Gunicorn, security, observability); ``ModelSpec`` is one entry of ``SERVING_MODELS``.
- ``ModelSettings``: one model's own settings, built once by ``Settings.model_settings()``
  (which finds each artifact on disk): the only settings a model's runtime, loaders,
  cache entry and sharing take. Its fields are plain values: reading one does no I/O.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    DirectoryPath,
    Field,
    FilePath,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from serving.model.artifacts import (
    artifact_of,
    check_format,
    find_artifact,
    read_model_list,
)
from serving.model.artifacts import model_name as default_model_name
from serving.model.custom import CLASS_PATTERN
from serving.model.names import (
    NAME_PATTERN,
    VERSION_PATTERN,
    check_listing,
    no_tf_verb,
    not_only_dots,
    only_dots,
)
from serving.model.providers import parse_providers

__all__ = [
    "DEMO_MODEL_PATH",
    "BatchLatencyMs",
    "BatchPolicy",
    "BatchSize",
    "Compile",
    "Positive",
    "QueueDepth",
    "Threads",
    "Tolerance",
    "ModelFields",
    "ModelFormat",
    "ModelSettings",
    "ModelSpec",
    "model_default",
    "serving_on",
]


ModelFormat = Literal["pickle", "joblib", "skops", "onnx", "python"]

#: A name as ``NAME_PATTERN`` (the field's) allows, and not only dots.
Named = Annotated[str, AfterValidator(not_only_dots)]
#: A version as ``VERSION_PATTERN`` (the field's) allows: not only dots, nor ending in a
#: TF Serving method.
Versioned = Annotated[str, AfterValidator(not_only_dots), AfterValidator(no_tf_verb)]


#: A model's batching and loading bounds, for its own settings, its ``SERVING_MODELS``
#: entry and the server-wide defaults alike.
BatchSize = Annotated[int, Field(ge=1, le=4096)]
BatchLatencyMs = Annotated[float, Field(ge=0, le=10_000, allow_inf_nan=False)]
BatchPolicy = Literal["adaptive", "window"]
QueueDepth = Annotated[int, Field(ge=1)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Threads = Annotated[int, Field(ge=1)]
Compile = Literal["auto", "on", "off"]
Tolerance = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]

#: The bundled demo: StandardScaler + LogisticRegression on scikit-learn's breast-cancer
#: data (30 features), rebuilt by ``examples/build_demo_model.py``.
DEMO_MODEL_PATH = Path(__file__).parent / "demo" / "breast_cancer.joblib"


class ModelSpec(BaseModel):
    """One entry of ``SERVING_MODELS``: a model version to keep warm, with its own batcher.

    Batching fields left out take the server-wide ``SERVING_*`` value.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    name: Named = Field(pattern=NAME_PATTERN, description="Name in URLs and metrics.")
    version: Versioned = Field("1", pattern=VERSION_PATTERN, description="Version served.")
    path: FilePath | DirectoryPath = Field(
        description="The model artifact, or a directory holding exactly one (or what the "
        "class of a python model reads)."
    )
    format: ModelFormat | None = Field(None, description="pickle, joblib, skops, onnx or python.")
    class_: str | None = Field(
        None,
        alias="class",
        pattern=CLASS_PATTERN,
        description="package.module:ClassName of a python model; implies format python.",
    )
    sha256: str | None = Field(None, pattern=r"^[0-9a-fA-F]{64}$")
    max_batch_size: BatchSize | None = None
    max_batch_latency_ms: BatchLatencyMs | None = None
    batch_policy: BatchPolicy | None = None
    max_queue_depth: QueueDepth | None = None
    compile: Compile | None = Field(
        None, description="auto, on or off: serve a scikit-learn model through ONNX Runtime."
    )
    share: Literal["auto", "off"] | None = Field(
        None,
        description="auto or off: as SERVING_SHARE_MODEL, for this model (off: each worker "
        "loads its own copy, and a change of it is taken in place).",
    )
    labels: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")], str] = Field(
        default_factory=dict,
        description="TF Serving version_labels of this model name: label -> a version "
        'listed for it, e.g. {"stable": "1", "canary": "2"}.',
    )

    @field_validator("path", mode="before")
    @classmethod
    def _path_exists(cls, value: object) -> object:
        """An empty path is not the current directory, and a missing one is named (the
        union of a file and a directory would say only "does not point to a file")."""
        if isinstance(value, str | Path):
            if not str(value).strip():
                raise ValueError("is empty: name the model file or directory")
            if not Path(value).exists():
                raise ValueError(f"{str(value)[:200]!r} does not exist (a file or a directory)")
        return value

    @model_validator(mode="after")
    def _check_format(self) -> ModelSpec:
        check_format(self.path, self.format, self.class_, self.sha256)
        return self


class ModelSettings(BaseModel):
    """One model version's own settings: what it is, how it is loaded and batched.

    Built by ``Settings.model_settings()`` from an entry of ``SERVING_MODELS`` (or the one
    model of ``SERVING_MODEL_PATH``) and the server-wide defaults the entry leaves out.

    Usage::

        model = settings.model_settings()[0]          # the default model
        runtime = ModelRuntime(model, metrics)
    """

    model_config = ConfigDict(frozen=True, extra="forbid", protected_namespaces=())

    name: Named = Field(pattern=NAME_PATTERN)
    version: Versioned = Field(pattern=VERSION_PATTERN)
    #: The artifact to load; for a python model, what its class's ``load`` gets (a file
    #: or a directory); None for a model handed over in memory (``create_app(models=)``).
    path: Path | None = None
    #: Its loader's format (``joblib``, ``onnx``, ...; ``callable`` for a function).
    format: str
    model_class: str | None = None
    sha256: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    # The defaults of these are the server's too (``Settings``' fields read them here).
    max_batch_size: BatchSize = 32
    max_batch_latency_ms: BatchLatencyMs = 10.0
    batch_policy: BatchPolicy = "adaptive"
    max_queue_depth: QueueDepth = 2048
    #: Longest its load and warm-up may take, in seconds.
    load_timeout_s: Positive = 300
    #: Longest a predict call may run before the model counts as stuck, in milliseconds.
    inference_timeout_ms: Positive = 60_000
    #: A request's deadline, in milliseconds (Triton's model config shows it as its
    #: queue policy's timeout).
    request_timeout_ms: Positive = 30_000
    blas_threads: Threads = 1
    keep_n_jobs: bool = False
    skops_trusted_types: tuple[str, ...] = ()
    onnx_providers: str = "auto"
    onnx_optimized_model_path: Path | None = None
    cuda_device: int | None = None
    allow_world_writable: bool = False
    share: Literal["auto", "off"] = "auto"
    #: Serve a scikit-learn model through ONNX Runtime (``serving.model.compiled``).
    compile: Compile = "auto"
    #: Largest absolute difference a compiled model's probabilities and regression outputs
    #: may have from scikit-learn's on the parity rows.
    compile_tolerance: Tolerance = 1e-6


def model_default(name: str) -> Any:
    """The default of ``ModelSettings`` field ``name``: the server-wide default of the
    ``Settings`` field that gives it (one value, in one place)."""
    return ModelSettings.model_fields[name].default


#: The repository versions the server serves now, by model, while its master reads the
#: settings again (``serving_on``).
_serving: ContextVar[Mapping[str, Sequence[ModelSpec]] | None] = ContextVar("serving", default=None)


@contextlib.contextmanager
def serving_on(kept: Mapping[str, Sequence[ModelSpec]]) -> Iterator[None]:
    """Settings read meanwhile serve, of a repository model whose ``config.json`` cannot be
    taken, the versions ``kept`` names for it (``serving.repository.scan``'s ``kept``):
    the master's settings are read from the environment, where nothing says what serves.
    """
    token = _serving.set(kept)
    try:
        yield
    finally:
        _serving.reset(token)


class ModelFields(BaseSettings):
    """The environment variables that name the models (``SERVING_<NAME>``); see
    ``Settings``, which extends these, and ``ModelSettings``, what each model gets."""

    model_config = SettingsConfigDict(env_prefix="SERVING_", frozen=True, extra="forbid")

    model_path: FilePath | None = Field(
        None,
        description="Model artifact to serve",
        json_schema_extra={"shown_default": "bundled demo"},
    )
    model_format: ModelFormat | None = Field(
        None,
        description=(
            "`pickle`, `joblib`, `skops`, `onnx` or `python` (your own class: "
            "`SERVING_MODEL_CLASS`)"
        ),
        json_schema_extra={"shown_default": "from extension"},
    )
    model_class: str | None = Field(
        None,
        pattern=CLASS_PATTERN,
        description=(
            '`package.module:ClassName` of your own model class (see "Your own model '
            'code"); implies `python`'
        ),
    )
    model_dir: DirectoryPath | None = Field(
        None,
        description=(
            "A directory holding the model, such as KServe's `/mnt/models`: the one "
            "artifact in it (`.joblib`, `.pkl`, `.pickle`, `.skops`, `.onnx`; hidden "
            "files ignored; none or several stops start-up) is served; with "
            "`SERVING_MODEL_CLASS` the class's `load` gets the directory itself. Instead "
            "of `SERVING_MODEL_PATH`"
        ),
    )
    model_name: Named | None = Field(
        None,
        pattern=NAME_PATTERN,
        description="Name in URLs, responses and metrics (1-128 of `A-Za-z0-9_.-`)",
        json_schema_extra={"shown_default": "file stem"},
    )
    model_version: Versioned = Field(
        "1",
        pattern=VERSION_PATTERN,
        description=(
            "Version reported (1-128 of `A-Za-z0-9_.:-`, not ending in `:predict`, `:classify` or "
            "`:regress`); a request pinning another gets 409"
        ),
    )
    max_models: int = Field(
        8,
        ge=1,
        description=(
            "Most entries `SERVING_MODELS` may list (more stops start-up), or versions a "
            "model repository serves (those past it are refused); each is a model copy per "
            "worker"
        ),
    )
    models: Annotated[list[ModelSpec] | None, NoDecode] = Field(
        None,
        description=(
            "Several models/versions per worker: a JSON list (or the path of a JSON file)"
            ' of `{"name", "version", "path", "format", "class", "sha256", '
            '"max_batch_size", "max_batch_latency_ms", "batch_policy", "max_queue_depth",'
            ' "compile", "share", "labels"}` (`labels`: TF Serving version labels, see '
            "below); only `name` and `path` are required, left-out batching fields (and "
            "`compile`, `share`) take the server-wide value. The first entry is what "
            "`/predict` serves. Replaces "
            "`SERVING_MODEL_PATH`/`_NAME`/`_VERSION`/`_FORMAT`/`_SHA256`"
        ),
    )
    model_sha256: str | None = Field(
        None,
        pattern=r"^[0-9a-fA-F]{64}$",
        description="Expected SHA-256 of the model file, checked before it is loaded",
    )
    model_repository: DirectoryPath | None = Field(
        None,
        description=(
            "A model repository folder, Triton's and TF Serving's layout: "
            "`<model>/<version>/<artifact>` and an optional `<model>/config.json` (version "
            "policy, labels, batching, SHA-256 per version; see docs/repository.md). Read at "
            "start and at each SIGHUP; an entry that cannot be served is named in the log "
            "and the V2 repository index, the rest served. Instead of `SERVING_MODELS` and "
            "`SERVING_MODEL_PATH`"
        ),
    )
    model_control: Literal["none", "poll", "explicit"] | None = Field(
        None,
        description=(
            "How the server follows `SERVING_MODEL_REPOSITORY`, as Triton names it: `poll` "
            "(every `SERVING_REPOSITORY_POLL_S`, a change read once it has stood still for "
            "one interval; nothing unloaded while the repository cannot be listed or is "
            "empty), `none` (read at start and at each SIGHUP only) or `explicit` (every "
            "model loaded at start, then only `POST /v2/repository/models/<name>/load` and "
            "`/unload` change which are served)"
        ),
        json_schema_extra={"shown_default": "`poll` with a repository"},
    )
    repository_poll_s: float = Field(
        5.0,
        ge=0.2,
        le=3600,
        allow_inf_nan=False,
        description=(
            "Seconds between two looks at the model repository (`poll`; each look lists "
            "and stats every file of every version folder, in the master)"
        ),
    )
    allow_world_writable_model: bool = Field(
        False,
        description=(
            "Load a model (and its schema file) that a user other than root and the "
            "server's could replace: the file, a directory above it or a symlink on the "
            "way (refused by default, naming which and the fix)"
        ),
    )
    keep_model_n_jobs: bool = Field(
        False,
        description=(
            "Keep the `n_jobs` a scikit-learn model was trained with; by default each "
            "`n_jobs` (pipeline steps included) is set to 1 at load and logged: a worker "
            "runs one predict call at a time"
        ),
    )
    skops_trusted_types: str = Field(
        "",
        description=(
            "Comma list of types to trust in `.skops` files beyond skops' defaults, such "
            "as `numpy.dtype` for a `OneHotEncoder`; a refusal names the types. An MLflow"
            " `MLmodel`'s own `skops_trusted_types` is never read: a model cannot vouch "
            "for itself"
        ),
    )
    onnx_providers: str = Field(
        "auto",
        description=(
            "ONNX Runtime execution providers: `auto` (CUDA when a GPU is really usable, "
            "else CPU, without error logs) or a list in order of preference: `cuda,cpu`, "
            "`tensorrt,cuda,cpu`. A GPU provider this host cannot run stops start-up with"
            " the reason"
        ),
    )
    cuda_device: int | None = Field(
        None,
        ge=0,
        description="CUDA device index for every worker",
        json_schema_extra={"shown_default": "worker *k* → GPU *k mod n*"},
    )
    onnx_optimized_model_path: Path | None = Field(
        None,
        description=(
            "Save the optimized ONNX graph here and reuse it on later starts while the "
            "source file, providers and onnxruntime version are unchanged"
        ),
    )

    @field_validator("models", mode="before")
    @classmethod
    def _read_models(cls, value: object) -> object:
        return read_model_list(value) if isinstance(value, str) else value

    @field_validator("models")
    @classmethod
    def _check_models(
        cls, models: list[ModelSpec] | None, info: ValidationInfo
    ) -> list[ModelSpec] | None:
        if models is not None:
            entries = [(spec.name, spec.version, spec.labels) for spec in models]
            check_listing(entries, info.data.get("max_models", 8))
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

    #: The repository as read when these settings were (``serving.repository.Scan``).
    _repository: Any = PrivateAttr(None)

    @model_validator(mode="after")
    def _read_repository(self) -> ModelFields:
        """Read ``model_repository`` once, here: the settings object carries what it found
        (a worker forked later serves what its master read)."""
        if self.model_repository is None:
            if self.model_control is not None:
                raise ValueError(
                    "SERVING_MODEL_CONTROL: follows a model repository: set "
                    "SERVING_MODEL_REPOSITORY too, or unset it"
                )
            return self
        others = [
            name for name, value in (("SERVING_MODELS", self.models),
            ("SERVING_MODEL_PATH", self.model_path), ("SERVING_MODEL_DIR", self.model_dir))
            if value is not None
        ]  # fmt: skip
        if others:
            raise ValueError(
                f"SERVING_MODEL_REPOSITORY: set it or {' and '.join(others)}, not both "
                "(one source of models)"
            )
        self._repository = self._scan(None, kept=_serving.get())
        return self

    def _scan(
        self,
        loaded: Mapping[str, Any] | None,
        excluded: Mapping[tuple[str, str], str] | None = None,
        kept: Mapping[str, Sequence[ModelSpec]] | None = None,
    ) -> Any:
        """``serving.repository.read`` of ``model_repository`` with these settings."""
        from serving.repository import read

        assert self.model_repository is not None
        return read(
            self.model_repository, max_models=self.max_models,
            allow_world_writable=self.allow_world_writable_model, loaded=loaded,
            excluded=excluded, kept=kept,
        )  # fmt: skip

    def selecting(
        self,
        loaded: Mapping[str, Any] | None,
        excluded: Mapping[tuple[str, str], str] | None = None,
        kept: Mapping[str, Sequence[ModelSpec]] | None = None,
    ) -> Self:
        """These settings serving only the repository models ``loaded`` names (None:
        all; each a ``serving.repository.Loaded``: explicit model control's load config
        and versions, what the load and unload calls left), none of the versions
        ``excluded`` (``(model, version)`` -> why: a worker could not load it), and, of a
        model whose ``config.json`` cannot be taken, the versions ``kept`` says it serves
        now. Reads the repository again.

        :raises ValueError: naming the variable, as when the settings are read.
        """
        copy = self.model_copy()
        copy._repository = self._scan(loaded, excluded, kept)
        return copy

    def polls_repository(self) -> bool:
        """Whether the server follows a model repository by looking at it."""
        return self.model_repository is not None and self.model_control in (None, "poll")

    def controls_explicitly(self) -> bool:
        """Whether only load and unload calls change the repository models served."""
        return self.model_repository is not None and self.model_control == "explicit"

    def entries(self) -> list[ModelSpec] | None:
        """The model versions named: ``SERVING_MODELS``' entries, or those the repository
        holds; None for the one model of ``SERVING_MODEL_PATH`` (``single_spec``)."""
        if self._repository is not None:
            return list(self._repository.specs)
        return self.models

    def refused_models(self) -> tuple[Any, ...]:
        """The repository's entries that cannot be served (``serving.repository.Refusal``),
        as read with these settings; none without a repository."""
        return self._repository.refused if self._repository is not None else ()

    def single_spec(self) -> ModelSpec:
        """The one model of ``model_path``/``model_dir``, ``model_name``,
        ``model_version``, ``model_format``, ``model_sha256`` and ``model_class`` as a
        ``SERVING_MODELS`` entry (its name the file's when not given). Reads the file
        system: a directory's one artifact.

        :raises ValueError: when a directory does not hold exactly one artifact.
        """
        path = artifact_of(self.model_path or self.model_dir or DEMO_MODEL_PATH, self.model_class)
        return ModelSpec(
            name=self.model_name or default_model_name(path),
            version=self.model_version,
            path=path,
            format=self.model_format,
            sha256=self.model_sha256,
            **{"class": self.model_class},
        )

    def version_labels(self, name: str) -> dict[str, str]:
        """Model ``name``'s TF Serving version labels (label -> version), from every
        ``SERVING_MODELS`` entry of that name."""
        labels: dict[str, str] = {}
        for spec in self.entries() or ():
            if spec.name == name:
                labels.update(spec.labels)
        return labels

    @model_validator(mode="after")
    def _check_model_format(self) -> ModelFields:
        path = self.model_path or self.model_dir
        check_format(path, self.model_format, self.model_class, self.model_sha256)
        return self

    @model_validator(mode="after")
    def _check_model_name(self) -> ModelFields:
        """A model served under its file's name needs a name URLs can carry."""
        if self.model_name is None and self.models is None and self.model_repository is None:
            path = self.model_path or self.model_dir or DEMO_MODEL_PATH
            name = default_model_name(artifact_of(path, self.model_class))
            if not re.fullmatch(NAME_PATTERN, name) or only_dots(name):
                raise ValueError(
                    f"SERVING_MODEL_NAME: the model's file name {name[:64]!r} is no model "
                    "name (1-128 of A-Za-z0-9_.-, not only dots): set SERVING_MODEL_NAME"
                )
        return self
