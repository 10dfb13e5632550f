"""A scikit-learn estimator compiled to an ONNX Runtime session at load: the heavy path.

``compile_handle(handle, ...)`` converts the estimator behind an estimator handle
(``serving.model.estimators``) with skl2onnx, builds a session in this process (sessions
do not survive ``fork()``: call it in the worker), proves the session answers as the
estimator does on the rows ``serving.model.parity`` makes, and returns a handle that
answers through it, or raises ``NotCompiled`` saying why (the caller serves the
estimator).

Inputs are prepared as scikit-learn sees them: the graph takes float64 (as scikit-learn's
scalers and linear models compute), and each tree ensemble of an estimator that casts its
input to float32 (decision trees, forests, gradient boosting) is fed the float32 values
(``Cast`` to float, back to double), so a threshold compares as scikit-learn compares it.
A model fitted on a DataFrame takes one ``(batch, 1)`` input per column, as skl2onnx
exports DataFrame pipelines.

Where a pipeline does not convert as a whole, its final estimator is compiled and the
steps before it run in scikit-learn. A batch the graph cannot take as scikit-learn would
(a missing string; a value too large for float32, which scikit-learn refuses) and a batch
whose outputs are not finite are answered by the estimator itself.

Boundary: standard library, numpy and ``serving`` core modules; skl2onnx, onnx and
onnxruntime are imported when a model is compiled.
"""

from __future__ import annotations

import logging
import math
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from serving.model.handle import ModelHandle, Outputs
from serving.model.onnx_session import new_session
from serving.model.parity import differences, gate_rows, trees_of
from serving.model.providers import CPU, ProviderError, select_providers

__all__ = ["NotCompiled", "compile_handle", "tree_nodes"]

log = logging.getLogger(__name__)

#: skl2onnx opsets: ``ai.onnx.ml`` 3 keeps tree thresholds in double for double inputs.
_OPSETS = {"": 17, "ai.onnx.ml": 3}
#: scikit-learn tree models: skl2onnx converts them for float32 input (ONNX Runtime runs
#: no double tree ensembles), as scikit-learn's trees compare ``float32(x)``.
_TREES = re.compile(r"(DecisionTree|ExtraTree|RandomForest|ExtraTrees|GradientBoosting)"
                    r"(Classifier|Regressor)$|^IsolationForest$")  # fmt: skip
#: Above this a value is not a float32, which scikit-learn's trees refuse.
_FLOAT32_MAX = float(np.finfo(np.float32).max)


class NotCompiled(Exception):
    """Why a model is served by its own library: the reason, one line."""


@dataclass(frozen=True)
class _Graph:
    data: Any  # onnx.ModelProto
    #: The scikit-learn steps that run before the graph (a pipeline's head), or None.
    head: Any
    #: Whether the graph takes one ``(batch, 1)`` input per feature column.
    per_column: bool
    #: Whether its numeric input is float32 (a tree model fed directly), else double.
    narrow: bool


