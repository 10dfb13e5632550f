"""``POST /predict``: ``{"instances": [[...], ...]}`` -> one prediction per instance."""

from __future__ import annotations

import time
from typing import Any, cast

import numpy as np
import numpy.typing as npt
from flask import Blueprint, Response, g

from serving.api.common import context, json_response, read_json_body
from serving.errors import InvalidInput, Overloaded, PayloadTooLarge, VersionConflict
from serving.schemas import PredictRequest, parse_body

__all__ = ["bp", "check_outputs", "check_range", "to_matrix"]

bp = Blueprint("predict", __name__)


def to_matrix(instances: list[list[float]], n_features: int | None) -> npt.NDArray[np.float64]:
    """``instances`` as a float64 array of shape ``(n_instances, n_features)``.

    :param n_features: features the model expects, or ``None`` when it does not say (then
        every row must be as long as the first).
    :raises InvalidInput: (422) naming the first instance whose length is wrong.
    """
    expected = n_features if n_features is not None else len(instances[0])
    for index, row in enumerate(instances):
        if len(row) != expected:
            source = "the model expects" if n_features is not None else "instances[0] has"
            raise InvalidInput(
                f"instances[{index}] has {len(row)} features; {source} {expected}",
                [
                    {
                        "loc": f"instances[{index}]",
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
) -> None:
    """Refuse values the model's input types cannot hold: 1e39 into a float32 graph would
    become infinity inside the model, 2.5 into an int64 input would be truncated.

    :param dtype: the element type of every column, unless ``column_dtypes`` gives one per
        column (a multi-input ONNX graph).
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
            loc = f"instances[{i}][{j}]"
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


@bp.post("/predict", provide_automatic_options=False)
def predict() -> Response:
    ctx = context()
    settings = ctx.settings
    request = parse_body(PredictRequest, read_json_body(settings.max_body_bytes))
    n = len(request.instances)
    if n > settings.max_instances_per_request:
        raise PayloadTooLarge(
            "request",
            n,
            settings.max_instances_per_request,
            "SERVING_MAX_INSTANCES_PER_REQUEST",
            "instances",
        )
    runtime = ctx.get_runtime()
    if request.model_version is not None and request.model_version != runtime.model_version:
        raise VersionConflict(request.model_version, runtime.model_version)
    handle, batcher = runtime.require_ready()
    check_outputs(request.outputs, handle.output_names)
    g.log_fields["instances"] = n
    rows = to_matrix(request.instances, handle.n_features)
    check_range(rows, handle.input_dtype, handle.column_dtypes)
    waited_s = time.perf_counter() - g.started
    try:
        outputs = batcher.submit_many(
            rows, timeout_s=settings.request_timeout_ms / 1000 - waited_s, stats=g.log_fields
        )
    except Overloaded:
        ctx.metrics.rejected.inc()
        raise
    body: dict[str, Any] = {"predictions": _jsonable(outputs["predictions"])}
    if "probabilities" in outputs:
        body["probabilities"] = _jsonable(outputs["probabilities"])
        if handle.classes is not None:
            body["classes"] = handle.classes
    if request.outputs is not None:
        check_outputs(request.outputs, tuple(outputs))
        body["outputs"] = {name: _jsonable(outputs[name]) for name in request.outputs}
    body["model_name"] = handle.name
    body["model_version"] = handle.version
    body["latency_ms"] = (time.perf_counter() - g.started) * 1000.0
    return json_response(body)


def _jsonable(array: npt.NDArray[Any]) -> Any:
    """orjson serializes numeric and bool arrays natively, but only C-contiguous ones (a batch
    slice of a Fortran-ordered output, e.g. GaussianNB's predict_proba, is not); labels
    (str/object) go through tolist(). Non-finite floats become null."""
    if array.dtype.kind in "biuf":
        return np.ascontiguousarray(array)
    return array.tolist()
