"""The heavy forest behind BentoML 1.4, as its users write a service: ``bench/bentoml_load.py``
serves it with ``bentoml serve bentoml_service:HeavyForest`` from ``/work/main/.venv-bento``.

    bentoml serve bentoml_service:HeavyForest --working-dir bench --host 127.0.0.1 \\
        --port 3000 --arg model_path=bench/results/models/heavy_forest.joblib

``POST /predict`` takes the body our ``/predict`` takes, ``{"instances": [[30 floats]]}``
(``instances``: ``(n_instances, 30)`` float64), and answers one object per instance,
``[{"prediction": label, "probabilities": [p_class0, p_class1]}]``. The API is batchable
(BentoML's adaptive batching, its ``CorkDispatcher``): each worker merges concurrent
requests along axis 0, up to ``max_batch_size`` rows (32, as our ``SERVING_MAX_BATCH_SIZE``),
and answers 503 for a request it expects to finish later than ``max_latency_ms`` (a
deadline, not a batching window). Labels come from the same ``predict_proba`` pass, as
scikit-learn's forest ``predict`` computes them (``classes_[argmax]``).

Runs in BentoML's own venv (bentoml, scikit-learn, joblib, numpy): imports nothing of
``serving`` or of the rest of ``bench``.
"""

from __future__ import annotations

from typing import Annotated, Any

import bentoml
import joblib
import numpy as np
from bentoml.validators import DType, Shape
from pydantic import BaseModel

__all__ = ["Arguments", "HeavyForest"]


class Arguments(BaseModel):
    """``bentoml serve --arg NAME=VALUE`` (BentoML's ``use_arguments``)."""

    model_path: str
    workers: int = 2
    max_batch_size: int = 32
    max_latency_ms: int = 1000


ARGS = bentoml.use_arguments(Arguments)


@bentoml.service(workers=ARGS.workers, threads=1)
class HeavyForest:
    """One joblib pipeline per worker, loaded once at the worker's start."""

    def __init__(self) -> None:
        self.model = joblib.load(ARGS.model_path)
        self.classes = self.model.classes_

    @bentoml.api(
        batchable=True, max_batch_size=ARGS.max_batch_size, max_latency_ms=ARGS.max_latency_ms
    )
    def predict(
        self, instances: Annotated[np.ndarray, Shape((-1, 30)), DType("float64")]
    ) -> list[dict[str, Any]]:
        probabilities = self.model.predict_proba(instances)
        labels = self.classes.take(probabilities.argmax(axis=1)).tolist()
        return [
            {"prediction": label, "probabilities": row}
            for label, row in zip(labels, probabilities.tolist(), strict=True)
        ]
