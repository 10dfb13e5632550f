"""``/predict`` bodies <-> the data plane: ``{"instances": [...]}`` -> ``Frame`` (lists of
values in the model's feature order) or ``Records`` (objects keyed by feature name), and
a model's outputs -> ``{"predictions", "probabilities", "classes", "outputs", ...}``."""

from __future__ import annotations

from typing import Any

from serving.dataplane import Inference
from serving.inputs.instances import Frame, Instances, Records
from serving.protocols.base import jsonable
from serving.protocols.predict.schemas import PredictRequest

__all__ = ["decode", "encode"]


def decode(body: PredictRequest) -> Instances:
    """The instances of a validated body (its schema allows lists or objects, not both)."""
    if isinstance(body.instances[0], dict):
        return Records(body.instances)
    return Frame(body.instances)


def encode(answer: Inference, wanted: list[str] | None, latency_ms: float) -> dict[str, Any]:
    """The response body: predictions, probabilities and their classes when the model gives
    them, the ``outputs`` asked for (``wanted``), the model and the server-side latency."""
    handle, outputs = answer.handle, answer.outputs
    body: dict[str, Any] = {"predictions": jsonable(outputs["predictions"])}
    if "probabilities" in outputs:
        body["probabilities"] = jsonable(outputs["probabilities"])
        if handle.classes is not None:
            body["classes"] = handle.classes
    if wanted is not None:
        body["outputs"] = {name: jsonable(outputs[name]) for name in wanted}
    body["model_name"] = handle.name
    body["model_version"] = handle.version
    body["latency_ms"] = latency_ms
    return body
