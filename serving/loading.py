"""Reading, checking and loading one model's artifact: what a worker and the master share.

``load_artifact(model, loaders)`` is the one way the server turns a model's settings
(``ModelSettings``) into a ``ModelHandle``: the file's owner and mode and its SHA-256
checked (``check_artifact``), then those bytes loaded by the loader ``model_loaders``
configures for its format. A worker
calls it through ``ModelRuntime`` (``serving.runtime``); the Gunicorn master calls it to
load a model once for every worker (``serving.server.sharing``). It never calls predict:
the master must not start a BLAS/OpenMP thread pool that its children would inherit
without the threads.

Boundary: no Flask, werkzeug or Gunicorn, and no prometheus-client (the master imports this
module and must not create metric files).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Literal

from serving.model.artifacts import check_model_path, format_from_path, tree_sha256
from serving.model.artifacts import model_name as default_model_name
from serving.model.custom import PythonLoader
from serving.model.handle import ModelHandle, ModelLoader
from serving.model.loaders import check_artifact, default_loaders
from serving.model.loaders import load_model as load_bytes
from serving.model.onnx_loader import OnnxLoader
from serving.model_settings import ModelSettings
from serving.observe.memory import Look

__all__ = [
    "AUTO_COMPILE_MAX_NODES",
    "Stage",
    "compiled",
    "describe_features",
    "load_artifact",
    "load_model",
    "may_compile",
    "model_loaders",
]

log = logging.getLogger(__name__)

Stage = Literal["reading", "loading", "compiling", "warming up"]

#: Under ``compile=auto`` a tree model (scikit-learn's decision trees, forests, gradient
#: boosting, and XGBoost: where the library's fixed cost per call is largest) is compiled
#: unless its trees have more nodes than this; such a model is served by its own library,
#: whose one copy the workers share, while ONNX Runtime copies a tree ensemble into every
#: worker (docs/models.md, "Compiled to ONNX Runtime").
AUTO_COMPILE_MAX_NODES = 250_000
_LIBRARY_NAMES = {"sklearn": "scikit-learn", "xgboost": "XGBoost", "lightgbm": "LightGBM"}


def model_loaders(model: ModelSettings, worker_slot: int = 0) -> dict[str, ModelLoader]:
    """The loaders one model's settings configure: ``keep_n_jobs`` for pickle, joblib and
    skops, ``skops_trusted_types`` for skops, the ONNX Runtime providers and CUDA device
    (with ``worker_slot``) for ONNX, ``model_class`` for ``python``."""
    onnx = OnnxLoader(
        model.onnx_providers,
        cuda_device=model.cuda_device,
        worker_slot=worker_slot,
        optimized_model_path=model.onnx_optimized_model_path,
    )
    python = PythonLoader(model.model_class) if model.model_class is not None else None
    return default_loaders(
        keep_n_jobs=model.keep_n_jobs,
        skops_trusted_types=list(model.skops_trusted_types),
        onnx=onnx,
        python=python,
    )


def load_artifact(
    model: ModelSettings,
    loaders: Mapping[str, ModelLoader] | None = None,
    enter: Callable[[Stage], None] = lambda stage: None,
) -> ModelHandle:
    """Read and check the model's artifact once, then load those bytes (the bytes
    checked are the bytes loaded, never the path again): its owner and mode (unless
    ``allow_world_writable``) and its SHA-256 (``sha256``). The handle carries the
    SHA-256 of the bytes loaded (the repository index shows it) and the memory its load
    added (``loaded_bytes``: PSS before and after, ``serving.observe.memory``; with the
    libraries it imported first, ``loaded_imports``). Each stage
    is logged with its size and time; ``enter(stage)`` is called as it starts
    (``reading``, ``loading``). BLAS/OpenMP threads are not pinned here: the caller does
    (after loading, since pinning reaches only the libraries already loaded).

    :param loaders: format -> loader; default: those ``model`` configures
        (``model_loaders``).
    :raises ModelLoadError: naming the path and the cause.
    """
    path, fmt = model.path, model.format
    if path is None:
        raise ValueError(f"model {model.name!r} was handed over in memory: no artifact to load")
    before = Look.now()
    loaders = model_loaders(model) if loaders is None else loaders
    loader = loaders.get(fmt)
    enter("reading")
    started = time.perf_counter()
    if loader is not None and loader.reads_path:
        # A model class reads its own path (a file or a directory): nothing to read,
        # but who may replace it is checked all the same.
        check_model_path(path, model.allow_world_writable)
        data = None
    else:
        data = check_artifact(path, model.sha256, model.allow_world_writable)
        log.info(
            "model %s: read and checked %.1f MiB (%.2f s)",
            path, len(data) / 2**20, time.perf_counter() - started,
        )  # fmt: skip
    enter("loading")
    started = time.perf_counter()
    handle = load_bytes(
        path,
        fmt,
        name=model.name,
        version=model.version,
        threads=model.blas_threads,
        loaders=loaders,
        data=data,
        pinned=model.sha256 is not None,
    )
    log.info(
        "model %r: loaded as %s, %s (%.2f s)",
        handle.name, handle.format, describe_features(handle), time.perf_counter() - started,
    )  # fmt: skip
    # the bytes loaded; a path the loader read itself: its files, read again
    digest = hashlib.sha256(data).hexdigest() if data is not None else _tree_digest(path)
    del data  # not counted as the model's memory
    added, imported = before.added()
    return replace(
        handle, sha256=digest or handle.sha256, loaded_bytes=added, loaded_imports=imported
    )


def _tree_digest(path: Path) -> str | None:
    """``tree_sha256(path)``, or None when a file cannot be read again."""
    try:
        return tree_sha256(path)
    except OSError:
        return None


def load_model(
    path: str | Path,
    fmt: str | None = None,
    *,
    name: str | None = None,
    version: str = "1",
    sha256: str | None = None,
    loaders: Mapping[str, ModelLoader] | None = None,
    allow_world_writable: bool = False,
) -> ModelHandle:
    """Load the artifact at ``path`` as the server does (``load_artifact``): its owner and
    mode checked (and ``sha256`` when given), then those bytes loaded by the loader of
    ``fmt`` (default: from the extension) among ``loaders`` (default:
    ``default_loaders()``); its schema file read beside it. The public way to load a model.

    :param name: for responses; default: the file's stem (an MLflow folder's name).
    :raises ModelLoadError: naming the path and the cause.

    Usage::

        handle = serving.load_model("models/churn.joblib")
        app = serving.create_app(models=[handle])
    """
    path = Path(path)
    model = ModelSettings(
        name=name or default_model_name(path), version=version, path=path,
        format=fmt or format_from_path(path), sha256=sha256,
        allow_world_writable=allow_world_writable,
    )  # fmt: skip
    return load_artifact(model, loaders)


def compiled(
    handle: ModelHandle,
    model: ModelSettings,
    worker_slot: int = 0,
    *,
    max_nodes: int = AUTO_COMPILE_MAX_NODES,
) -> ModelHandle:
    """``handle`` compiled to ONNX Runtime as ``model.compile`` says
    (``serving.model.compiled``), or ``handle`` itself, with one line saying why. Call it in
    the worker (ONNX Runtime sessions do not survive ``fork()``); it runs the estimator on
    the parity rows. Never raises: a model that does not compile is served as it is.

    :param max_nodes: under ``compile=auto``, the most tree nodes a model compiled has."""
    from serving.model.compiled import NotCompiled, compile_handle, tree_nodes

    if not may_compile(handle, model):
        return handle
    library = _LIBRARY_NAMES[handle.engine]

    if model.compile == "auto":
        nodes = tree_nodes(handle.estimator)
        if not nodes:
            return handle  # not a tree model: compiled only with SERVING_COMPILE=on
        left = _left_alone(handle, nodes, max_nodes)
        if left is not None:
            log.info("model %r: served by %s: %s", handle.name, library, left)
            return handle
    started = time.perf_counter()
    try:
        result = compile_handle(
            handle,
            providers=model.onnx_providers,
            cuda_device=model.cuda_device,
            worker_slot=worker_slot,
            threads=model.blas_threads,
            tolerance=model.compile_tolerance,
        )
    except NotCompiled as exc:  # no fault under auto (a warning where asked for: on)
        level = logging.WARNING if model.compile == "on" else logging.INFO
        log.log(level, "model %r: served by %s, not compiled: %s", handle.name, library, exc)
        return handle
    except Exception as exc:  # a converter's or onnxruntime's bug must not stop the model
        log.warning(
            "model %r: served by %s, compiling failed: %s: %s",
            handle.name, library, type(exc).__name__, (str(exc) or "-").splitlines()[0][:300],
        )  # fmt: skip
        return handle
    log.info(
        "model %r: compiled to ONNX Runtime on %s, its answers equal %s's on the parity "
        "rows (within %g; %.2f s)", handle.name, result.execution_provider, library,
        model.compile_tolerance, time.perf_counter() - started,
    )  # fmt: skip
    return result


def may_compile(handle: ModelHandle, model: ModelSettings) -> bool:
    """Whether ``compiled`` tries ``handle`` at all: a scikit-learn, XGBoost or LightGBM
    model, ``SERVING_COMPILE`` not ``off``."""
    return model.compile != "off" and handle.engine in _LIBRARY_NAMES


def _left_alone(handle: ModelHandle, nodes: int, max_nodes: int) -> str | None:
    """Why ``SERVING_COMPILE=auto`` leaves a tree model to its library, or None."""
    if handle.engine == "lightgbm":
        return (
            "it compares each value in float64, which a float32 graph cannot match within "
            "a float32 step of a threshold"
        )
    if nodes > max_nodes:
        return (
            f"its trees have {nodes} nodes, over the {max_nodes} that SERVING_COMPILE=auto "
            "compiles (ONNX Runtime would copy them into every worker; SERVING_COMPILE=on "
            "compiles it anyway)"
        )
    return None


def describe_features(handle: ModelHandle) -> str:
    """``30 features``, ``4 features (2 string, 2 float)`` or ``features not known``."""
    if not handle.features:
        return "features not known (each request's own width)"
    kinds: dict[str, int] = {}
    for f in handle.features:
        kinds[f.kind] = kinds.get(f.kind, 0) + 1
    if len(kinds) == 1:
        return f"{len(handle.features)} {next(iter(kinds))} features"
    parts = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
    return f"{len(handle.features)} features ({parts})"
