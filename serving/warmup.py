"""A loaded model's first calls: on its own examples where it has them, else on rows the
server makes up.

``warm_up(handle, sizes, what)`` runs batches of 1 and ``max_batch_size`` instances (the
shapes a GPU provider selects kernels for first) and returns the model's output specs.
The rows come from, in order:

1. the model's own examples (``ModelHandle.examples``: a custom class's
   ``warmup_instances``, else the input example MLflow saved with it), when its features
   are known, checked against its schema like a request's instances
   (``serving.inputs.conform``) and repeated to each size. A failure on them is the
   model's own: fatal (``ModelLoadError``), as a request with those rows would fail.
2. else invented rows (``ModelHandle.sample``: zeros, false, ``""`` or a known category).
   A value the server made up may be one the model was never fitted on (an
   ``OrdinalEncoder`` over a string column declared without categories refuses ``""``):
   a failure is one WARNING naming the model and the error, and the model serves; its
   outputs are those it names (``ModelHandle.declared_outputs``).

Boundary: no Flask, werkzeug, gunicorn or prometheus-client; of ``serving``, the model,
the instance checks and the errors.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from serving.errors import ModelLoadError
from serving.inputs.conform import conform
from serving.inputs.instances import Frame, Records
from serving.model.handle import ModelHandle, TensorSpec

__all__ = ["warm_up"]

log = logging.getLogger(__name__)


def warm_up(handle: ModelHandle, sizes: Sequence[int], what: str) -> tuple[TensorSpec, ...]:
    """Run ``handle``'s model on batches of each of ``sizes`` instances; its output specs.

    :param what: the model as errors name it (``class pkg.mod:Cls``, ``joblib model 'x'``).
    :raises ModelLoadError: when its own examples do not fit its schema or it raises on
        them, naming ``what``, the cause and where the examples come from; the traceback
        is logged.
    """
    if handle.examples is not None and handle.features is not None:
        return _on_examples(handle, handle.examples, sizes, what)
    try:
        handle.warmup(*sizes)
        return handle.output_specs()
    except Exception as exc:
        log.warning(
            "model %r: warm-up on invented rows (zeros, false, \"\" or a known category) "
            "failed: %s raised %s: %s; serving anyway (give the model its own examples, "
            "warmup_instances or MLflow's input_example, to warm it up)",
            handle.name, what, type(exc).__name__, _one_line(exc),
        )  # fmt: skip
        return handle.declared_outputs()


def _on_examples(
    handle: ModelHandle, examples: tuple[Any, ...], sizes: Sequence[int], what: str
) -> tuple[TensorSpec, ...]:
    try:
        if all(isinstance(e, Mapping) for e in examples):
            batch = conform(Records(examples, field=handle.examples_from), handle)
        else:
            batch = conform(Frame(examples, field=handle.examples_from), handle)
    except Exception as exc:
        raise ModelLoadError(
            handle.source, f"warm-up failed: the own examples of {what} "
            f"({handle.examples_from}) do not fit its input schema: {exc}",
        ) from exc  # fmt: skip
    try:
        for size in sorted(set(sizes)):
            handle.predict_batch(_repeated(batch, size))
        return handle.output_specs(batch[:1])
    except Exception as exc:
        log.error("warm-up of %s on its own examples failed", what, exc_info=True)
        raise ModelLoadError(
            handle.source, f"warm-up failed: {what} raised {type(exc).__name__}: "
            f"{_one_line(exc)}, called on its own examples ({handle.examples_from})",
        ) from exc  # fmt: skip


def _repeated(batch: npt.NDArray[Any], size: int) -> npt.NDArray[Any]:
    """``size`` instances: ``batch``'s, repeated in order (or the first ``size``)."""
    index = np.arange(size) % len(batch)
    return batch[index]


def _one_line(exc: BaseException) -> str:
    """``exc``'s message on one line (a message with a newline would forge log lines)."""
    return " ".join(str(exc).split())
