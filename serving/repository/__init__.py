"""A model repository folder (``SERVING_MODEL_REPOSITORY``) read into the model versions to
serve: ``scan`` (see README.md)."""

from __future__ import annotations

from serving.repository.config import ModelConfig, VersionPolicy
from serving.repository.scan import UNLOADED, Refusal, Scan, config_of, read, scan

__all__ = [
    "UNLOADED",
    "ModelConfig",
    "Refusal",
    "Scan",
    "VersionPolicy",
    "config_of",
    "read",
    "scan",
]
