"""serving: a Gunicorn model server with per-worker dynamic micro-batching.

The names below are re-exported lazily: ``gunicorn.conf.py`` imports ``serving.server.hooks`` in
the master, and must be able to point prometheus-client at its multiprocess directory
before anything imports prometheus-client (it picks its value storage at import).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from serving.app import create_app as create_app
    from serving.batching.batcher import ThreadedBatcher as ThreadedBatcher
    from serving.loading import load_model as load_model
    from serving.model.loaders import ModelHandle as ModelHandle
    from serving.model.loaders import default_loaders as default_loaders
    from serving.settings import Settings as Settings

__all__ = [
    "ModelHandle",
    "Settings",
    "ThreadedBatcher",
    "create_app",
    "default_loaders",
    "load_model",
]
__version__ = "0.1.0"

_EXPORTS = {
    "create_app": "serving.app",
    "ThreadedBatcher": "serving.batching.batcher",
    "ModelHandle": "serving.model.loaders",
    "load_model": "serving.loading",
    "default_loaders": "serving.model.loaders",
    "Settings": "serving.settings",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'serving' has no attribute {name!r}")
