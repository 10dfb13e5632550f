"""ONNX graphs through an onnxruntime session on the best execution provider the host has.

Inputs: every graph input is ``(batch,)`` or ``(batch, k)``; their columns are laid side
by side, in graph order, into the one ``(n_instances, n_features)`` matrix the batcher
merges, of the inputs' element type when they share one (a float32 graph's batch is
float32, fed as it is), and each batch is cut back into the inputs and cast to each
input's element type once per batch where it differs. A
graph with several ``(batch, 1)`` inputs (skl2onnx's export of a DataFrame pipeline) thus
takes named features: its feature names are its input names. A fixed batch dimension
``N`` is served for any batch size by running chunks of ``N`` rows, padding the last.

Outputs: skl2onnx classifiers (``label`` and ``probabilities``/``output_probability``,
ZipMap on or off) give ``predictions`` and ``probabilities``, like a joblib classifier.
Other graphs give their first output as ``predictions`` (a ``(batch, 1)`` output
flattened to one value per instance) and every other tensor output under its own name.

Boundary: standard library, numpy and ``serving`` core modules; onnxruntime is imported
when a graph is loaded.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from serving.errors import ModelLoadError
from serving.model.handle import ModelHandle, ModelLoader, Outputs, TensorSpec
from serving.model.onnx_session import new_session
from serving.model.providers import CPU, ProviderError, select_providers
from serving.model.schema import Feature, Kind
from serving.model.schema_onnx import GraphFacts, InputFacts, graph_facts

__all__ = ["OnnxLoader"]

log = logging.getLogger(__name__)

_ONNX_DTYPES: dict[str, type[np.generic] | type[object]] = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(bool)": np.bool_,
    "tensor(string)": object,
}
_KINDS: dict[str, Kind] = {"f": "float", "i": "integer", "u": "integer", "b": "boolean",
                           "O": "string"}  # fmt: skip
_PROBABILITY_OUTPUTS = ("probabilities", "output_probability")
_DYNAMIC_HINT = (
    "re-export it with a dynamic batch axis (skl2onnx: initial_types=[('X', "
    "FloatTensorType([None, n_features]))]; torch.onnx.export: dynamic_axes={'X': {0: 'batch'}})"
)


@dataclass(frozen=True)
class _Input:
    name: str
    dtype: type[np.generic] | type[object]
    start: int  # first column in the merged matrix
    width: int  # columns; a (batch,) input has width 1 and is fed flat
    flat: bool


class OnnxLoader(ModelLoader):
    """Loads ``.onnx`` files into a session on the providers ``providers`` selects.

    :param providers: ``auto`` or a comma list (``cuda,cpu``), as ``SERVING_ONNX_PROVIDERS``.
    :param cuda_device: CUDA device index (``SERVING_CUDA_DEVICE``); default
        ``worker_slot mod n_devices``.
    :param optimized_model_path: where to save the optimized graph, and to reuse it from on
        the next start while the source file, providers and onnxruntime version are the
        same (``SERVING_ONNX_OPTIMIZED_MODEL_PATH``).

    Usage::

        loader = OnnxLoader("auto", worker_slot=0)
        handle = load_model("model.onnx", loaders={"onnx": loader})
        handle.execution_provider        # "CUDAExecutionProvider" or "CPUExecutionProvider"
    """

    def __init__(
        self,
        providers: str = "auto",
        *,
        cuda_device: int | None = None,
        worker_slot: int = 0,
        optimized_model_path: Path | None = None,
    ) -> None:
        self.providers = providers
        self.cuda_device = cuda_device
        self.worker_slot = worker_slot
        self.optimized_model_path = optimized_model_path

    def load(
        self, path: Path, data: bytes | None, *, name: str, version: str, threads: int = 1
    ) -> ModelHandle:
        """Create the session (intra-op ``threads``, inter-op 1, all graph optimizations)
        from ``data`` (the file's bytes, already checked).

        :raises ModelLoadError: when the providers asked for cannot run here, the session
            fell back from the GPU, or the graph's inputs are not ``(batch, k)`` tensors.
        """
        try:
            selection = select_providers(
                self.providers, cuda_device=self.cuda_device, worker_slot=self.worker_slot
            )
        except (ProviderError, ValueError) as exc:
            raise ModelLoadError(path, str(exc)) from None
        if data is None:
            raise ModelLoadError(path, "the onnx loader loads bytes, got none")
        session = new_session(path, data, threads, selection, self.optimized_model_path)
        used = tuple(session.get_providers())
        wanted = [p if isinstance(p, str) else p[0] for p in selection.providers]
        if wanted[0] not in used:
            raise ModelLoadError(
                path, f"asked for {wanted[0]} but the session runs on {', '.join(used)}"
            )
        on_gpu = selection.device_id is not None and used[0] != CPU
        on_device = f" (CUDA device {selection.device_id})" if on_gpu else ""
        log.info("model %r runs on %s%s", name, ", ".join(used), on_device)
        device_id = selection.device_id if used[0] != CPU else None
        return _handle(session, path, name, version, provider=used[0], device_id=device_id)


def _inputs(session: Any, path: Path) -> tuple[list[_Input], int | None, int | None]:
    """The graph inputs as column ranges, ``n_features`` (None when unknown) and the batch
    dimension (an int when fixed)."""
    specs, start, batch_dims = [], 0, set()
    graph_inputs = session.get_inputs()
    for graph_input in graph_inputs:
        dtype = _ONNX_DTYPES.get(graph_input.type)
        if dtype is None:
            raise ModelLoadError(
                path, f"input {graph_input.name!r} has type {graph_input.type}; "
                f"supported: {', '.join(_ONNX_DTYPES)}",
            )  # fmt: skip
        shape = list(graph_input.shape)
        if len(shape) not in (1, 2):
            raise ModelLoadError(
                path, f"input {graph_input.name!r} has shape {shape}; inputs must be "
                "(batch,) or (batch, n_features)",
            )  # fmt: skip
        width = shape[1] if len(shape) == 2 else 1
        if not isinstance(width, int):
            if len(graph_inputs) > 1:
                raise ModelLoadError(
                    path, f"input {graph_input.name!r} has a dynamic feature axis; with "
                    "several inputs each needs a fixed width",
                )  # fmt: skip
            width = -1
        batch_dims.add(shape[0] if isinstance(shape[0], int) else None)
        specs.append(_Input(graph_input.name, dtype, start, width, len(shape) == 1))
        start += width
    if len(batch_dims) > 1:
        raise ModelLoadError(path, f"inputs disagree on the batch dimension: {batch_dims}")
    batch = batch_dims.pop()
    if batch is not None and batch <= 0:
        raise ModelLoadError(path, f"batch dimension {batch} cannot be served; {_DYNAMIC_HINT}")
    n_features = None if specs[0].width == -1 else start
    return specs, n_features, batch


def _handle(
    session: Any, path: Path, name: str, version: str, *, provider: str, device_id: int | None
) -> ModelHandle:
    """The handle of an ONNX Runtime ``session`` of the graph at ``path``: its inputs,
    outputs, classes and features read from the graph and its metadata; the classes of a
    ZipMap output, where nothing else names them, from one probe run."""
    specs, n_features, fixed_batch = _inputs(session, path)
    meta = session.get_modelmeta().custom_metadata_map
    graph = graph_facts(path)
    # The classes: our metadata entry, else the classifier node's labels (skl2onnx
    # exports with zipmap=False carry no ZipMap keys to read them from).
    classes = tuple(json.loads(meta["classes"])) if "classes" in meta else graph.classes
    keys, proba_name = _output_keys(session.get_outputs())
    names = _feature_names(specs, meta)
    features = _features(specs, names, graph) if n_features is not None else None
    feeds = _feeder(specs, features)
    runner = _runner(session, list(keys), feeds, fixed_batch)
    handle = ModelHandle(
        name=name,
        version=version,
        format="onnx",
        predict_batch=_named_outputs(runner, keys, classes),
        source=path,
        n_features=n_features,
        classes=classes,
        input_dtype=np.dtype(specs[0].dtype),
        feature_names=names,
        features=features,
        output_names=tuple(keys.values()),
        execution_provider=provider,
        device_id=device_id,
        inputs=tuple(
            TensorSpec(spec.name, np.dtype(spec.dtype), (-1,) if spec.flat else (-1, spec.width))
            for spec in specs
        ),
    )
    if classes is None and proba_name is not None and features is not None:
        probe = session.run([proba_name], feeds(handle.sample(fixed_batch or 1)))
        if isinstance(probe[0], list):  # ZipMap: one {class: probability} dict per row
            handle = replace(handle, classes=tuple(probe[0][0].keys()))
    return handle


def _output_keys(outputs: list[Any]) -> tuple[dict[str, str], str | None]:
    """Graph output name -> our output name, in the order to fetch them: the label as
    ``predictions``, the probabilities (``_PROBABILITY_OUTPUTS``) as ``probabilities``, any
    other tensor output under its own name; and the graph's probabilities output name."""
    output_names = [o.name for o in outputs]
    proba_name = next((n for n in _PROBABILITY_OUTPUTS if n in output_names), None)
    label_name = "label" if "label" in output_names else output_names[0]
    keys = {label_name: "predictions"}
    if proba_name is not None:
        keys[proba_name] = "probabilities"
    for output in outputs:  # other tensor outputs, under their own names
        reserved = output.name in keys or output.name in ("predictions", "probabilities")
        if not reserved and output.type.startswith("tensor") and len(output.shape) >= 1:
            keys[output.name] = output.name
    return keys, proba_name


def _feeder(
    specs: list[_Input], features: tuple[Feature, ...] | None
) -> Callable[[npt.NDArray[Any]], dict[str, npt.NDArray[Any]]]:
    """``rows -> {input name: array}``: a record batch column by column, a matrix sliced
    into each input's columns in its dtype (no copy for one input already in its dtype)."""

    def feeds(rows: npt.NDArray[Any]) -> dict[str, npt.NDArray[Any]]:
        if rows.dtype.names is not None:  # a record per instance: typed columns
            assert features is not None
            return {spec.name: _record_feed(rows, spec, features) for spec in specs}
        if len(specs) == 1 and not specs[0].flat:
            return {specs[0].name: rows.astype(specs[0].dtype, copy=False)}
        out = {}
        for spec in specs:
            end = spec.start + spec.width
            part = rows[:, spec.start] if spec.flat else rows[:, spec.start : end]
            out[spec.name] = np.ascontiguousarray(part, dtype=spec.dtype)
        return out

    return feeds


def _runner(
    session: Any,
    fetch: list[str],
    feeds: Callable[[npt.NDArray[Any]], dict[str, npt.NDArray[Any]]],
    fixed_batch: int | None,
) -> Callable[[npt.NDArray[Any]], list[Any]]:
    """``rows -> the fetched outputs``: one session run, or for a graph with a fixed batch
    size one run per ``fixed_batch`` rows (the last padded with copies of its last row),
    the outputs joined and cut back to the rows given."""

    def run(rows: npt.NDArray[Any]) -> list[Any]:
        return list(session.run(fetch, feeds(rows)))

    def run_fixed(rows: npt.NDArray[Any]) -> list[Any]:
        assert isinstance(fixed_batch, int)
        n, parts = len(rows), []
        for begin in range(0, n, fixed_batch):
            chunk = rows[begin : begin + fixed_batch]
            if len(chunk) < fixed_batch:  # pad with copies of the last row: a valid input
                chunk = np.concatenate([chunk, np.repeat(chunk[-1:], fixed_batch - len(chunk), 0)])
            parts.append(run(chunk))
        return [_concatenate([part[i] for part in parts])[:n] for i in range(len(fetch))]

    return run if fixed_batch is None else run_fixed


def _named_outputs(
    runner: Callable[[npt.NDArray[Any]], list[Any]],
    keys: dict[str, str],
    classes: tuple[Any, ...] | None,
) -> Callable[[npt.NDArray[Any]], Outputs]:
    """``predict_batch``: the runner's outputs under our names, probabilities as a
    ``(n, n_classes)`` array, a ``(n, 1)`` label as ``(n,)``."""

    def predict_batch(rows: npt.NDArray[Any]) -> Outputs:
        results = runner(rows)
        out: Outputs = {}
        for key, value in zip(keys.values(), results, strict=True):
            if key == "probabilities":
                out[key] = _probabilities(value, classes)
            else:
                out[key] = np.asarray(value)
        predictions = out["predictions"]
        if predictions.ndim == 2 and predictions.shape[1] == 1:
            out["predictions"] = predictions.reshape(-1)
        return out

    return predict_batch


def _features(
    specs: list[_Input], names: tuple[str, ...] | None, graph: GraphFacts
) -> tuple[Feature, ...]:
    """One feature per column of every input, of the input's element type (a string
    input's values are Python ``str``); a one-column input that feeds an encoder or an
    imputer node takes its categories and missing values (``serving.model.schema_onnx``)."""
    facts = graph.inputs
    labels = iter(names or tuple(str(j) for j in range(sum(spec.width for spec in specs))))
    features = []
    for spec in specs:
        dtype = np.dtype(spec.dtype)
        known = facts.get(spec.name, InputFacts()) if spec.width == 1 else InputFacts()
        missing = known.missing and dtype.kind == "f"
        for _ in range(spec.width):
            kind = _KINDS[dtype.kind]
            features.append(Feature(next(labels), kind, dtype, missing, known.categories))
    return tuple(features)


def _record_feed(
    rows: npt.NDArray[Any], spec: _Input, features: tuple[Feature, ...]
) -> npt.NDArray[Any]:
    """One input's values from a typed batch: its columns, in its element type."""
    columns = [rows[f.name] for f in features[spec.start : spec.start + spec.width]]
    part = columns[0] if spec.flat else np.stack(columns, axis=1)
    if spec.dtype is object:
        return part.astype(object, copy=False)
    return np.ascontiguousarray(part, dtype=spec.dtype)


def _feature_names(specs: list[_Input], meta: dict[str, str]) -> tuple[str, ...] | None:
    """Input names for multi-input graphs; the ``feature_names`` metadata entry (a JSON
    list) for single-input ones."""
    if len(specs) > 1:
        return tuple(
            spec.name if spec.width == 1 else f"{spec.name}[{j}]"
            for spec in specs
            for j in range(spec.width)
        )
    if "feature_names" in meta:
        return tuple(str(n) for n in json.loads(meta["feature_names"]))
    return None


def _concatenate(values: list[Any]) -> Any:
    if isinstance(values[0], list):  # ZipMap rows
        return [row for value in values for row in value]
    return np.concatenate([np.asarray(v) for v in values])


def _probabilities(value: Any, classes: tuple[Any, ...] | None) -> npt.NDArray[Any]:
    if isinstance(value, list):  # ZipMap output
        keys = classes if classes is not None else tuple(value[0].keys()) if value else ()
        return np.array([[row[key] for key in keys] for row in value], dtype=np.float64)
    return np.asarray(value)
