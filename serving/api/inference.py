"""The request path every protocol shares: rows from instances, checks, the batcher call.

Each blueprint (``/predict``, KServe V2, TF Serving, MLflow) parses its own body shape,
then comes here: ``to_matrix`` builds the ``(n_instances, n_features)`` float64 array
(reordering named features), ``run_batch`` checks the values against the model's input
types and waits for this request's rows from the model's batcher, so requests of every
protocol are merged into the same predict calls.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from flask import g

from serving.api.common import context
from serving.errors import InvalidInput, Overloaded, PayloadTooLarge, RequestTimeout
from serving.handle import ModelHandle, Outputs
from serving.runtime import ModelRuntime

__all__ = [
    "check_instance_count",
    "check_outputs",
    "check_range",
    "jsonable",
    "run_batch",
    "to_matrix",
]

Instance = Sequence[float] | Mapping[str, float]


def check_instance_count(n: int) -> None:
    """:raises PayloadTooLarge: (413) above ``SERVING_MAX_INSTANCES_PER_REQUEST``."""
    limit = context().settings.max_instances_per_request
    if n > limit:
        raise PayloadTooLarge(
            "request", n, limit, "SERVING_MAX_INSTANCES_PER_REQUEST", "instances"
        )  # fmt: skip


def _detail(loc: str, msg: str, kind: str) -> InvalidInput:
    return InvalidInput(f"{loc}: {msg}", [{"loc": loc, "msg": msg, "type": kind}])


def _named_rows(
    instances: Sequence[Instance], names: tuple[str, ...] | None, field: str
) -> list[list[float]]:
    """Rows of named-feature instances, in ``names`` order."""
    if names is None:
        raise _detail(
            f"{field}[0]", "the model does not know its feature names; send each instance as "
            "a list of values in training order", "feature_names",
        )  # fmt: skip
    known = set(names)
    rows = []
    for index, instance in enumerate(instances):
        if not isinstance(instance, Mapping):
            raise _detail(f"{field}[{index}]", "mixes lists and objects", "instance_kind")
        missing = [name for name in names if name not in instance]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            msg = f"missing feature {missing[0]!r}{more}"
            raise _detail(f"{field}[{index}]", msg, "missing_feature")
        if len(instance) != len(names):
            unknown = next(key for key in instance if key not in known)
            msg = f"unknown feature {unknown!r}; the model's features are {', '.join(names)}"
            raise _detail(f"{field}[{index}].{unknown}", msg, "unknown_feature")
        rows.append([instance[name] for name in names])
    return rows


def to_matrix(
    instances: Sequence[Instance], handle: ModelHandle, field: str = "instances"
) -> npt.NDArray[np.float64]:
    """``instances`` as a float64 array of shape ``(n_instances, n_features)``.

    Each instance is a list of values in the model's feature order, or an object keyed by
    feature name (``handle.feature_names``), reordered to that order.

    :param field: the request field the instances came from, for error locations.
    :raises InvalidInput: (422) naming the first instance whose length is wrong, or the
        missing or unknown feature name.
    """
    if instances and isinstance(instances[0], Mapping):
        instances = _named_rows(instances, handle.feature_names, field)
    n_features = handle.n_features
    expected = n_features if n_features is not None else len(instances[0])
    for index, row in enumerate(instances):
        if isinstance(row, Mapping):
            raise _detail(f"{field}[{index}]", "mixes lists and objects", "instance_kind")
        if len(row) != expected:
            source = "the model expects" if n_features is not None else "instances[0] has"
            raise InvalidInput(
                f"{field}[{index}] has {len(row)} features; {source} {expected}",
                [
                    {
                        "loc": f"{field}[{index}]",
                        "msg": f"expected {expected} features, got {len(row)}",
                        "type": "feature_count",
                    }
                ],
            )
    return np.array(instances, dtype=np.float64)


def check_range(
    rows: npt.NDArray[np.float64],
    dtype: npt.DTypeLike,
    column_dtypes: tuple[np.dtype[Any], ...] | None = None,
    field: str = "instances",
    feature_names: tuple[str, ...] | None = None,
) -> None:
    """Refuse values the model's input types cannot hold: 1e39 into a float32 graph would
    become infinity inside the model, 2.5 into an int64 input would be truncated.

    :param dtype: the element type of every column, unless ``column_dtypes`` gives one per
        column (a multi-input ONNX graph).
    :param field: where the rows came from, for the error's location: ``instances[i][j]``
        for ``/predict``, else ``<field>: instance i, feature j ('name')``.
    :raises InvalidInput: (422) naming the first such value's instance and feature.
    """
    kinds = column_dtypes if column_dtypes is not None else (np.dtype(dtype),)
    for kind in dict.fromkeys(kinds):
        columns = rows if column_dtypes is None else rows[:, [k == kind for k in kinds]]
        if kind.kind == "f" and kind.itemsize < 8:
            limit = float(np.finfo(cast(Any, kind)).max)
            bad, why = np.abs(columns) > limit, f"outside the model's {kind.name} range"
            why += f" (|x| <= {limit:.4g})"
        elif kind.kind in "iu":
            info = np.iinfo(cast(Any, kind))
            bad = (columns != np.round(columns)) | (columns < info.min) | (columns > info.max)
            why = f"not an integer the model's {kind.name} input can hold"
        else:
            continue
        if bad.any():
            i, j = (int(k) for k in np.argwhere(bad)[0])
            if column_dtypes is not None:
                j = [c for c, k in enumerate(kinds) if k == kind][j]
            if field == "instances":
                loc = f"instances[{i}][{j}]"
            else:
                name = f" ({feature_names[j]!r})" if feature_names else ""
                loc = f"{field}: instance {i}, feature {j}{name}"
            msg = f"{rows[i, j]:g} is {why}"
            raise InvalidInput(f"{loc}: {msg}", [{"loc": loc, "msg": msg, "type": "out_of_range"}])


def check_outputs(wanted: list[str] | None, available: tuple[str, ...] | None) -> None:
    """:raises InvalidInput: (422) naming the first output in ``wanted`` the model does not
    have (nothing to check while ``available`` is unknown)."""
    for index, name in enumerate(wanted or ()):
        if available is not None and name not in available:
            loc, msg = f"outputs[{index}]", f"the model has no output {name!r}"
            msg += f" (it has {', '.join(available)})"
            raise InvalidInput(f"{loc}: {msg}", [{"loc": loc, "msg": msg, "type": "output"}])


def run_batch(
    runtime: ModelRuntime, rows: npt.NDArray[np.float64], field: str = "instances"
) -> tuple[ModelHandle, Outputs]:
    """Check ``rows`` against the model's input types, queue them on the model's batcher
    and wait for their outputs, within what is left of ``SERVING_REQUEST_TIMEOUT_MS``.
    ``field`` names where the rows came from in the request, for error locations.

    :raises NotReady: (503) when the model is not loaded yet or is stopping.
    :raises InvalidInput: (422) for a value the model's input type cannot hold.
    :raises Overloaded: (503) when the model's queue is full (counted in the metrics).
    :raises RequestTimeout: (408) when receiving the request used up the deadline.
    :raises InferenceTimeout: (504) past the deadline.
    :raises InferenceError: (500) when the model fails on these rows.
    """
    ctx = context()
    handle, batcher = runtime.require_ready()
    check_range(rows, handle.input_dtype, handle.column_dtypes, field, handle.feature_names)
    g.log_fields.update(instances=len(rows), model=handle.name, model_version=handle.version)
    elapsed_s = time.perf_counter() - g.started
    timeout_s = ctx.settings.request_timeout_ms / 1000 - elapsed_s
    if timeout_s <= 0:  # nothing queued: the time went into receiving the request
        raise RequestTimeout(
            f"the request took {elapsed_s * 1000:.0f} ms to arrive, past "
            f"SERVING_REQUEST_TIMEOUT_MS ({ctx.settings.request_timeout_ms:g} ms)"
        )
    queued = batcher.queue_depth + len(rows)
    if queued <= runtime.settings.max_queue_depth:  # else refused below, never queued
        ctx.metrics.observe_queue(handle.name, handle.version, queued)
    try:
        return handle, batcher.submit_many(rows, timeout_s=timeout_s, stats=g.log_fields)
    except Overloaded:
        ctx.metrics.rejected.labels(handle.name, handle.version).inc()
        raise


def jsonable(array: npt.NDArray[Any]) -> Any:
    """orjson serializes numeric and bool arrays natively, but only C-contiguous ones (a batch
    slice of a Fortran-ordered output, e.g. GaussianNB's predict_proba, is not); labels
    (str/object) go through tolist(). Non-finite floats become null."""
    if array.dtype.kind in "biuf":
        return np.ascontiguousarray(array)
    return array.tolist()
