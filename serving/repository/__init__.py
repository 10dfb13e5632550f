"""A model repository folder (``SERVING_MODEL_REPOSITORY``) read into the model versions to
serve: ``scan`` (see README.md)."""

from __future__ import annotations

from serving.repository.config import ModelConfig, VersionPolicy
from serving.repository.scan import (
    OVER_LIMIT,
    PASSED_OVER,
    PINNED_FIELDS,
    UNLOADED,
    Loaded,
    Refusal,
    Scan,
    overridden,
    read,
    scan,
)

__all__ = [
    "OVER_LIMIT",
    "PASSED_OVER",
    "PINNED_FIELDS",
    "UNLOADED",
    "Loaded",
    "ModelConfig",
    "Refusal",
    "Scan",
    "VersionPolicy",
    "overridden",
    "read",
    "scan",
]
