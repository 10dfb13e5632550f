"""Model loaders: turn an artifact on disk (pickle, joblib, ONNX) into a ``ModelHandle``.

A ``ModelHandle`` is what the batcher calls: ``predict_batch(rows)`` takes a float array
of shape ``(n_instances, n_features)`` and returns named outputs with one row per
instance: ``predictions`` always, ``probabilities`` ``(n_instances, n_classes)`` for
classifiers that give them, in the order of ``handle.classes``.

Boundary: imports only the standard library, numpy and ``serving.errors`` at import time
(no Flask, no pydantic, no prometheus); joblib and onnxruntime are imported when a model
of their format is loaded. Pickle and joblib execute code from the file when loading:
load them only from sources you trust. ONNX files hold a graph, not code.
"""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
import stat
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from serving.errors import ModelLoadError

__all__ = [
    "JoblibLoader",
    "ModelHandle",
    "ModelLoader",
    "OnnxLoader",
    "PickleLoader",
    "Predictor",
    "check_artifact",
    "estimator_handle",
    "format_from_path",
    "load_model",
    "register_loader",
]

log = logging.getLogger(__name__)

Outputs = dict[str, npt.NDArray[Any]]


class Predictor(Protocol):
    """Anything with a scikit-learn style ``predict(X)``; ``predict_proba`` is optional."""

    def predict(self, X: npt.NDArray[Any], /) -> Any: ...


@dataclass(frozen=True)
class ModelHandle:
    """A loaded model, ready to be called by the batcher.

    :param predict_batch: ``(n_instances, n_features)`` float64 -> outputs of ``n_instances``
        rows (``predictions``, optionally ``probabilities``).
    :param n_features: features per instance when the model tells it, else ``None``.
    :param classes: class labels in the column order of ``probabilities``, if known.
    :param input_dtype: the element type the model computes in (``np.float32`` for most
        ONNX graphs); values outside its range are refused before they reach the model.

    Usage::

        handle = ModelHandle.from_callable(lambda X: X.sum(axis=1), name="sum", version="1")
        handle.predict_batch(np.ones((2, 3)))        # {"predictions": array([3., 3.])}
    """

    name: str
    version: str
    format: str
    predict_batch: Callable[[npt.NDArray[Any]], Outputs]
    source: Path | None = None
    n_features: int | None = None
    classes: tuple[Any, ...] | None = None
    #: The element type the model computes in; rows outside its range are refused (422).
    input_dtype: npt.DTypeLike = np.float64

    @classmethod
    def from_callable(
        cls,
        fn: Callable[[npt.NDArray[Any]], Any],
        *,
        name: str,
        version: str,
        n_features: int | None = None,
        classes: tuple[Any, ...] | None = None,
    ) -> ModelHandle:
        """Wrap an in-memory function: ``fn(rows)`` returns an array of predictions (one per
        row) or a mapping of named outputs."""

        def predict_batch(rows: npt.NDArray[Any]) -> Outputs:
            result = fn(rows)
            if isinstance(result, Mapping):
                return {key: np.asarray(value) for key, value in result.items()}
            return {"predictions": np.asarray(result)}

        return cls(name, version, "callable", predict_batch, None, n_features, classes)

    def warmup(self, n_instances: int) -> bool:
        """Run one batch of ``n_instances`` zero rows, so the first real request does not pay
        for lazy initialisation. Returns False (and does nothing) when ``n_features`` is
        unknown. Exceptions from the model propagate."""
        if self.n_features is None:
            return False
        self.predict_batch(np.zeros((n_instances, self.n_features)))
        return True


#: scikit-learn classifiers whose ``predict`` is the argmax of ``predict_proba`` (ties
#: included), checked against their source and by tests/test_loaders.py. For these one
#: ``predict_proba`` call gives both outputs, halving the per-batch cost (a 300-tree
#: forest walks every tree once instead of twice). Others (SVC with probability=True,
#: whose Platt-scaled probabilities can disagree with predict) get both calls.
ARGMAX_CLASSIFIERS = frozenset(
    {
        "DecisionTreeClassifier",
        "ExtraTreeClassifier",
        "ExtraTreesClassifier",
        "HistGradientBoostingClassifier",
        "LogisticRegression",
        "MLPClassifier",
        "RandomForestClassifier",
    }
)


def _final_estimator(model: object) -> object:
    steps = getattr(model, "steps", None)  # sklearn Pipeline
    return _final_estimator(steps[-1][1]) if steps else model


