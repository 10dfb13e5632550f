"""Custom model code: a user's Python class served like any artifact.

``SERVING_MODEL_FORMAT=python`` with ``SERVING_MODEL_CLASS=package.module:ClassName`` (or
``"class"`` in a ``SERVING_MODELS`` entry) serves any class with this contract, the one
BentoML runners and MLflow's pyfunc ``PythonModel`` popularised:

- ``ClassName()`` takes no arguments; ``load(path)`` is then called once per worker, after
  fork, with the model's path (a file, or a directory such as KServe's ``/mnt/models``).
- ``predict(instances)`` gets the batch (instances of concurrent requests merged by the
  batcher) and returns one prediction per row: an array-like, or a mapping of named
  outputs (``{"predictions": ..., "probabilities": ...}``) each with ``n_instances`` rows.
- Optional ``preprocess(instances)`` runs before ``predict`` and ``postprocess(outputs)``
  after it, on the whole batch.
- The input schema, typed as any model's (``serving.model.schema``): ``input_schema``, a
  list of MLflow column specs (``{"name": "plan", "type": "string"}``, ``"required":
  false`` where a value may be missing, our ``"categories": [...]`` where only those are
  taken); else a schema file in the model's path (``<stem>.schema.json`` or ``MLmodel``
  beside a file; ``schema.json`` or ``MLmodel`` in a directory); else ``feature_names``
  (str, in column order) or ``n_features`` (int), all float64. Any of them enables warmup
  at load and the per-request checks.
- Optional ``warmup_instances``: a list (or a method returning one) of instances the
  model takes, as a request's ``instances`` carry them (``{"plan": "pro", ...}`` or a row
  in column order): the warm-up runs on these instead of rows the server makes up (zeros,
  false, ``""`` or a known category), and a failure on them stops the load. Without
  them, the input example MLflow saved in the model's folder, if any
  (``serving.model.examples``).
  Optional ``classes`` labels the columns of ``probabilities``.
- What ``predict`` gets: with ``input_format = "dataframe"``, a pandas DataFrame of the
  schema's columns, each of its type (NaN/None where missing); otherwise (``"batch"``)
  the typed batch: ``(n_instances, n_features)`` float64 (int64 for integer features)
  when one type holds every feature, else a record array with one field per feature.

``python_handle`` is the one adapter from such an object to a ``ModelHandle``: what the
batcher hands the class is decided there and nowhere else.

Boundary: imports only the standard library, numpy and ``serving`` core modules (no Flask,
no pydantic, no prometheus). Importing the user's module runs its code: as with pickle,
serve only code you trust.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from serving.errors import ModelLoadError
from serving.model.examples import EXAMPLE_FILE, saved_examples
from serving.model.frames import frame_builder
from serving.model.handle import ModelHandle, ModelLoader, Outputs
from serving.model.schema import (
    Feature,
    feature,
    features_from_file,
    features_from_specs,
    schema_file,
)

__all__ = ["CLASS_PATTERN", "PythonLoader", "PythonModel", "import_class", "python_handle"]

#: ``package.module:ClassName`` (a dotted attribute path after the colon is allowed too).
CLASS_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_.]*$"


@runtime_checkable
class PythonModel(Protocol):
    """What ``SERVING_MODEL_CLASS`` names: ``load(path)`` once, then ``predict(instances)``.

    Usage::

        class Doubler:
            def load(self, path): self.factor = 2.0
            def predict(self, instances): return instances.sum(axis=1) * self.factor
    """

    def load(self, path: Path, /) -> Any: ...

    def predict(self, instances: Any, /) -> Any: ...


def import_class(spec: str) -> type[Any]:
    """The class ``spec`` names, ``package.module:ClassName``, imported.

    :raises ValueError: when ``spec`` is not of that form, the module cannot be imported,
        or it has no such attribute, naming which.
    """
    if not re.fullmatch(CLASS_PATTERN, spec):
        raise ValueError(f"{spec!r} is not package.module:ClassName")
    module_name, _, attribute = spec.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"cannot import {module_name!r} ({exc}); is it installed or on PYTHONPATH?"
        ) from exc
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if not isinstance(target, type):
        raise ValueError(f"{spec} is a {type(target).__name__}, not a class")
    return target


def python_handle(
    model: Any, *, name: str, version: str, source: Path | None = None
) -> ModelHandle:
    """The ``ModelHandle`` serving a loaded ``PythonModel`` instance.

    :param model: an object with ``predict`` (and optionally ``preprocess``,
        ``postprocess``, ``feature_names``, ``n_features``, ``classes``), already loaded.
    :returns: a handle whose ``predict_batch`` takes the typed batch (see the module's
        docstring) and returns ``{"predictions": ...}`` (or the model's own named outputs),
        each as an ndarray; a wrong row count is refused by the batcher, per request.
    :raises ModelLoadError: when ``model`` has no callable ``predict`` or its input schema
        is malformed.
    """
    if not callable(getattr(model, "predict", None)):
        raise ModelLoadError(source, f"{type(model).__name__} has no predict(instances)")
    preprocess = getattr(model, "preprocess", None)
    postprocess = getattr(model, "postprocess", None)
    features = declared_schema(model, source)
    feature_names = _feature_names(model, source, features)
    n_features = getattr(model, "n_features", None)
    if n_features is None and feature_names is not None:
        n_features = len(feature_names)
    classes = getattr(model, "classes", None)
    examples = _warmup_instances(model, source)
    to_input = _input_builder(model, source, features, feature_names)

    def predict_batch(rows: npt.NDArray[Any]) -> Outputs:
        batch = to_input(rows) if to_input is not None else rows
        batch = preprocess(batch) if preprocess is not None else batch
        outputs = model.predict(batch)
        if postprocess is not None:
            outputs = postprocess(outputs)
        if isinstance(outputs, Mapping):
            return {str(key): np.asarray(value) for key, value in outputs.items()}
        return {"predictions": np.asarray(outputs)}

    return ModelHandle(
        name=name,
        version=version,
        format="python",
        predict_batch=predict_batch,
        source=source,
        n_features=int(n_features) if n_features is not None else None,
        classes=tuple(classes) if classes is not None else None,
        feature_names=feature_names,
        features=features,
        examples=examples,
        examples_from="warmup_instances",
    )


def _warmup_instances(model: Any, source: Path | None) -> tuple[Any, ...] | None:
    """The model's ``warmup_instances`` (an attribute, or a method called once), or None.

    :raises ModelLoadError: when they are not a non-empty list of instances (each a
        mapping of feature name to value or a list of values), or the method raises.
    """
    given = getattr(model, "warmup_instances", None)
    if given is None:
        return None
    where = f"{type(model).__name__}.warmup_instances"
    if callable(given):
        try:
            given = given()
        except Exception as exc:
            raise ModelLoadError(source, f"{where}() raised {type(exc).__name__}: {exc}") from exc
    if (
        isinstance(given, (str, bytes, Mapping))
        or not isinstance(given, Sequence)
        or not given
        or (
            not all(isinstance(i, Mapping) for i in given)
            and not all(isinstance(i, Sequence) and not isinstance(i, str) for i in given)
        )
    ):
        raise ModelLoadError(
            source, f"{where} must be a non-empty list of instances, each a mapping of "
            "feature name to value or a list of values in column order",
        )  # fmt: skip
    return tuple(given)


def _feature_names(
    model: Any, source: Path | None, features: tuple[Feature, ...] | None
) -> tuple[str, ...] | None:
    """The model's column names: its input schema's, else its ``feature_names``; both
    must agree where both are given.

    :raises ModelLoadError: for ``feature_names`` that are not a sequence of str, or that
        differ from the schema's columns.
    """
    names = getattr(model, "feature_names", None)
    if names is not None and (
        isinstance(names, str)
        or not isinstance(names, Sequence)
        or not all(isinstance(n, str) for n in names)
    ):
        raise ModelLoadError(source, "feature_names must be a sequence of str")
    feature_names = tuple(names) if names is not None else None
    if features is None:
        return feature_names
    declared = tuple(f.name for f in features)
    if feature_names is not None and feature_names != declared:
        raise ModelLoadError(
            source, f"feature_names {list(feature_names)} differ from the input schema's "
            f"columns {list(declared)}",
        )  # fmt: skip
    return declared


def _input_builder(
    model: Any,
    source: Path | None,
    features: tuple[Feature, ...] | None,
    feature_names: tuple[str, ...] | None,
) -> Callable[[npt.NDArray[Any]], Any] | None:
    """What turns the typed batch into the model's input: a pandas DataFrame of its
    columns for ``input_format = "dataframe"``, else None (the batch as it is).

    :raises ModelLoadError: for another ``input_format``, or ``dataframe`` without columns.
    """
    input_format = getattr(model, "input_format", "batch")
    if input_format not in ("batch", "dataframe"):
        raise ModelLoadError(
            source, f"input_format must be 'batch' or 'dataframe', not {input_format!r}"
        )
    if input_format == "batch":
        return None
    if features is None and feature_names is None:
        raise ModelLoadError(
            source,
            "input_format 'dataframe' needs the columns: an input_schema, a schema file "
            "or feature_names",
        )
    assert feature_names is not None
    columns = features or tuple(feature(name, "float", np.float64) for name in feature_names)
    return frame_builder(columns)


def declared_schema(model: Any, source: Path | None) -> tuple[Feature, ...] | None:
    """The input schema ``model`` declares: its ``input_schema`` (column specs), else a
    schema file in its path (``<stem>.schema.json`` or ``MLmodel`` beside a file,
    ``schema.json`` or ``MLmodel`` in a directory); None when neither.

    :raises ModelLoadError: naming the class or file and the entry that cannot be read.
    """
    specs = getattr(model, "input_schema", None)
    try:
        if specs is not None:
            return features_from_specs(specs, f"{type(model).__name__}.input_schema")
        if source is None:
            return None
        if source.is_dir():
            found = next(
                (source / n for n in ("schema.json", "MLmodel") if (source / n).is_file()), None
            )
        else:
            found = schema_file(source)
        return features_from_file(found) if found is not None else None
    except (OSError, ValueError) as exc:
        raise ModelLoadError(source, str(exc)) from None


class PythonLoader(ModelLoader):
    """Instantiates ``class_path`` (``package.module:ClassName``), calls ``load(path)``.

    Usage::

        loader = PythonLoader("examples.custom_model:ChurnModel")
        handle = load_model("models/churn", "python", loaders={"python": loader})
    """

    reads_path = True  # the class reads its own path, a file or a directory

    def __init__(self, class_path: str) -> None:
        self.class_path = class_path

    def load(
        self, path: Path, data: bytes | None, *, name: str, version: str, threads: int = 1
    ) -> ModelHandle:
        try:
            cls = import_class(self.class_path)
        except ValueError as exc:
            raise ModelLoadError(path, f"SERVING_MODEL_CLASS: {exc}") from None
        model = cls()
        if not isinstance(model, PythonModel):
            raise ModelLoadError(path, f"{self.class_path} has no load(path) and predict()")
        model.load(path)
        handle = python_handle(model, name=name, version=version, source=path)
        if handle.examples is None:
            examples = saved_examples(path)  # MLflow's input_example in its folder
            if examples is not None:
                return replace(handle, examples=examples, examples_from=EXAMPLE_FILE)
        return handle
