"""Model loaders: turn an artifact on disk (pickle, joblib, skops, ONNX) into a ``ModelHandle``.

A ``ModelHandle`` is what the batcher calls: ``predict_batch(batch)`` takes the typed batch
(``(n_instances, n_features)`` float64 or int64, or a record array ``(n_instances,)`` with
one field per feature; see ``ModelHandle``) and returns named outputs with one row per
instance: ``predictions`` always, ``probabilities`` ``(n_instances, n_classes)`` for
classifiers that give them, in the order of ``handle.classes``.

Boundary: see README.md beside this file; joblib, skops and onnxruntime are imported when a
model of their format is loaded. Pickle and joblib execute code from the file when loading:
load them only from sources you trust. ONNX files hold a graph, not code.
"""

from __future__ import annotations

import io
import logging
import pickle
import pickletools
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from serving.errors import ModelLoadError
from serving.model.artifacts import (
    EXTENSIONS,
    check_artifact,
    find_artifact,
    format_from_path,
    model_name,
)
from serving.model.estimators import estimator_handle
from serving.model.examples import EXAMPLE_FILE, saved_examples
from serving.model.handle import ModelHandle, ModelLoader, Predictor
from serving.model.mlmodel import pyfunc_output
from serving.model.onnx_loader import OnnxLoader
from serving.model.schema import Feature, features_from_file, schema_file

__all__ = [
    "JoblibLoader",
    "ModelHandle",
    "ModelLoader",
    "OnnxLoader",
    "PickleLoader",
    "SkopsLoader",
    "Predictor",
    "check_artifact",
    "estimator_handle",
    "find_artifact",
    "format_from_path",
    "default_loaders",
    "load_model",
    "single_threaded",
]

log = logging.getLogger(__name__)

#: What a loader's error with no message of its own means (pickle's EOFError has none).
_SILENT: dict[type[BaseException], str] = {
    EOFError: "the file ends early (truncated, or still being written?)",
}


def declared_features(path: Path) -> tuple[Feature, ...] | None:
    """The features of the schema file beside ``path`` (``serving.model.schema``), if any.

    :raises ModelLoadError: when the schema file cannot be read.
    """
    found = schema_file(path)
    if found is None:
        return None
    try:
        return features_from_file(found)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(path, f"schema file {found.name}: {exc}") from None


class _EstimatorLoader(ModelLoader):
    """A file holding a scikit-learn style estimator, loaded from the bytes already read
    and checked (``check_artifact``); ``n_jobs`` set to 1 unless ``keep_n_jobs``
    (``SERVING_KEEP_MODEL_N_JOBS``), and its input schema read with it. Runs code from the
    file: trusted sources only."""

    format = ""

    def __init__(self, *, keep_n_jobs: bool = False) -> None:
        self.keep_n_jobs = keep_n_jobs

    @abstractmethod
    def _read(self, data: bytes, path: Path) -> Any:
        """The estimator in ``data`` (the bytes of the file at ``path``)."""

    def load(
        self, path: Path, data: bytes | None, *, name: str, version: str, threads: int = 1
    ) -> ModelHandle:
        if data is None:
            raise ModelLoadError(path, f"the {self.format} loader loads bytes, got none")
        model = self._read(data, path)
        if not self.keep_n_jobs:
            single_threaded(model, path)
        declared = declared_features(path)
        mlflow = declared is not None and schema_file(path) == path.with_name("MLmodel")
        try:
            output = pyfunc_output(path)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(path, str(exc)) from None
        handle = estimator_handle(
            model, name=name, version=version, format=self.format, source=path,
            declared=declared, nulls="estimator" if mlflow else "declared",
            pyfunc_output=output,
        )  # fmt: skip
        examples = saved_examples(path)  # MLflow's input_example, for the warm-up
        if examples is None:
            return handle
        return replace(handle, examples=examples, examples_from=EXAMPLE_FILE)


