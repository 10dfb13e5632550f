"""A model's input schema: its features, each with a kind, an element type, whether it
may be missing and, for categorical features, the values it knows.

Known at load, from (in this order of precedence):

1. a schema file beside the model: an MLflow ``MLmodel`` file's ``signature.inputs``
   (the format MLflow users already have), or ``<model stem>.schema.json`` holding
   ``{"inputs": [...]}`` in the same column-spec format: ``{"name": "plan", "type":
   "string", "required": true}`` with MLflow's types ``double``, ``float``, ``long``,
   ``integer``, ``string``, ``boolean``, and our optional ``"categories": [...]`` (the
   only values taken); or, for your own class, its ``input_schema`` in that format;
2. the fitted estimator itself (``serving.model.schema_sklearn``): ``feature_names_in_``, the
   columns a ``ColumnTransformer`` sends to a ``OneHotEncoder``/``OrdinalEncoder`` and
   their ``categories_``, and scikit-learn's estimator tags for missing values;
3. an ONNX graph's input types (``serving.model.onnx_loader``).

Boundary: standard library and numpy; PyYAML is imported only to read an ``MLmodel`` file.
The DataFrame a model fitted on one is called with: ``serving.model.frames``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import numpy.typing as npt

__all__ = [
    "Feature",
    "Kind",
    "column_dtype",
    "features_from_file",
    "features_from_specs",
    "instance_json_schema",
    "merge_features",
    "sample_batch",
    "schema_file",
    "structured_dtype",
    "uniform_dtype",
]

#: ``float``: any real number; ``integer``: whole numbers only, exact (no float64 detour);
#: ``string``: text (categorical features); ``boolean``: true/false; ``any``: a column the
#: model drops (any JSON value is passed on as it is).
Kind = Literal["float", "integer", "string", "boolean", "any"]


@dataclass(frozen=True, slots=True)
class Feature:
    """One input column of a model.

    :param dtype: the element type the model receives: float64/float32, int64/int32,
        bool, or object (Python ``str`` values, or anything for ``any``).
    :param missing: ``null`` (NaN in CSV) is passed on as NaN/None; else it is refused.
    :param categories: the values a categorical feature knows, when an unknown value is
        refused (the encoder's ``handle_unknown="error"``); ``None`` accepts any value.
    :param booleans: ``true`` and ``false`` are taken as 1 and 0: a number feature whose
        type was guessed from a scikit-learn model (which keeps no column types, and
        casts a bool column to numbers itself).
    :param missing_is_none: a missing string reaches the model as ``None`` (in an object
        column), not NaN: its encoder was fitted on ``None``, which it knows as a
        category, and would take NaN for an unknown one.
    :param pandas_categories: the categories, in order, of the pandas ``category`` column
        the model was fitted on and encodes itself (LightGBM, XGBoost): the column reaches
        it as that dtype again, a value not among them as NaN (``serving.model.frames``).
    """

    name: str
    kind: Kind
    dtype: np.dtype[Any]
    missing: bool = False
    categories: frozenset[Any] | None = None
    booleans: bool = False
    missing_is_none: bool = False
    pandas_categories: tuple[Any, ...] | None = None


_MLFLOW_TYPES: dict[str, tuple[Kind, type[np.generic] | type[object]]] = {
    "double": ("float", np.float64),
    "float": ("float", np.float32),
    "long": ("integer", np.int64),
    "integer": ("integer", np.int32),
    "string": ("string", object),
    "boolean": ("boolean", np.bool_),
}


def feature(name: str, kind: Kind, dtype: npt.DTypeLike, **kw: Any) -> Feature:
    """``Feature`` with ``dtype`` as a numpy dtype."""
    return Feature(name, kind, np.dtype(dtype), **kw)


def schema_file(model_path: Path) -> Path | None:
    """The schema file for ``model_path``: ``<stem>.schema.json`` beside it, else an
    ``MLmodel`` file in its folder; None when there is neither."""
    own = model_path.with_name(f"{model_path.stem}.schema.json")
    if own.is_file():
        return own
    mlmodel = model_path.with_name("MLmodel")
    return mlmodel if mlmodel.is_file() else None


def features_from_file(path: Path) -> tuple[Feature, ...] | None:
    """The features a schema file declares (None: an ``MLmodel`` without a signature, or a
    tensor-based signature, which says nothing about columns).

    :raises ValueError: naming the file and the entry that cannot be read, never quoting
        the file's lines; for a link out of the model's folder (a link within it, as a
        Kubernetes volume's ``..data/``, is read).
    """
    folder = path.parent.resolve()
    if not path.resolve().is_relative_to(folder):
        raise ValueError(f"{path.name} is a link out of the model's folder: copy the file in")
    text = path.read_text()
    if path.name == "MLmodel":
        import yaml

        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
            raise ValueError(f"MLmodel is not valid YAML{where}") from None
        if not isinstance(document, dict | None):
            raise ValueError("MLmodel is not a mapping of MLflow's fields")
        signature = (document or {}).get("signature") or {}
        if not isinstance(signature, dict):
            raise ValueError("MLmodel's signature is not a mapping (inputs, outputs)")
        inputs = signature.get("inputs")
        if inputs is None:
            return None
        specs = _json(inputs, "MLmodel's signature inputs") if isinstance(inputs, str) else inputs
    else:
        document = _json(text, path.name)
        if not isinstance(document, dict):
            raise ValueError(f"{path.name} is not an object with inputs")
        specs = document.get("inputs")
    return features_from_specs(specs, str(path))


def _json(text: str, what: str) -> Any:
    """``text`` parsed as JSON; the error names ``what`` and the place, not the text.

    :raises ValueError: when it is not JSON.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"{what}: not valid JSON (line {exc.lineno}, column {exc.colno})"
        ) from None


def _names(names: Sequence[str], most: int = 8) -> str:
    """At most ``most`` of ``names`` (each cut to 64 characters) for a message, and how
    many there are when that is more."""
    shown = ", ".join(repr(name[:64]) for name in names[:most])
    more = f", ... ({len(names):,} in all)" if len(names) > most else ""
    return f"[{shown}{more}]"


def features_from_specs(specs: Any, where: str) -> tuple[Feature, ...] | None:
    """The features of a list of MLflow column specs: ``{"name", "type", "required"}``
    (``required`` false: the value may be missing), plus our optional ``categories`` (the
    only values taken; others are refused naming the feature). None for a tensor spec.

    :raises ValueError: naming ``where`` and the entry that cannot be read.
    """
    if not isinstance(specs, list) or not specs:
        raise ValueError(f"{where}: expected a non-empty list of inputs")
    features = []
    for index, spec in enumerate(specs):
        if not isinstance(spec, dict) or "type" not in spec:
            raise ValueError(f"{where}: input {index} is not a column spec with a type")
        if spec["type"] == "tensor":
            return None
        kind_dtype = _MLFLOW_TYPES.get(spec["type"])
        if kind_dtype is None:
            known = ", ".join(_MLFLOW_TYPES)
            raise ValueError(f"{where}: input {index} has type {spec['type']!r} (known: {known})")
        name = spec.get("name")
        if not isinstance(name, str):
            raise ValueError(f"{where}: input {index} has no name")
        categories = spec.get("categories")
        if categories is not None and (not isinstance(categories, list) or not categories):
            raise ValueError(f"{where}: input {name!r} has categories that are not a list")
        kind, dtype = kind_dtype
        features.append(feature(
            name, kind, dtype, missing=not spec.get("required", True),
            categories=frozenset(categories) if categories is not None else None,
        ))  # fmt: skip
    return tuple(features)


def merge_features(
    declared: Sequence[Feature] | None,
    inferred: Sequence[Feature] | None,
    nulls: Literal["declared", "estimator"] = "declared",
) -> tuple[Feature, ...] | None:
    """A schema file's features, with the categories the estimator knows for each (and
    whether its encoder takes a missing string as ``None``, the pandas categories it
    encodes itself); the estimator's when there is no file.

    :param nulls: whether a feature may be missing: as the file declares it
        (``declared``: a ``schema.json``'s ``required``), or as the estimator takes it
        (``estimator``: an ``MLmodel``, whose ``required`` says only that the column is
        sent, as MLflow enforces it, not that training had no NaN in it).

    :raises ValueError: when the file names features the estimator was not fitted on.
    """
    if declared is None:
        return tuple(inferred) if inferred is not None else None
    if inferred is None:
        return tuple(declared)
    known = {f.name: f for f in inferred}
    if [f.name for f in declared] != list(known) and set(known) != {f.name for f in declared}:
        raise ValueError(
            f"the schema file names features {_names([f.name for f in declared])}, but the "
            f"model was fitted on {_names(list(known))}"
        )
    merged = [
        replace(
            f, categories=known[f.name].categories,
            missing=known[f.name].missing if nulls == "estimator" else f.missing,
            missing_is_none=known[f.name].missing_is_none and f.dtype.kind == "O",
            pandas_categories=known[f.name].pandas_categories,
        )
        for f in declared
    ]  # fmt: skip
    by_name = {f.name: f for f in merged}
    return tuple(by_name[name] for name in known)  # the model's column order


def column_dtype(f: Feature) -> np.dtype[Any]:
    """The element type of ``f``'s column in a batch: its own, except float64 for an
    integer feature that may be missing (NaN, as pandas holds it) and object for a
    boolean one (None)."""
    if f.missing and f.kind == "integer":
        return np.dtype(np.float64)
    if f.missing and f.kind == "boolean":
        return np.dtype(object)
    return f.dtype


def structured_dtype(features: Sequence[Feature]) -> np.dtype[Any]:
    """The record dtype of a typed batch: one field per feature, in order."""
    return np.dtype([(f.name, column_dtype(f)) for f in features])


_R = TypeVar("_R")


def once_per_features(
    work_out: Callable[[Sequence[Feature]], _R],
) -> Callable[[Sequence[Feature]], _R]:
    """``work_out(features)``, computed once per features object (a model's, the same tuple
    on every request) and kept by its id beside it, so an id is never reused: what a
    request asks of a model's schema costs a dict lookup, not a pass over every feature
    (a dataclass hash each, were the tuple a cache key)."""
    found: dict[int, tuple[Sequence[Feature], _R]] = {}

    @functools.wraps(work_out)
    def cached(features: Sequence[Feature]) -> _R:
        entry = found.get(id(features))
        if entry is not None and entry[0] is features:
            return entry[1]
        result = work_out(features)
        if len(found) >= 64:  # the features of models no longer served
            found.clear()
        found[id(features)] = (features, result)
        return result

    return cached


@once_per_features
def uniform_dtype(features: Sequence[Feature]) -> np.dtype[Any] | None:
    """The one element type of a ``(n_instances, n_features)`` matrix that holds every
    feature exactly: the features' own when they all have one (float32 for a float32
    ONNX graph, so its batch needs no cast and a float32 tensor is the batch as sent),
    else float64 for float features, int64 for integer ones; None when the features need
    a record per instance (mixed kinds)."""
    kinds = {f.kind for f in features}
    if kinds == {"float"} or (kinds == {"integer"} and not any(f.missing for f in features)):
        dtypes = {f.dtype for f in features}
        if len(dtypes) == 1:
            return dtypes.pop()
        return np.dtype(np.float64 if kinds == {"float"} else np.int64)
    return None


def sample_batch(features: Sequence[Feature], n: int) -> npt.NDArray[Any]:
    """``n`` instances of valid values for warmup: a known category where a feature refuses
    unknown ones (a model whose integer categories exclude 0 failed its warmup on 0), else
    0, false or an empty string."""
    matrix = uniform_dtype(features)
    if matrix is not None:
        batch = np.zeros((n, len(features)), dtype=matrix)
        for j, f in enumerate(features):
            batch[:, j] = _sample_value(f)
        return batch
    records = np.zeros(n, dtype=structured_dtype(features))
    for f in features:
        records[f.name] = _sample_value(f)
    return records


def _sample_value(f: Feature) -> Any:
    """The smallest of ``f``'s categories (a string for a string feature, when it has
    one), else the first of its pandas categories, else 0 (numbers, false) or ``""``
    (strings, anything)."""
    if f.pandas_categories:
        return f.pandas_categories[0]
    if f.categories:
        strings = sorted(c for c in f.categories if isinstance(c, str))
        numbers = sorted(c for c in f.categories if not isinstance(c, str))
        if f.dtype.kind == "O":
            return strings[0] if strings else numbers[0]
        return numbers[0] if numbers else 0
    return "" if f.dtype.kind == "O" else 0


def instance_json_schema(features: Sequence[Feature], named: bool) -> dict[str, Any]:
    """JSON Schema of one instance (an object keyed by feature name when ``named``, else a
    list in feature order): each feature's JSON type, ``null`` where it may be missing,
    its categories as an ``enum`` where unknown ones are refused."""

    def one(f: Feature) -> dict[str, Any]:
        json_type = {"float": "number", "integer": "integer", "string": "string",
                     "boolean": "boolean"}.get(f.kind)  # fmt: skip
        if json_type is None:  # a column the model drops: anything
            return {}
        schema: dict[str, Any] = {"type": [json_type, "null"] if f.missing else json_type}
        if f.categories is not None:
            schema["enum"] = sorted(f.categories, key=repr) + ([None] if f.missing else [])
        if f.kind == "integer" and f.dtype.kind in "iu":
            info = np.iinfo(f.dtype)
            schema.update(minimum=int(info.min), maximum=int(info.max))
        return schema

    if named:
        return {
            "type": "object",
            "properties": {f.name: one(f) for f in features},
            "required": [f.name for f in features],
            "additionalProperties": False,
        }
    return {
        "type": "array",
        "prefixItems": [one(f) for f in features],
        "minItems": len(features),
        "maxItems": len(features),
    }
