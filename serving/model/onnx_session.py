"""An ONNX Runtime session: its options (threads, graph optimizations), its providers,
and the optimized graph saved once and reused across starts
(``SERVING_ONNX_OPTIMIZED_MODEL_PATH``; onnxruntime docs, "Graph Optimizations": offline
mode).

Boundary: standard library and ``serving`` core modules; onnxruntime is imported when a
session is made.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
from pathlib import Path
from typing import Any

from serving.errors import ModelLoadError
from serving.model.providers import ProviderSelection

__all__ = ["new_session"]

log = logging.getLogger(__name__)


def new_session(
    path: Path,
    data: bytes,
    threads: int,
    selection: ProviderSelection,
    optimized_model_path: Path | None = None,
) -> Any:
    """An ``onnxruntime.InferenceSession`` of ``data`` (the file at ``path``'s bytes,
    already checked): intra-op ``threads``, inter-op 1, every graph optimization, on
    ``selection``'s providers. With ``optimized_model_path``, the optimized graph is saved
    there (with a sidecar naming the source, its digest, the providers and the
    onnxruntime version) and reused on later starts while they are unchanged.

    :raises ModelLoadError: when the optimized graph's folder is not writable.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    cached = optimized_model_path
    if cached is None:
        return ort.InferenceSession(data, options, providers=selection.providers)
    stat = path.stat()
    key = {
        "source": str(path.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sha256": hashlib.sha256(data).hexdigest(),
        "providers": [p if isinstance(p, str) else p[0] for p in selection.providers],
        "onnxruntime": ort.__version__,
        "machine": platform.machine(),
    }
    sidecar = cached.with_name(cached.name + ".json")
    if cached.is_file() and _read_json(sidecar) == key:
        # Already optimized: skipping the optimizers is what keeps start-up fast
        # (onnxruntime docs, "Graph Optimizations": offline mode).
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        log.info("reusing the optimized graph %s", cached)
        return ort.InferenceSession(str(cached), options, providers=selection.providers)
    if not os.access(cached.parent, os.W_OK):
        raise ModelLoadError(
            path, f"cannot write the optimized graph to {cached} (its folder is not "
            "writable); fix SERVING_ONNX_OPTIMIZED_MODEL_PATH",
        )  # fmt: skip
    temporary = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
    options.optimized_model_filepath = str(temporary)
    session = ort.InferenceSession(data, options, providers=selection.providers)
    os.replace(temporary, cached)  # workers racing here write the same graph
    temporary.write_text(json.dumps(key))
    os.replace(temporary, sidecar)
    log.info("saved the optimized graph to %s", cached)
    return session


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