def compile_handle(
    handle: ModelHandle,
    *,
    providers: str = "cpu",
    cuda_device: int | None = None,
    worker_slot: int = 0,
    threads: int = 1,
    tolerance: float = 1e-6,
) -> ModelHandle:
    """``handle`` answered through ONNX Runtime (``engine`` ``onnxruntime``), once its
    answers on ``serving.model.parity.gate_rows`` equal the estimator's: labels exactly,
    probabilities and regression outputs within ``tolerance`` (absolute).

    :param providers: as ``SERVING_ONNX_PROVIDERS`` (``auto``: CUDA where usable).
    :param threads: ONNX Runtime intra-op threads.
    :raises NotCompiled: naming what does not convert, or the largest difference.
    """
    estimator = handle.estimator
    if estimator is None or not type(estimator).__module__.startswith("sklearn."):
        raise NotCompiled("not a scikit-learn estimator")
    features = handle.features or ()
    if not features or any(f.kind == "any" or f.pandas_categories for f in features):
        raise NotCompiled("its inputs are not numbers and strings skl2onnx can take")
    try:
        selection = select_providers(providers, cuda_device=cuda_device, worker_slot=worker_slot)
    except (ProviderError, ValueError) as exc:
        raise NotCompiled(str(exc)) from None
    rows = gate_rows(handle, estimator)
    try:
        expected = handle.predict_batch(rows)
    except Exception as exc:  # the model's own refusal of invented rows
        log.info("model %r: parity on its sample rows only (%s)", handle.name, _first_line(exc))
        rows = handle.sample(8)
        expected = handle.predict_batch(rows)
    reasons: list[str] = []
    for what, build in _candidates(estimator, handle):
        try:
            graph = build()
            data = graph.data.SerializeToString()
            session = new_session(handle.source or Path(handle.name), data, threads, selection)
            predict = _gated(
                session, graph, handle, rows=rows, expected=expected, tolerance=tolerance
            )
        except Exception as exc:  # skl2onnx and onnxruntime raise many types: not this way
            reasons.append(f"{what}: {_reason(exc, estimator)}")
            continue
        if reasons:
            log.info("model %r: compiled %s (%s)", handle.name, what, "; ".join(reasons))
        used = session.get_providers()[0]
        break
    else:
        raise NotCompiled(reasons[0] if len(reasons) == 1 else "; ".join(reasons))
    return replace(
        handle,
        predict_batch=predict,
        engine="onnxruntime",
        execution_provider=used,
        device_id=selection.device_id if used != CPU else None,
    )


def tree_nodes(estimator: Any) -> int:
    """The nodes of every tree in ``estimator`` (a pipeline's steps included): what ONNX
    Runtime copies into each worker."""
    total = 0
    parts = [step for _, step in getattr(estimator, "steps", None) or [("", estimator)]]
    for part in parts:
        for tree in trees_of(part):
            total += int(tree.node_count)
        for predictors in getattr(part, "_predictors", None) or ():  # HistGradientBoosting
            total += sum(len(p.nodes) for p in predictors)
    return total


def _candidates(estimator: Any, handle: ModelHandle) -> list[tuple[str, Callable[[], _Graph]]]:
    """The ways to compile ``estimator``, best first: the whole model in double (a tree
    ensemble in float32, as scikit-learn's trees compare, after a pipeline's head in
    double); the whole model in float32; its final step alone, after the steps before it
    run in scikit-learn."""
    from skl2onnx.common.data_types import DoubleTensorType, FloatTensorType

    steps = getattr(estimator, "steps", None)
    head, final = (estimator[:-1], steps[-1][1]) if steps and len(steps) > 1 else (None, estimator)
    trees = bool(_TREES.search(type(final).__name__))
    per_column = any(f.dtype.kind == "O" for f in handle.features or ())
    width = getattr(final, "n_features_in_", None)

    def whole() -> _Graph:
        if not trees:
            types = _input_types(handle, per_column)
            return _Graph(_to_onnx(estimator, types), None, per_column, False)
        if head is None:
            types = _input_types(handle, per_column, FloatTensorType)
            return _Graph(_to_onnx(final, types), None, per_column, True)
        tail = _to_onnx(final, [("X", FloatTensorType([None, int(width or 0)]))])
        joined = _joined(_to_onnx(head, _input_types(handle, per_column)), tail)
        return _Graph(joined, None, per_column, False)

    def narrow() -> _Graph:
        types = _input_types(handle, per_column, FloatTensorType)
        return _Graph(_to_onnx(estimator, types), None, per_column, True)

    def last(numbers: Any) -> Callable[[], _Graph]:
        def build() -> _Graph:
            graph = _to_onnx(final, [("X", numbers([None, int(width or 0)]))])
            return _Graph(graph, head, False, numbers is FloatTensorType)

        return build

    found = [("as a whole", whole)]
    if not trees:
        found.append(("as a whole in float32", narrow))
    if steps and head is not None and width is not None:
        name = steps[-1][0]
        found.append((f"its final step {name!r} after scikit-learn's steps before it",
                      last(FloatTensorType if trees else DoubleTensorType)))  # fmt: skip
        if not trees:
            found.append((f"its final step {name!r} in float32 after scikit-learn's steps",
                          last(FloatTensorType)))  # fmt: skip
    return found


