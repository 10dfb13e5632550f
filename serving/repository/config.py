"""A repository model's optional ``config.json``: what Triton's model configuration and TF
Serving's model config say about a model folder, in Triton's JSON where they overlap.

    {"version_policy": {"latest": {"num_versions": 2}},
     "labels": {"stable": 3, "canary": 5},
     "max_batch_size": 16, "sha256": {"5": "9f2c..."}}

Every field is optional; an unknown one is refused (a typo would otherwise change
nothing, silently). ``version_policy`` is one of ``{"latest": {"num_versions": n}}`` (the
default, n = 1), ``{"all": {}}`` and ``{"specific": {"versions": [...]}}``, as Triton's
``ModelVersionPolicy``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from serving.model.custom import CLASS_PATTERN
from serving.model_settings import (
    BatchLatencyMs,
    BatchPolicy,
    BatchSize,
    Compile,
    ModelFormat,
    QueueDepth,
)

__all__ = ["ModelConfig", "VersionPolicy", "VERSION_DIGITS"]

#: A version folder's name: a positive integer, as Triton and TF Serving number them.
VERSION_DIGITS = r"^[1-9][0-9]{0,17}$"

Version = Annotated[int, Field(ge=1, lt=10**18)]
Label = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$")]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())


class _Latest(_Closed):
    num_versions: Annotated[int, Field(ge=1)] = 1


class _Specific(_Closed):
    versions: Annotated[list[Version], Field(min_length=1)]


class VersionPolicy(_Closed):
    """Which of a model's versions are served: exactly one of ``latest``, ``all`` and
    ``specific``."""

    latest: _Latest | None = None
    all: _Closed | None = None
    specific: _Specific | None = None

    @model_validator(mode="after")
    def _one(self) -> VersionPolicy:
        named = [k for k in ("latest", "all", "specific") if getattr(self, k) is not None]
        if len(named) != 1:
            raise ValueError(
                'name exactly one of "latest", "all" and "specific" '
                f"(got {', '.join(named) or 'none'})"
            )
        return self

    def select(self, versions: list[int]) -> list[int]:
        """The versions of ``versions`` (servable ones, any order) this policy serves,
        newest first."""
        newest = sorted(versions, reverse=True)
        if self.latest is not None:
            return newest[: self.latest.num_versions]
        if self.specific is not None:
            return [v for v in newest if v in self.specific.versions]
        return newest


class ModelConfig(_Closed):
    """``<repository>/<model>/config.json``."""

    format: ModelFormat | None = Field(None, description="As SERVING_MODEL_FORMAT.")
    class_: str | None = Field(None, alias="class", pattern=CLASS_PATTERN)
    version_policy: VersionPolicy = Field(default_factory=lambda: VersionPolicy(latest=_Latest()))
    labels: dict[Label, Version] = Field(default_factory=dict)
    sha256: dict[Annotated[str, Field(pattern=VERSION_DIGITS)], Annotated[str, Field(
        pattern=r"^[0-9a-fA-F]{64}$"
    )]] = Field(default_factory=dict)  # fmt: skip
    max_batch_size: BatchSize | None = None
    max_batch_latency_ms: BatchLatencyMs | None = None
    batch_policy: BatchPolicy | None = None
    max_queue_depth: QueueDepth | None = None
    compile: Compile | None = Field(None, description="As SERVING_COMPILE, for this model.")
    share: Literal["auto", "off"] | None = Field(
        None, description="As SERVING_SHARE_MODEL, for this model."
    )

    def batching(self) -> dict[str, Any]:
        """The batching fields (and ``compile``, ``share``) it sets, for each version's
        ``ModelSpec``."""
        names = ("max_batch_size", "max_batch_latency_ms", "batch_policy", "max_queue_depth",
                 "compile", "share")  # fmt: skip
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}
