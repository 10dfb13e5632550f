"""What the batcher calls: ``ModelHandle``, and the ``ModelLoader`` interface that makes one.

Boundary: imports only the standard library and numpy (no Flask, no pydantic, no
prometheus, no model libraries).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
import numpy.typing as npt

from serving.model.mlmodel import PyfuncOutput
from serving.model.schema import Feature, feature, sample_batch, structured_dtype, uniform_dtype

__all__ = ["ModelHandle", "ModelLoader", "Outputs", "Predictor", "TensorSpec"]

Outputs = dict[str, npt.NDArray[Any]]


class Predictor(Protocol):
    """Anything with a scikit-learn style ``predict(X)``; ``predict_proba`` is optional."""

    def predict(self, X: npt.NDArray[Any], /) -> Any: ...


@dataclass(frozen=True)
class TensorSpec:
    """A named model input or output: element type and shape, ``-1`` for the batch axis
    (and any axis the model leaves open). Inputs take ``shape[1]`` columns of the
    ``(n_instances, n_features)`` matrix each (one when ``shape`` is ``(-1,)``), in order."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]

    @property
    def width(self) -> int:
        """Columns of the instance matrix this input takes (-1 when open)."""
        return self.shape[1] if len(self.shape) > 1 else 1


@dataclass(frozen=True)
class ModelHandle:
    """A loaded model, ready to be called by the batcher.

    :param predict_batch: a batch of ``n_instances`` -> outputs of ``n_instances`` rows
        (``predictions``, optionally ``probabilities`` and other named outputs). The batch
        is ``(n_instances, n_features)`` of ``matrix_dtype`` (the features' own element
        type when they share one, float32 for a float32 graph; else float64 for floats,
        int64 for integers) when every feature has one kind, else a record array of
        ``(n_instances,)`` with one field per feature (``batch_dtype``). It may be a view
        of the request body (a KServe V2 binary tensor), writable.
    :param n_features: features per instance when the model tells it, else ``None``.
    :param classes: class labels in the column order of ``probabilities``, if known.
    :param input_dtype: for a model without ``features``: the element type of every
        feature (``np.float32`` for most ONNX graphs); values outside its range are refused
        before they reach the model.
    :param feature_names: the name of each feature column, in order, when the model knows
        them (scikit-learn's ``feature_names_in_``, an ONNX graph's input names).
    :param features: the input schema (``serving.model.schema``): kind, element type, missing
        values and categories per feature; by default ``n_features`` floats of
        ``input_dtype``, named by ``feature_names`` or by position.
    :param output_names: the keys ``predict_batch`` returns, when known.
    :param pyfunc_output: the output ``/invocations`` answers: ``probabilities`` for an
        MLflow folder whose ``MLmodel`` names ``predict_fn: predict_proba``
        (``serving.model.mlmodel``), as ``mlflow.pyfunc`` answers it.
    :param inputs: the model's named inputs, laid side by side as the feature columns
        (one ``input-0`` for Python estimators; an ONNX graph's own inputs), when known.
    :param execution_provider: where it runs: ONNX Runtime's provider name
        (``CUDAExecutionProvider``, ``CPUExecutionProvider``) or ``cpu`` for Python models.
    :param device_id: the CUDA device index, when it runs on one.
    :param examples: the model's own example instances, for warm-up (a custom class's
        ``warmup_instances``): each a mapping of feature name to value or a row of values
        in feature order, as a request's ``instances`` carry them; None when it has none.
    :param examples_from: where ``examples`` come from, for errors (``warmup_instances``,
        ``input_example.json``).
    :param sha256: the hex SHA-256 of the artifact's bytes as they were read and loaded
        (None: a folder a class or MLflow reads, or a model handed over in memory).
    :param loaded_bytes: the memory its load added in the process that loaded it (PSS
        before and after ``serving.loading.load_artifact``, in bytes), when measured: the
        master's one copy for a model its workers share.
    :param loaded_imports: the libraries that load imported first (their memory is in
        ``loaded_bytes``: once per process), sorted.
    :param estimator: the Python object ``predict_batch`` calls (a scikit-learn estimator,
        a booster), for compiling it (``serving.model.compiled``) and tuning; None for a
        graph, a function or your own class.
    :param engine: what answers: ``onnxruntime`` (an ONNX graph, or an estimator compiled
        to one), else the estimator's library (``sklearn``, ``xgboost``, ``lightgbm``),
        else ``python``; worked out when not given.

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
    input_dtype: npt.DTypeLike = np.float64
    feature_names: tuple[str, ...] | None = None
    features: tuple[Feature, ...] | None = None
    output_names: tuple[str, ...] | None = None
    execution_provider: str = "cpu"
    device_id: int | None = None
    inputs: tuple[TensorSpec, ...] | None = None
    examples: tuple[Any, ...] | None = None
    examples_from: str = "examples"
    pyfunc_output: PyfuncOutput = "predictions"
    sha256: str | None = None
    loaded_bytes: int | None = None
    loaded_imports: tuple[str, ...] = ()
    estimator: Any = None
    engine: str = ""

    def __post_init__(self) -> None:
        if not self.engine:
            library = type(self.estimator).__module__.split(".")[0] if self.estimator else ""
            engine = "onnxruntime" if self.format == "onnx" else library or "python"
            object.__setattr__(self, "engine", engine)
        if self.features is not None:
            object.__setattr__(self, "n_features", len(self.features))
        elif self.n_features is not None:
            names = self.feature_names or tuple(str(j) for j in range(self.n_features))
            dtype = np.dtype(self.input_dtype)
            floats = tuple(feature(name, "float", dtype) for name in names)
            object.__setattr__(self, "features", floats)

    @property
    def matrix_dtype(self) -> np.dtype[Any] | None:
        """The element type of the ``(n_instances, n_features)`` batch, or None when the
        features need a record per instance (``batch_dtype``)."""
        return uniform_dtype(self.features) if self.features else np.dtype(np.float64)

    @property
    def batch_dtype(self) -> np.dtype[Any]:
        """The record type of a typed batch: one field per feature."""
        assert self.features is not None
        return structured_dtype(self.features)

    def input_specs(self) -> tuple[TensorSpec, ...]:
        """``inputs``; else one ``input-0`` of ``(-1, n_features)`` when every feature has
        one type, or one ``(-1,)`` input per feature, named after it, when they differ
        (a DataFrame with a string column: as MLServer's pandas codec lays it out).
        Worked out once (each V2 request asks)."""
        return self._input_specs

    @cached_property
    def _input_specs(self) -> tuple[TensorSpec, ...]:
        if self.inputs is not None:
            return self.inputs
        features = self.features or ()
        if self.matrix_dtype is None:
            return tuple(TensorSpec(f.name, f.dtype, (-1,)) for f in features)
        dtype = min((f.dtype for f in features), key=lambda d: d.itemsize, default=None)
        dtype = np.dtype(self.input_dtype) if dtype is None else dtype
        return (TensorSpec("input-0", dtype, (-1, self.n_features or -1)),)

    def sample(self, n: int) -> npt.NDArray[Any]:
        """``n`` valid instances (zeros, false, a known category) for warmup and specs."""
        assert self.features is not None
        return sample_batch(self.features, n)

    def output_specs(self, batch: npt.NDArray[Any] | None = None) -> tuple[TensorSpec, ...]:
        """The outputs of ``batch`` (default: one sample instance), as specs (one
        ``predict_batch`` call); those the model names (``declared_outputs``) when
        ``n_features`` is unknown. Used for metadata, computed once per load."""
        if self.features is None:
            return self.declared_outputs()
        outputs = self.predict_batch(self.sample(1) if batch is None else batch)
        return tuple(
            TensorSpec(name, np.asarray(value).dtype, (-1, *np.asarray(value).shape[1:]))
            for name, value in outputs.items()
        )

    def declared_outputs(self) -> tuple[TensorSpec, ...]:
        """For a model that does not tell its width, or whose warm-up failed: the
        outputs it names, typed from what is known (the classes' type for a classifier's
        predictions, float64 otherwise), so metadata still lists them."""
        labels = np.asarray(self.classes).dtype if self.classes else np.dtype(np.float64)
        specs = []
        for name in self.output_names or ():
            if name == "probabilities":
                width = len(self.classes) if self.classes else -1
                specs.append(TensorSpec(name, np.dtype(np.float64), (-1, width)))
            else:
                dtype = labels if name == "predictions" else np.dtype(np.float64)
                specs.append(TensorSpec(name, dtype, (-1,)))
        return tuple(specs)

    @classmethod
    def from_callable(
        cls,
        fn: Callable[[npt.NDArray[Any]], Any],
        *,
        name: str,
        version: str,
        n_features: int | None = None,
        classes: tuple[Any, ...] | None = None,
        feature_names: tuple[str, ...] | None = None,
    ) -> ModelHandle:
        """Wrap an in-memory function: ``fn(rows)`` returns an array of predictions (one per
        row) or a mapping of named outputs."""

        def predict_batch(rows: npt.NDArray[Any]) -> Outputs:
            result = fn(rows)
            if isinstance(result, Mapping):
                return {key: np.asarray(value) for key, value in result.items()}
            return {"predictions": np.asarray(result)}

        if feature_names is not None and n_features is None:
            n_features = len(feature_names)
        return cls(
            name, version, "callable", predict_batch, None, n_features, classes,
            feature_names=feature_names,
        )  # fmt: skip

    def warmup(self, *n_instances: int) -> bool:
        """Run one batch of ``sample`` rows (zeros, or a known category where a feature
        refuses unknown ones) for each size in ``n_instances``, so the first real
        request does not pay for lazy initialisation (on CUDA: context creation and kernel
        selection, which are per input shape). For an estimator handle the first batch also
        checks whether labels may come from ``predict_proba`` alone (``serving.model.labels``).
        Returns False (and does nothing) when ``n_features`` is unknown. Exceptions from the
        model propagate."""
        if self.features is None:
            return False
        for size in sorted(set(n_instances)):
            self.predict_batch(self.sample(size))
        return True


class ModelLoader(ABC):
    """Loads one artifact format: ``load(path, data)``, the one seam every format has.

    ``data`` is the artifact's bytes, read once and checked (``check_artifact``): a loader
    loads exactly these, never ``path`` again (``path`` names it in errors and finds files
    beside it, such as a schema). A loader that must read ``path`` itself (a directory, a
    class given a path) sets ``reads_path`` and is given ``data=None``; such a loader cannot
    serve a model pinned by SHA-256. Pass a new format to ``load_model(loaders=...)``.
    """

    reads_path: ClassVar[bool] = False

    @abstractmethod
    def load(
        self, path: Path, data: bytes | None, *, name: str, version: str, threads: int = 1
    ) -> ModelHandle:
        """Load the artifact into a handle; ``threads`` is the intra-op thread budget.

        :raises ModelLoadError: when the artifact is not a usable model.
        """
