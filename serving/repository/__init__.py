"""A model repository folder (``SERVING_MODEL_REPOSITORY``) read into the model versions to
serve: ``scan`` (see README.md)."""

from __future__ import annotations

from serving.repository.config import ModelConfig, VersionPolicy
from serving.repository.scan import Refusal, Scan, scan

__all__ = ["ModelConfig", "Refusal", "Scan", "VersionPolicy", "scan"]