class PickleLoader(_EstimatorLoader):
    """``pickle`` files (``.pkl``, ``.pickle``). Runs code from the file: trusted sources only."""

    format = "pickle"

    def _read(self, data: bytes, path: Path) -> Any:
        return pickle.loads(data)


class JoblibLoader(_EstimatorLoader):
    """``joblib.dump`` files (``.joblib``). Runs code from the file: trusted sources only."""

    format = "joblib"

    def _read(self, data: bytes, path: Path) -> Any:
        import joblib

        return joblib.load(io.BytesIO(data))


class SkopsLoader(_EstimatorLoader):
    """``skops.io`` files (``.skops``: MLflow 3's default for scikit-learn models). skops
    rebuilds the estimator without pickle, and only from types it trusts: its defaults plus
    ``trusted`` (``SERVING_SKOPS_TRUSTED_TYPES``), which the operator sets. The list in an
    MLflow ``MLmodel`` file (``skops_trusted_types``) is never read: a crafted model could
    list code to run (MLflow GHSA-w582-9x45-8mpx)."""

    format = "skops"

    def __init__(self, *, keep_n_jobs: bool = False, trusted: Sequence[str] = ()) -> None:
        super().__init__(keep_n_jobs=keep_n_jobs)
        self.trusted = tuple(trusted)

    def _read(self, data: bytes, path: Path) -> Any:
        import skops.io

        untrusted = skops.io.get_untrusted_types(data=data)
        refused = sorted(set(untrusted) - set(self.trusted))
        if refused:
            raise ModelLoadError(
                path, f"the skops file holds types skops does not trust by default: "
                f"{', '.join(refused)}; if you trust this file, list them in "
                "SERVING_SKOPS_TRUSTED_TYPES (comma-separated). An MLmodel's "
                "skops_trusted_types is not read: a model cannot vouch for itself",
            )  # fmt: skip
        return skops.io.loads(data, trusted=untrusted)


def single_threaded(model: object, path: Path) -> None:
    """Set every ``n_jobs`` parameter of ``model`` (pipeline steps included, scikit-learn
    ``get_params``/``set_params``) that asks for more than one job to 1, logging it once.

    Why: a worker runs one predict call at a time on its ``SERVING_BLAS_THREADS`` CPUs; a
    forest trained with ``n_jobs=-1`` would start a joblib pool over every CPU of the
    machine for each batch, competing with the other workers (``SERVING_KEEP_MODEL_N_JOBS``
    keeps them).
    """
    get_params = getattr(model, "get_params", None)
    set_params = getattr(model, "set_params", None)
    if not callable(get_params) or not callable(set_params):
        return
    try:
        params = get_params(deep=True)
    except Exception:  # a get_params that does not follow scikit-learn's convention
        return
    changed = {
        key: value
        for key, value in params.items()
        if (key == "n_jobs" or key.endswith("__n_jobs")) and value not in (None, 1)
    }
    if changed:
        set_params(**dict.fromkeys(changed, 1))
        settings = ", ".join(f"{key}={value}" for key, value in sorted(changed.items()))
        log.info(
            "model %s: %s set to n_jobs=1 (one predict call per worker at a time; "
            "SERVING_KEEP_MODEL_N_JOBS=true keeps them)",
            path,
            settings,
        )


def default_loaders(
    *,
    keep_n_jobs: bool = False,
    skops_trusted_types: Sequence[str] = (),
    onnx: OnnxLoader | None = None,
    python: ModelLoader | None = None,
) -> dict[str, ModelLoader]:
    """The loader of each format, chosen here and nowhere else: ``pickle``, ``joblib``,
    ``skops`` (trusting ``skops_trusted_types`` beyond skops' defaults), ``onnx``
    (``onnx``, configured, or one on the default providers) and ``python`` when a class
    loader is given. Each model runtime builds its own (``serving.runtime``); add a format
    by adding an entry to the mapping passed to ``load_model``."""
    loaders: dict[str, ModelLoader] = {
        "pickle": PickleLoader(keep_n_jobs=keep_n_jobs),
        "joblib": JoblibLoader(keep_n_jobs=keep_n_jobs),
        "skops": SkopsLoader(keep_n_jobs=keep_n_jobs, trusted=skops_trusted_types),
        "onnx": onnx or OnnxLoader(),
    }
    if python is not None:
        loaders["python"] = python
    return loaders