def estimator_handle(
    model: Predictor, *, name: str, version: str, format: str, source: Path | None = None
) -> ModelHandle:
    """A handle for a scikit-learn style estimator (pipelines included).

    ``n_features`` comes from ``n_features_in_`` and ``classes`` from ``classes_`` where
    the estimator has them; ``probabilities`` is produced when ``predict_proba`` exists.
    """
    if not callable(getattr(model, "predict", None)):
        raise ModelLoadError(source, f"the loaded {type(model).__name__} object has no predict()")
    predict = model.predict
    # absent (AttributeError) on pipelines ending in a regressor
    predict_proba = getattr(model, "predict_proba", None)
    classes = getattr(model, "classes_", None)
    n_features = getattr(model, "n_features_in_", None)
    final = _final_estimator(model)
    from_proba = (
        predict_proba is not None
        and classes is not None
        and type(final).__module__.startswith("sklearn.")
        and type(final).__name__ in ARGMAX_CLASSIFIERS
    )
    label_array = np.asarray(classes) if classes is not None else None

    # scikit-learn's own finiteness check stays on: finite input can still overflow inside
    # a pipeline (1e308 through a StandardScaler), and its error beats NaN probabilities.
    def predict_batch(rows: npt.NDArray[Any]) -> Outputs:
        if from_proba:
            assert predict_proba is not None and label_array is not None
            probabilities = np.asarray(predict_proba(rows))
            return {
                "predictions": label_array.take(probabilities.argmax(axis=1)),
                "probabilities": probabilities,
            }
        outputs = {"predictions": np.asarray(predict(rows))}
        if predict_proba is not None:
            outputs["probabilities"] = np.asarray(predict_proba(rows))
        return outputs

    return ModelHandle(
        name=name,
        version=version,
        format=format,
        predict_batch=predict_batch,
        source=source,
        n_features=int(n_features) if n_features is not None else None,
        classes=tuple(label_array.tolist()) if label_array is not None else None,
    )


class ModelLoader(ABC):
    """Loads one artifact format. Subclass it and ``register_loader`` it for a new format."""

    @abstractmethod
    def load(self, path: Path, *, name: str, version: str, threads: int = 1) -> ModelHandle:
        """Load ``path`` into a handle; ``threads`` is the intra-op thread budget.

        :raises ModelLoadError: when the file cannot be read or is not a usable model.
        """


class PickleLoader(ModelLoader):
    """``pickle`` files (``.pkl``, ``.pickle``). Runs code from the file: trusted sources only."""

    def load(self, path: Path, *, name: str, version: str, threads: int = 1) -> ModelHandle:
        with path.open("rb") as file:
            model = pickle.load(file)
        return estimator_handle(model, name=name, version=version, format="pickle", source=path)


class JoblibLoader(ModelLoader):
    """``joblib.dump`` files (``.joblib``). Runs code from the file: trusted sources only."""

    def load(self, path: Path, *, name: str, version: str, threads: int = 1) -> ModelHandle:
        import joblib

        model = joblib.load(path)
        return estimator_handle(model, name=name, version=version, format="joblib", source=path)


_ONNX_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
}
_PROBABILITY_OUTPUTS = ("probabilities", "output_probability")


class OnnxLoader(ModelLoader):
    """ONNX graphs through onnxruntime on the CPU execution provider.

    Single-input graphs of shape ``(batch, n_features)``. skl2onnx classifiers (outputs
    ``label`` and ``probabilities``, ZipMap on or off) give ``predictions`` and
    ``probabilities``; class labels come from the ``classes`` metadata entry (a JSON list,
    written by ``examples/build_demo_model.py``) or from ZipMap keys. Other graphs answer
    their first output as ``predictions``.
    """

    def load(self, path: Path, *, name: str, version: str, threads: int = 1) -> ModelHandle:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        inputs = session.get_inputs()
        if len(inputs) != 1:
            names = [i.name for i in inputs]
            raise ModelLoadError(path, f"graph has {len(inputs)} inputs {names}; one is supported")
        graph_input = inputs[0]
        dtype = _ONNX_DTYPES.get(graph_input.type)
        if dtype is None:
            raise ModelLoadError(path, f"input type {graph_input.type} is not supported")
        shape = graph_input.shape
        n_features = shape[1] if len(shape) == 2 and isinstance(shape[1], int) else None
        output_names = [o.name for o in session.get_outputs()]
        meta = session.get_modelmeta().custom_metadata_map
        classes = tuple(json.loads(meta["classes"])) if "classes" in meta else None
        label_name = "label" if "label" in output_names else output_names[0]
        proba_name = next((n for n in _PROBABILITY_OUTPUTS if n in output_names), None)
        fetch = [label_name] + ([proba_name] if proba_name else [])

        def predict_batch(rows: npt.NDArray[Any]) -> Outputs:
            results = session.run(fetch, {graph_input.name: rows.astype(dtype, copy=False)})
            outputs = {"predictions": np.asarray(results[0])}
            if proba_name is not None:
                outputs["probabilities"] = _probabilities(results[1], classes)
            return outputs

        if classes is None and proba_name is not None and n_features is not None:
            probe = session.run([proba_name], {graph_input.name: np.zeros((1, n_features), dtype)})
            if isinstance(probe[0], list):  # ZipMap: one {class: probability} dict per row
                classes = tuple(probe[0][0].keys())
        return ModelHandle(name, version, "onnx", predict_batch, path, n_features, classes, dtype)


