"""A request's instances as a protocol's codec decodes them, before any model is known.

Every protocol's codec turns its body into one of four shapes, none of which needs the
model: ``Frame`` (rows of values, positional or named by a header: ``/predict`` lists,
TF Serving rows, MLflow ``dataframe_split`` and CSV), ``Records`` (one object per
instance: ``/predict`` objects, MLflow ``dataframe_records``), ``Columns`` (one list of
values per name: TF Serving columnar, MLflow ``inputs``) and ``Tensors`` (KServe V2's
typed input tensors). The data plane resolves the model once and hands the instances to
``conform`` with the model's handle, which checks them against the model's inputs and
builds the batch the batcher merges.

``field`` is where the instances are in the request (``instances``, ``inputs``,
``dataframe_split.data``), for error locations.

Boundary: standard library, numpy and ``serving`` core modules (no Flask, no pydantic).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy.typing as npt

__all__ = ["Columns", "Frame", "Instances", "Records", "Tensors", "Unnamed"]

#: What object keys mean for a model that knows no feature names: nothing (refused, as
#: ``/predict`` does), or the columns in the first object's key order (MLflow records).
Unnamed = Literal["refuse", "key_order"]


@dataclass(slots=True)
class Frame:
    """Row-major instances: each row one value per column. ``columns`` names them (a CSV
    header, ``dataframe_split.columns``); ``None`` means the model's feature order."""

    rows: Sequence[Sequence[Any]]
    columns: Sequence[str] | None = None
    field: str = "instances"
    #: Where ``columns`` are in the request, for errors (``dataframe_split.columns``).
    columns_field: str = "columns"
    #: The values are text cells (CSV), read by each feature's kind (``cells.from_text``).
    text: bool = False

    def __len__(self) -> int:
        return len(self.rows)


@dataclass(slots=True)
class Records:
    """One object per instance, keyed by feature name (one value each) or by input name
    (a list of the input's values, for models whose inputs are several columns wide)."""

    rows: Sequence[Mapping[str, Any]]
    field: str = "instances"
    unnamed: Unnamed = "refuse"

    def __len__(self) -> int:
        return len(self.rows)


@dataclass(slots=True)
class Columns:
    """Column-major instances: each feature or input name -> one value per instance.
    Every column has ``n`` values (the codec checks that, naming the column)."""

    data: Mapping[str, Sequence[Any]]
    n: int
    field: str = "inputs"
    unnamed: Unnamed = "key_order"

    def __len__(self) -> int:
        return self.n


@dataclass(slots=True)
class Tensors:
    """KServe V2 input tensors in request order: ``(name, values)``, each ``values`` of
    shape ``(n_instances,)`` or ``(n_instances, width)`` and the element type the request
    declared (``BYTES`` as an object array of ``str``)."""

    inputs: Sequence[tuple[str, npt.NDArray[Any]]]
    field: str = "inputs"

    def __len__(self) -> int:
        return len(self.inputs[0][1]) if self.inputs else 0


Instances = Frame | Records | Columns | Tensors
