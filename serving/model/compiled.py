"""A scikit-learn estimator compiled to an ONNX Runtime session at load: the heavy path.

``compile_handle(handle, ...)`` tries the graphs ``serving.model.convert`` makes of the
estimator behind an estimator handle (``serving.model.estimators``), best first: builds a
session in this process (sessions do not survive ``fork()``: call it in the worker),
proves it answers as the estimator does on the rows ``serving.model.parity`` makes, and
returns a handle that answers through it, or raises ``NotCompiled`` saying why (the
caller serves the estimator).

Where a pipeline does not convert as a whole, its final estimator is compiled and the
steps before it run in scikit-learn. scikit-learn itself answers a batch the graph cannot
take as it would (a missing string; a value too large for float32, which scikit-learn
refuses; a missing value where the graph sends it elsewhere), a batch whose outputs are
not finite, and the rows whose two likeliest classes tie (``_settle_ties``).

Boundary: standard library, numpy and ``serving`` core modules; skl2onnx, onnx and
onnxruntime are imported when a model is compiled.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from serving.model.convert import (
    Graph,
    NotCompiled,
    candidates,
    first_line,
    fitted_on_frame,
    reason,
)
from serving.model.convert_boosting import boosting_candidates, boosting_nodes
from serving.model.estimators import final_estimator
from serving.model.handle import ModelHandle, Outputs
from serving.model.onnx_session import new_session
from serving.model.parity import differences, gate_rows, trees_of
from serving.model.providers import CPU, ProviderError, select_providers

__all__ = ["LIBRARIES", "NotCompiled", "compile_handle", "tree_nodes"]

log = logging.getLogger(__name__)

#: The libraries whose models compile (``ModelHandle.engine`` before compiling).
LIBRARIES = ("sklearn", "xgboost", "lightgbm")
#: Two classes' probabilities this close are a tie the library breaks (``_tied``).
TIE = 1e-5
#: float32's relative step: an output ``y`` of a float32 graph is good to about ``|y|`` times
#: this (a leaf's value rounded, then summed).
_FLOAT32_STEP = 2.0**-23
#: Above this a value is not a float32, which scikit-learn's trees refuse.
_FLOAT32_MAX = float(np.finfo(np.float32).max)


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
    library = type(estimator).__module__.split(".")[0] if estimator is not None else ""
    if library not in LIBRARIES:
        raise NotCompiled("not a scikit-learn, XGBoost or LightGBM model")
    features = handle.features or ()
    if not features or any(f.kind == "any" for f in features):
        raise NotCompiled("its inputs are not typed numbers and strings")
    if library == "sklearn" and any(f.pandas_categories for f in features):
        raise NotCompiled("it takes pandas categories, which skl2onnx cannot")
    ways = (candidates if library == "sklearn" else boosting_candidates)(estimator, handle)
    try:
        selection = select_providers(providers, cuda_device=cuda_device, worker_slot=worker_slot)
    except (ProviderError, ValueError) as exc:
        raise NotCompiled(str(exc)) from None
    rows, expected = _answered(handle, gate_rows(handle, estimator))
    if handle.classes is None:
        _check_range(_largest_output(estimator, expected), tolerance)
    reasons: list[str] = []
    try:
        for what, build in ways:
            try:
                graph = build()
                data = graph.data.SerializeToString()
                session = new_session(handle.source or Path(handle.name), data, threads, selection)
                predict = _gated(
                    session, graph, handle, rows=rows, expected=expected, tolerance=tolerance
                )
            except Exception as exc:  # skl2onnx and onnxruntime raise many types: not this way
                reasons.append(f"{what}: {reason(exc, estimator)}")
                continue
            if reasons or what != "as a whole":
                # not an error: the way that serves is said, and why the ones before
                # it did not convert (a newcomer read ONNX Runtime's text as a failure)
                tried = f"; other ways do not convert: {'; '.join(reasons)}" if reasons else ""
                log.info("model %r: compiled %s%s", handle.name, what, tried)
            break
        else:
            raise NotCompiled(reasons[0] if len(reasons) == 1 else "; ".join(reasons))
    finally:
        _give_back_freed_memory()
    used = session.get_providers()[0]
    return replace(
        handle,
        predict_batch=predict,
        engine="onnxruntime",
        execution_provider=used,
        device_id=selection.device_id if used != CPU else None,
    )


def _check_range(largest: float, tolerance: float) -> None:
    """:raises NotCompiled: when a float32 output as large as ``largest`` cannot be held
    within ``tolerance``."""
    step = largest * _FLOAT32_STEP
    if step > tolerance:
        raise NotCompiled(
            f"its outputs reach {largest:.4g}, which float32 holds to {step:.2g}, over the "
            f"tolerance {tolerance:g} (SERVING_COMPILE_TOLERANCE)"
        )


def _largest_output(estimator: Any, expected: Outputs) -> float:
    """The largest output a regressor gives: on the parity rows, and at any leaf of its
    trees (a leaf the rows did not reach still answers some request)."""
    largest = float(np.nanmax(np.abs(np.asarray(expected["predictions"], dtype=np.float64))))
    for tree in trees_of(final_estimator(estimator)):
        largest = max(largest, float(np.abs(tree.value).max()))
    return largest


def _answered(handle: ModelHandle, rows: npt.NDArray[Any]) -> tuple[npt.NDArray[Any], Outputs]:
    """The parity rows the library answers, and its answers: in chunks of 32 where it
    refuses some (a value its own checks refuse), the chunks it refuses left out.

    :raises NotCompiled: when it refuses half of them or more.
    """
    try:
        return rows, handle.predict_batch(rows)
    except Exception as exc:  # the model's own refusal of invented rows
        refusal = first_line(exc)
    kept: list[npt.NDArray[np.intp]] = []
    answers: list[Outputs] = []
    for chunk in np.array_split(np.arange(len(rows)), -(-len(rows) // 32)):
        try:
            answers.append(handle.predict_batch(rows[chunk]))
        except Exception:  # a chunk the library refuses is left out
            continue
        kept.append(chunk)
    if sum(len(k) for k in kept) * 2 < len(rows):
        raise NotCompiled(f"the library refuses most of its parity rows ({refusal})")
    taken = np.concatenate(kept)
    return rows[taken], {
        name: np.concatenate([np.asarray(a[name]) for a in answers]) for name in answers[0]
    }


def tree_nodes(estimator: Any) -> int:
    """The nodes of every tree in ``estimator`` (a pipeline's steps included; an XGBoost
    or LightGBM model's): what ONNX Runtime copies into each worker."""
    total = boosting_nodes(estimator)
    parts = [step for _, step in getattr(estimator, "steps", None) or [("", estimator)]]
    for part in parts:
        for tree in trees_of(part):
            total += int(tree.node_count)
        for predictors in getattr(part, "_predictors", None) or ():  # HistGradientBoosting
            total += sum(len(p.nodes) for p in predictors)
    return total


def _gated(
    session: Any,
    graph: Graph,
    handle: ModelHandle,
    *,
    rows: npt.NDArray[Any],
    expected: Outputs,
    tolerance: float,
) -> Callable[[Any], Outputs]:
    """The compiled ``predict_batch``, once it answers ``rows`` as ``expected``: the rows
    without a missing value, then those with one (where only those differ, the library
    answers every row holding a missing value).

    :raises NotCompiled: with the first difference.
    """
    missing = _with_missing(rows)
    complete, partial = np.flatnonzero(~missing), np.flatnonzero(missing)
    dtypes = {name: np.asarray(value).dtype for name, value in expected.items()}
    predict = _answering(session, graph, handle, dtypes, missing=True)
    found = differences(_take(expected, complete), predict(rows[complete]), tolerance)
    if found is not None:
        raise NotCompiled(f"its answers differ: {found}")
    if partial.size:
        found = differences(_take(expected, partial), predict(rows[partial]), tolerance)
        if found is not None:
            log.info(
                "model %r: batches with missing values go to scikit-learn (the graph "
                "answers them otherwise: %s)", handle.name, found,
            )  # fmt: skip
            return _answering(session, graph, handle, dtypes, missing=False)
    return predict


def _take(outputs: Outputs, rows: npt.NDArray[np.intp]) -> Outputs:
    return {name: np.asarray(value)[rows] for name, value in outputs.items()}


def _answering(
    session: Any,
    graph: Graph,
    handle: ModelHandle,
    dtypes: dict[str, np.dtype[Any]],
    *,
    missing: bool,
) -> Callable[[Any], Outputs]:
    """``batch -> outputs`` through ``session``, keyed as ``handle``'s own and of the
    library's ``dtypes`` (XGBoost's probabilities are float32, scikit-learn's float64).
    The rows the graph cannot answer as the library would (``_feeder``; a missing value
    unless ``missing``), those whose outputs are not finite and those whose two likeliest
    classes tie are answered by ``handle`` itself, row by row: a row's answer never
    depends on the rows batched with it."""
    classes = np.asarray(handle.classes) if handle.classes is not None else None
    want = handle.output_names or ("predictions",)
    fallback = handle.predict_batch
    feed = _feeder(session, graph, handle, missing)
    fetch = ["probabilities"] if graph.argmax else None

    def graph_outputs(fed: dict[str, Any]) -> tuple[Outputs, npt.NDArray[np.bool_]]:
        """The graph's answer to its rows, and which of them the library must answer."""
        results = session.run(fetch, fed)
        if classes is None:
            values = np.asarray(results[0], dtype=np.float64)
            flat = values.ndim == 2 and values.shape[1] == 1
            values = values.ravel() if flat else values
            return {"predictions": values}, ~_finite_rows(values)
        if fetch is not None:  # labels from the probabilities
            labels = classes[np.argmax(results[0], axis=1)]
            results = [None, results[0]]
        else:
            index = np.searchsorted(classes, np.asarray(results[0]).ravel())
            labels = classes[np.minimum(index, len(classes) - 1)]
        answer: Outputs = {"predictions": labels}
        if "probabilities" not in want:
            return answer, np.zeros(len(labels), dtype=bool)
        probabilities = np.asarray(results[1], dtype=np.float64)
        library = ~_finite_rows(probabilities) | _tied(probabilities)
        # a float32 sum of exact 0 and 1 can land a step outside [0, 1]
        answer["probabilities"] = np.clip(probabilities, 0.0, 1.0)
        return answer, library

    def predict_batch(batch: npt.NDArray[Any]) -> Outputs:
        fed, library = feed(batch)
        if fed is None:
            return fallback(batch)
        answer, again = graph_outputs(fed)
        ours = np.flatnonzero(~library)
        library[ours[again]] = True
        if library.any():
            answer = _merged(len(batch), ours, answer, library, fallback(batch[library]))
        return _typed(answer, dtypes)

    return predict_batch


def _finite_rows(values: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
    return np.asarray(np.isfinite(values).reshape(len(values), -1).all(axis=1), dtype=np.bool_)


def _tied(probabilities: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:
    """Rows whose two likeliest classes are within ``TIE`` of each other: the graph sums
    in float32, so an exact tie (20 of 40 trees each way, which scikit-learn breaks
    towards the first class) comes out 0.50000006 the other way."""
    if probabilities.ndim != 2 or probabilities.shape[1] < 2:
        return np.zeros(len(probabilities), dtype=bool)
    top = np.partition(probabilities, -2, axis=1)[:, -2:]
    return np.asarray(top[:, 1] - top[:, 0] <= TIE, dtype=np.bool_)


def _merged(
    n: int,
    ours: npt.NDArray[np.intp],
    answer: Outputs,
    library: npt.NDArray[np.bool_],
    theirs: Outputs,
) -> Outputs:
    """One answer of ``n`` rows: the library's (``theirs``) on the rows of ``library``,
    the graph's (``answer``, of the rows ``ours``) on the others."""
    merged: Outputs = {}
    for name, given in theirs.items():
        value = np.asarray(given)
        whole = np.empty((n, *value.shape[1:]), dtype=value.dtype)
        whole[library] = value
        mine = answer.get(name)
        if mine is not None:
            keep = ~library[ours]
            whole[ours[keep]] = mine[keep]
        merged[name] = whole
    return merged


def _give_back_freed_memory() -> None:
    """Return the heap the conversion freed to the system (glibc's ``malloc_trim``): a
    converted forest's protobufs leave most of a worker's peak in free heap pages (1.3
    million nodes: 1,070 MiB resident after compiling, 400 MiB after the trim)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim(0)


def _typed(answer: Outputs, dtypes: dict[str, np.dtype[Any]]) -> Outputs:
    for name, value in answer.items():
        if name in dtypes and value.dtype != dtypes[name]:
            answer[name] = value.astype(dtypes[name])
    return answer


def _feeder(
    session: Any, graph: Graph, handle: ModelHandle, missing: bool
) -> Callable[[npt.NDArray[Any]], tuple[dict[str, Any] | None, npt.NDArray[np.bool_]]]:
    """``batch ->`` the session's inputs for the rows it can answer as the library would,
    and which rows the library must answer (None for inputs when that is all of them):
    a value too large for float32 (scikit-learn's trees refuse it), a missing string, a
    missing value unless ``missing``."""
    features = handle.features or ()
    names = [i.name for i in session.get_inputs()]
    strings = {j for j, f in enumerate(features) if f.dtype.kind == "O"}
    to_head = _head_input(handle) if graph.head is not None else None
    to_codes = _coder(graph.codes) if graph.codes is not None else None
    numbers = np.float32 if graph.narrow else np.float64

    def refused(values: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
        cells = values.reshape(len(values), -1)
        with np.errstate(invalid="ignore"):
            out = (np.abs(cells) > _FLOAT32_MAX).any(axis=1)
            if not missing:
                out |= np.isnan(cells).any(axis=1)
        return np.asarray(out, dtype=np.bool_)

    def matrix_input(matrix: npt.NDArray[Any], dtype: Any) -> Any:
        library = refused(matrix)
        fed = {names[0]: matrix[~library].astype(dtype, copy=False)}
        return (None if library.all() else fed), library

    def feed(batch: npt.NDArray[Any]) -> tuple[dict[str, Any] | None, npt.NDArray[np.bool_]]:
        if to_codes is not None:
            return matrix_input(to_codes(batch), np.float32)  # type: ignore[no-any-return]
        if to_head is not None:
            rows = np.asarray(graph.head.transform(to_head(batch)), dtype=np.float64)
            return matrix_input(rows, numbers)  # type: ignore[no-any-return]
        if not graph.per_column:
            return matrix_input(np.asarray(batch, dtype=np.float64), numbers)  # type: ignore[no-any-return]
        if batch.dtype.names is None:
            cells = [batch[:, j] for j in range(batch.shape[1])]
        else:
            cells = [batch[name] for name in batch.dtype.names]
        library = np.zeros(len(batch), dtype=bool)
        columns = []
        for j, values in enumerate(cells):
            if j in strings:
                library |= np.fromiter((_missing(v) for v in values), bool, len(values))
                columns.append(values.astype(object).reshape(-1, 1))
            else:
                column = np.asarray(values, dtype=np.float64).reshape(-1, 1)
                library |= refused(column)
                columns.append(column.astype(numbers, copy=False))
        if library.all():
            return None, library
        return {name: c[~library] for name, c in zip(names, columns, strict=True)}, library

    return feed


def _coder(codes: tuple[tuple[Any, ...] | None, ...]) -> Callable[[Any], npt.NDArray[Any]]:
    """``batch -> (n, n_features)`` float64: numbers as they are, a pandas category's
    value as its code (NaN when missing or not among the categories)."""
    import pandas as pd

    lookups = [pd.Index(list(c)) if c is not None else None for c in codes]

    def coded(batch: npt.NDArray[Any]) -> npt.NDArray[Any]:
        if batch.dtype.names is None and not any(lookups):
            return np.asarray(batch, dtype=np.float64)
        matrix = np.empty((len(batch), len(lookups)), dtype=np.float64)
        for j, lookup in enumerate(lookups):
            values = batch[:, j] if batch.dtype.names is None else batch[batch.dtype.names[j]]
            if lookup is None:
                matrix[:, j] = values
            else:
                found = lookup.get_indexer(values)
                matrix[:, j] = np.where(found >= 0, found, np.nan)
        return matrix

    return coded


def _head_input(handle: ModelHandle) -> Callable[[npt.NDArray[Any]], Any]:
    """``batch ->`` what the pipeline's head takes (a DataFrame for a model fitted on one)."""
    if fitted_on_frame(handle.estimator) and handle.features:
        from serving.model.frames import frame_builder

        return frame_builder(handle.features)
    return lambda batch: batch


def _missing(value: Any) -> bool:
    """Whether a string cell is missing (None, or NaN as pandas reads one)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def _with_missing(rows: npt.NDArray[Any]) -> npt.NDArray[np.bool_]:
    """Per row, whether it holds a missing value (NaN, or a missing string)."""
    fields = [rows[name] for name in rows.dtype.names] if rows.dtype.names else [rows]
    found = np.zeros(len(rows), dtype=bool)
    for values in fields:
        cells = values.reshape(len(rows), -1)
        if cells.dtype.kind == "f":
            found |= np.isnan(cells).any(axis=1)
        elif cells.dtype.kind == "O":
            found |= np.array([any(_missing(v) for v in row) for row in cells], dtype=bool)
    return found
