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
import re
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from serving.errors import InvalidInput, ModelLoadError
from serving.model.artifacts import (
    EXTENSIONS,
    check_artifact,
    find_artifact,
    format_from_path,
    model_name,
)
from serving.model.handle import ModelHandle, ModelLoader, Outputs, Predictor
from serving.model.labels import OnePass, label_rule
from serving.model.onnx_loader import OnnxLoader
from serving.model.schema import (
    Feature,
    feature,
    features_from_file,
    frame_builder,
    merge_features,
    schema_file,
)
from serving.model.schema_sklearn import estimator_features, estimator_missing

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


#: scikit-learn's finiteness check (sklearn.utils.validation._assert_all_finite) on the
#: input of a pipeline step: finite request values that overflowed in an earlier step.
_OVERFLOW = re.compile(r"Input \w* ?contains (infinity|NaN|a value too large)")


def _final_estimator(model: object) -> object:
    steps = getattr(model, "steps", None)  # sklearn Pipeline
    return _final_estimator(steps[-1][1]) if steps else model


def _per_output(classes: object) -> bool:
    """Whether ``classes_`` holds one array per output (multi-output scikit-learn
    classifiers), not one label per class."""
    return isinstance(classes, list | tuple) and any(np.ndim(c) for c in classes)


def estimator_handle(
    model: Predictor,
    *,
    name: str,
    version: str,
    format: str,
    source: Path | None = None,
    declared: tuple[Feature, ...] | None = None,
) -> ModelHandle:
    """A handle for a scikit-learn style estimator (pipelines included).

    ``n_features`` comes from ``n_features_in_`` and ``classes`` from ``classes_`` where
    the estimator has them; ``probabilities`` is produced when ``predict_proba`` exists.
    The input schema is ``declared`` (a schema file beside the model), with what the
    estimator tells (``serving.model.schema_sklearn``). A model fitted on a DataFrame
    (``feature_names_in_``) is called with a pandas DataFrame of its training column
    names, each column of its feature's type; others get the batch array.

    A classifier whose final estimator ``serving.model.labels.label_rule`` knows runs both
    ``predict`` and ``predict_proba`` on its first batch (the warm-up's sample rows, on the
    worker) and, when every label derived from the probabilities is predict's own (value and
    dtype), only ``predict_proba`` from then on; otherwise both per batch, as every other
    model, with a warning saying what differed.

    :raises ModelLoadError: when the object has no ``predict``, or ``declared`` names
        features the model was not fitted on.
    """
    if not callable(getattr(model, "predict", None)):
        raise ModelLoadError(source, f"the loaded {type(model).__name__} object has no predict()")
    predict_proba, classes = _probability_outputs(model, name)
    n_features = getattr(model, "n_features_in_", None)
    features = _estimator_features(model, n_features, declared, source)
    named = getattr(model, "feature_names_in_", None) is not None
    feature_names = tuple(f.name for f in features) if features and (named or declared) else None
    to_input = frame_builder(features) if named and features else _array_input
    label_array = np.asarray(classes) if classes is not None else None
    rule = label_rule(_final_estimator(model), classes) if predict_proba is not None else None
    one_pass = OnePass(label_array, rule, name=name) if rule and label_array is not None else None
    predict_outputs = _outputs_of(model.predict, predict_proba, to_input, one_pass)
    return ModelHandle(
        name=name,
        version=version,
        format=format,
        predict_batch=_refusing_overflow(predict_outputs),
        source=source,
        n_features=int(n_features) if n_features is not None else None,
        classes=tuple(label_array.tolist()) if label_array is not None else None,
        feature_names=feature_names,
        features=features,
        output_names=("predictions",) + (("probabilities",) if predict_proba is not None else ()),
    )