def _probabilities(value: Any, classes: tuple[Any, ...] | None) -> npt.NDArray[Any]:
    if isinstance(value, list):  # ZipMap output
        keys = classes if classes is not None else tuple(value[0].keys()) if value else ()
        return np.array([[row[key] for key in keys] for row in value], dtype=np.float64)
    return np.asarray(value)


def check_artifact(
    path: Path, sha256: str | None = None, allow_world_writable: bool = False
) -> None:
    """Refuse an artifact before anything in it runs.

    :param sha256: expected hex digest of the file (``SERVING_MODEL_SHA256``), or None.
    :param allow_world_writable: load a file any local user may rewrite (pickle and joblib
        run code on load, so by default such a file is refused).
    :raises ModelLoadError: when the file is world-writable (and not allowed) or its digest
        differs, naming the path and both digests.
    """
    if not allow_world_writable and path.stat().st_mode & stat.S_IWOTH:
        raise ModelLoadError(
            path, "the file is world-writable; fix its mode or set "
            "SERVING_ALLOW_WORLD_WRITABLE_MODEL=true",
        )  # fmt: skip
    if sha256 is not None:
        digest = hashlib.sha256()
        with path.open("rb") as file:
            for block in iter(lambda: file.read(1 << 20), b""):
                digest.update(block)
        if digest.hexdigest() != sha256.lower():
            raise ModelLoadError(
                path,
                f"SHA-256 is {digest.hexdigest()}, SERVING_MODEL_SHA256 expects {sha256.lower()}",
            )


_EXTENSIONS = {".pkl": "pickle", ".pickle": "pickle", ".joblib": "joblib", ".onnx": "onnx"}


def format_from_path(path: Path) -> str:
    """The format implied by ``path``'s extension: ``.pkl``/``.pickle``, ``.joblib``, ``.onnx``.

    :raises ValueError: when the extension is none of these.
    """
    try:
        return _EXTENSIONS[path.suffix.lower()]
    except KeyError:
        known = ", ".join(sorted(_EXTENSIONS))
        raise ValueError(
            f"cannot tell the format of {path.name!r} from its extension (known: {known}); "
            "set SERVING_MODEL_FORMAT to pickle, joblib or onnx"
        ) from None


_LOADERS: dict[str, ModelLoader] = {
    "pickle": PickleLoader(),
    "joblib": JoblibLoader(),
    "onnx": OnnxLoader(),
}


def register_loader(fmt: str, loader: ModelLoader) -> None:
    """Make ``load_model(path, fmt)`` use ``loader`` (replacing any loader for ``fmt``)."""
    if not isinstance(loader, ModelLoader):
        raise TypeError(f"loader must be a ModelLoader, got {type(loader).__name__}")
    _LOADERS[fmt] = loader


def load_model(
    path: str | Path,
    fmt: str | None = None,
    *,
    name: str | None = None,
    version: str = "1",
    threads: int = 1,
) -> ModelHandle:
    """Load the artifact at ``path`` with the loader registered for ``fmt``.

    :param fmt: ``pickle``, ``joblib``, ``onnx`` or a registered format; ``None`` means from
        the extension (``.pkl``/``.pickle``, ``.joblib``, ``.onnx``).
    :param name: model name for responses; defaults to the file stem.
    :param threads: intra-op threads the model may use (ONNX Runtime's session option).
    :raises ModelLoadError: naming the path and the cause when the file is missing, the
        format unknown, or loading fails for any reason.
    """
    path = Path(path)
    if fmt is None:
        try:
            fmt = format_from_path(path)
        except ValueError as exc:
            raise ModelLoadError(path, str(exc)) from None
    loader = _LOADERS.get(fmt)
    if loader is None:
        raise ModelLoadError(path, f"no loader for format {fmt!r} (known: {sorted(_LOADERS)})")
    if not path.is_file():
        raise ModelLoadError(path, "no such file")
    try:
        return loader.load(path, name=name or path.stem, version=version, threads=threads)
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(path, f"{type(exc).__name__}: {exc}") from exc