def load_model(
    path: str | Path,
    fmt: str | None = None,
    *,
    name: str | None = None,
    version: str = "1",
    threads: int = 1,
    loaders: Mapping[str, ModelLoader] | None = None,
    data: bytes | None = None,
    pinned: bool = False,
) -> ModelHandle:
    """Load the artifact at ``path`` with the loader ``loaders`` has for ``fmt``.

    :param fmt: ``pickle``, ``joblib``, ``skops``, ``onnx``, ``python`` or another key of
        ``loaders``; ``None`` means from the extension (``.pkl``/``.pickle``, ``.joblib``,
        ``.skops``, ``.onnx``).
    :param name: model name for responses; defaults to the file stem, or the folder's
        name for a model MLflow saved (``model_name``).
    :param threads: intra-op threads the model may use (ONNX Runtime's session option).
    :param loaders: format -> loader (default: ``default_loaders()``); the runtime passes
        the ones its settings configure (``SERVING_ONNX_*``, ``SERVING_MODEL_CLASS``, ...).
    :param data: the file's bytes as ``check_artifact`` read and checked them; when None
        they are read here (a loader that ``reads_path`` is given None).
    :param pinned: ``data`` was checked against a SHA-256: refuse (``ModelLoadError``) a
        loader that reads the path itself instead of loading ``data``.
    :raises ModelLoadError: naming the path and the cause when the file is missing, the
        format unknown, or loading fails for any reason.
    """
    path = Path(path)
    if fmt is None:
        try:
            fmt = format_from_path(path)
        except ValueError as exc:
            raise ModelLoadError(path, str(exc)) from None
    loaders = default_loaders() if loaders is None else loaders
    loader = loaders.get(fmt)
    if loader is None:
        raise ModelLoadError(path, f"no loader for format {fmt!r} (known: {sorted(loaders)})")
    if not path.exists():  # a directory is a model for loaders that read one (python)
        raise ModelLoadError(path, "no such file")
    if loader.reads_path and pinned:
        raise ModelLoadError(
            path, f"the {fmt} loader ({type(loader).__name__}) reads the file itself, so "
            "the bytes checked (SHA-256, mode) may not be the bytes it loads",
        )  # fmt: skip
    name = name or model_name(path)
    try:
        if loader.reads_path:
            data = None
        elif data is None:
            data = path.read_bytes()
        return loader.load(path, data, name=name, version=version, threads=threads)
    except ModelLoadError:
        raise
    except Exception as exc:
        implied = EXTENSIONS.get(path.suffix.lower())
        hint = (
            f" (the file's extension says {implied}, but it was loaded as {fmt})"
            if implied is not None and implied != fmt
            else ""
        )
        cause = str(exc) or _SILENT.get(type(exc), "")
        if fmt in ("pickle", "joblib") and data and not _may_be_pickle(data):
            hint += f" (not a pickle or joblib file: it starts with {data[:8].hex(' ')})"
        raise ModelLoadError(path, f"{type(exc).__name__}: {cause}{hint}") from exc


#: The first bytes a pickle (any opcode) or a joblib file (a pickle, or one compressed
#: with zlib, gzip, bz2, xz, lzma or lz4) can start with.
_PICKLE_STARTS = frozenset(ord(op.code) for op in pickletools.opcodes) | {
    0x78,
    0x1F,
    0x42,
    0xFD,
    0x5D,
    0x04,
    0x5A,
}


def _may_be_pickle(data: bytes) -> bool:
    """Whether ``data`` could be a pickle or joblib file at all: an unpickler reading
    other bytes fails with whatever its first opcode lookup raises (``KeyError: 216``)."""
    return data[0] in _PICKLE_STARTS