def _probability_outputs(model: Predictor, name: str) -> tuple[Any, Any]:
    """``(predict_proba, classes_)`` of ``model``, each None where it has none; both None for
    a multi-output classifier, answered without probabilities."""
    # absent (AttributeError) on pipelines ending in a regressor
    predict_proba = getattr(model, "predict_proba", None)
    classes = getattr(model, "classes_", None)
    if _per_output(classes):
        # A multi-output classifier: classes_ and predict_proba's arrays per output, not
        # per instance (merged into one array they gave each instance another's rows).
        log.info("model %r: multi-output classifier, answered without probabilities", name)
        return None, None
    return predict_proba, classes


def _estimator_features(
    model: Predictor,
    n_features: Any,
    declared: tuple[Feature, ...] | None,
    source: Path | None,
) -> tuple[Feature, ...] | None:
    """The input schema: ``declared`` merged with what the estimator tells (its columns, or
    ``n_features`` float64 features named by position).

    :raises ModelLoadError: when ``declared`` names features the model was not fitted on.
    """
    inferred = estimator_features(model)
    if inferred is None and n_features is not None:
        missing = estimator_missing(model)
        inferred = tuple(feature(str(j), "float", np.float64, missing=missing)
                         for j in range(int(n_features)))  # fmt: skip
    try:
        return merge_features(declared, inferred)
    except ValueError as exc:
        raise ModelLoadError(source, str(exc)) from None


def _outputs_of(
    predict: Any, predict_proba: Any, to_input: Any, one_pass: OnePass | None
) -> Callable[[npt.NDArray[Any]], Outputs]:
    """``batch -> {"predictions", "probabilities"?}``: ``predict`` and ``predict_proba`` on
    the model's input built from the batch, or only ``predict_proba`` once ``one_pass``
    holds (labels derived from the probabilities, ties asked of ``predict``)."""

    def predict_outputs(batch: npt.NDArray[Any]) -> Outputs:
        rows = to_input(batch)
        if one_pass is not None and one_pass.holds:
            assert predict_proba is not None
            probabilities = np.asarray(predict_proba(rows))
            labels = one_pass.labels(
                probabilities, lambda tied: np.asarray(predict(to_input(batch[tied])))
            )
            return {"predictions": labels, "probabilities": probabilities}
        outputs = {"predictions": np.asarray(predict(rows))}
        if predict_proba is not None:
            outputs["probabilities"] = np.asarray(predict_proba(rows))
        if one_pass is not None and one_pass.holds is None:  # the first batch: the warm-up's
            one_pass.check(outputs["predictions"], outputs["probabilities"])
        return outputs

    return predict_outputs


def _refusing_overflow(
    predict_outputs: Callable[[npt.NDArray[Any]], Outputs],
) -> Callable[[npt.NDArray[Any]], Outputs]:
    """``predict_outputs`` with values too large for the model's arithmetic refused as
    ``InvalidInput`` (a 4xx: the caller's values, not a broken model).

    scikit-learn's own finiteness check stays on: finite input can still overflow inside
    a pipeline (1e308 through a StandardScaler), and its error beats NaN probabilities.
    """

    def predict_batch(rows: npt.NDArray[Any]) -> Outputs:
        try:
            # Overflow is reported by the finiteness check of the next step (below), not
            # as a RuntimeWarning per batch on stderr.
            with np.errstate(over="ignore", invalid="ignore"):
                return predict_outputs(rows)
        except ValueError as exc:
            if _OVERFLOW.search(str(exc)):
                raise InvalidInput(
                    f"the model cannot compute with these values: {exc} (finite, but too "
                    "large for the model's arithmetic)",
                    [{"loc": "instances", "msg": str(exc), "type": "model_overflow"}],
                ) from exc
            raise

    return predict_batch


def _array_input(batch: npt.NDArray[Any]) -> Any:
    """A record batch as a 2-D object array for a model fitted on an array; a matrix as is."""
    if batch.dtype.names is None:
        return batch
    return np.stack([batch[name].astype(object) for name in batch.dtype.names], axis=1)


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
        return estimator_handle(
            model, name=name, version=version, format=self.format, source=path,
            declared=declared_features(path),
        )  # fmt: skip


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