def _gated(
    session: Any,
    graph: _Graph,
    handle: ModelHandle,
    *,
    rows: npt.NDArray[Any],
    expected: Outputs,
    tolerance: float,
) -> Callable[[Any], Outputs]:
    """The compiled ``predict_batch``, once it answers ``rows`` as ``expected``; batches
    with a missing value go to scikit-learn where only those differ.

    :raises NotCompiled: with the first difference.
    """
    predict = _answering(session, graph, handle, missing=True)
    found = differences(expected, predict(rows), tolerance)
    if found is not None and _any_missing(rows):
        # Missing values may go another way in the graph: scikit-learn answers those.
        without = _answering(session, graph, handle, missing=False)
        if differences(expected, without(rows), tolerance) is None:
            log.info(
                "model %r: batches with missing values go to scikit-learn (the graph "
                "answers them otherwise: %s)", handle.name, found,
            )  # fmt: skip
            return without
    if found is not None:
        raise NotCompiled(f"it differs from scikit-learn: {found}")
    return predict


def _to_onnx(estimator: Any, initial_types: list[tuple[str, Any]]) -> Any:
    """``estimator`` converted by skl2onnx (probabilities as a tensor, no ZipMap)."""
    from skl2onnx import convert_sklearn

    options = {id(estimator): {"zipmap": False}} if hasattr(estimator, "classes_") else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # converter deprecations are not the user's
        return convert_sklearn(
            estimator, initial_types=initial_types, options=options, target_opset=_OPSETS
        )


def _joined(head: Any, tail: Any) -> Any:
    """One graph: ``head``'s output cast to float32 into ``tail``'s input."""
    from onnx import TensorProto, compose, helper

    out = head.graph.output[0].name
    head.graph.node.append(helper.make_node("Cast", [out], ["__as_float32"], to=TensorProto.FLOAT))
    del head.graph.output[:]
    head.graph.output.append(
        helper.make_tensor_value_info("__as_float32", TensorProto.FLOAT, [None, None])
    )
    tail = compose.add_prefix(tail, "tail_")
    versions: dict[str, int] = {}
    for model in (head, tail):
        for opset in model.opset_import:
            versions[opset.domain] = max(versions.get(opset.domain, 0), opset.version)
    for model in (head, tail):
        del model.opset_import[:]
        model.opset_import.extend(helper.make_opsetid(d, v) for d, v in versions.items())
    return compose.merge_models(head, tail, io_map=[("__as_float32", tail.graph.input[0].name)])


def _input_types(
    handle: ModelHandle, per_column: bool, numbers: Any = None
) -> list[tuple[str, Any]]:
    """One ``(batch, n_features)`` input of ``numbers`` (default double), or one
    ``(batch, 1)`` input per feature column (strings as strings)."""
    from skl2onnx.common.data_types import DoubleTensorType, StringTensorType

    numbers = numbers or DoubleTensorType
    features = handle.features or ()
    if not per_column:
        return [("X", numbers([None, len(features)]))]
    if handle.feature_names is None or not _fitted_on_frame(handle.estimator):
        raise NotCompiled("it takes strings in an array, not in a DataFrame")
    return [
        (f.name, StringTensorType([None, 1]) if f.dtype.kind == "O" else numbers([None, 1]))
        for f in features
    ]


def _fitted_on_frame(estimator: Any) -> bool:
    return getattr(estimator, "feature_names_in_", None) is not None


def _answering(
    session: Any, graph: _Graph, handle: ModelHandle, missing: bool
) -> Callable[[Any], Outputs]:
    """``batch -> outputs`` through ``session``, keyed and typed as ``handle``'s own; a
    batch with a missing value goes to ``handle`` itself unless ``missing``."""
    features = handle.features or ()
    names = [i.name for i in session.get_inputs()]
    strings = {j for j, f in enumerate(features) if f.dtype.kind == "O"}
    classes = np.asarray(handle.classes) if handle.classes is not None else None
    want = handle.output_names or ("predictions",)
    fallback = handle.predict_batch
    to_head = _head_input(handle) if graph.head is not None else None
    numbers = np.float32 if graph.narrow else np.float64

    def refused(values: npt.NDArray[Any]) -> bool:
        """Values scikit-learn must answer: too large for float32, or missing."""
        with np.errstate(invalid="ignore"):
            return bool((np.abs(values) > _FLOAT32_MAX).any()) or (
                not missing and bool(np.isnan(values).any())
            )

    def feed(batch: npt.NDArray[Any]) -> dict[str, Any] | None:
        """The session's inputs, or None where scikit-learn must answer."""
        if to_head is not None:
            rows = np.asarray(graph.head.transform(to_head(batch)), dtype=np.float64)
            return None if refused(rows) else {names[0]: rows.astype(numbers, copy=False)}
        if not graph.per_column:
            matrix = np.asarray(batch, dtype=np.float64)
            return None if refused(matrix) else {names[0]: matrix.astype(numbers, copy=False)}
        if batch.dtype.names is None:
            cells = [batch[:, j] for j in range(batch.shape[1])]
        else:
            cells = [batch[name] for name in batch.dtype.names]
        fed = {}
        for j, (name, values) in enumerate(zip(names, cells, strict=True)):
            if j in strings:
                if any(_missing(v) for v in values):
                    return None
                fed[name] = values.astype(object).reshape(-1, 1)
            else:
                column = np.asarray(values, dtype=np.float64).reshape(-1, 1)
                if refused(column):
                    return None
                fed[name] = column.astype(numbers, copy=False)
        return fed

    def predict_batch(batch: npt.NDArray[Any]) -> Outputs:
        fed = feed(batch)
        if fed is None:
            return fallback(batch)
        results = session.run(None, fed)
        answer: Outputs = {}
        if classes is not None:
            index = np.searchsorted(classes, np.asarray(results[0]).ravel())
            answer["predictions"] = classes[np.minimum(index, len(classes) - 1)]
            if "probabilities" in want:
                probabilities = np.asarray(results[1], dtype=np.float64)
                if not np.isfinite(probabilities).all():
                    return fallback(batch)
                answer["probabilities"] = probabilities
            return answer
        values = np.asarray(results[0], dtype=np.float64)
        if not np.isfinite(values).all():
            return fallback(batch)
        flat = values.ndim == 2 and values.shape[1] == 1
        answer["predictions"] = values.ravel() if flat else values
        return answer

    return predict_batch


def _head_input(handle: ModelHandle) -> Callable[[npt.NDArray[Any]], Any]:
    """``batch ->`` what the pipeline's head takes (a DataFrame for a model fitted on one)."""
    if _fitted_on_frame(handle.estimator) and handle.features:
        from serving.model.frames import frame_builder

        return frame_builder(handle.features)
    return lambda batch: batch


def _missing(value: Any) -> bool:
    """Whether a string cell is missing (None, or NaN as pandas reads one)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _any_missing(rows: npt.NDArray[Any]) -> bool:
    fields = [rows[name] for name in rows.dtype.names] if rows.dtype.names else [rows]
    for values in fields:
        if values.dtype.kind == "f" and np.isnan(values).any():
            return True
        if values.dtype.kind == "O" and any(_missing(v) for v in values.ravel()):
            return True
    return False


def _reason(error: Exception, estimator: Any) -> str:
    """Why a way failed, one line: the pipeline step skl2onnx could not convert, by name,
    where its error names the step's type."""
    if isinstance(error, NotCompiled):
        return str(error)
    message = str(error)
    for name, step in getattr(estimator, "steps", None) or ():
        if f"{type(step).__module__}.{type(step).__name__}" in message or (
            "shape calculator" in message and type(step).__name__ in message
        ):
            return f"skl2onnx cannot convert step {name!r} ({type(step).__name__})"
    return f"{type(error).__name__}: {_first_line(error)}"


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return (text[0] if text else type(error).__name__)[:300]
