"""A scikit-learn style estimator (anything with ``predict``, optionally
``predict_proba`` and ``classes_``) as a ``ModelHandle``: its input schema (from the
estimator, merged with a declared one), how a batch reaches it (a DataFrame of its
training columns, or the array), its outputs (``predictions``, ``probabilities`` in the
order of ``classes``; labels from the probabilities in one pass where that is the same
answer, ``serving.model.labels``) and overflow in a pipeline step refused as invalid input.

Boundary: see README.md beside this file.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from serving.errors import InvalidInput, ModelLoadError
from serving.model.frames import frame_builder
from serving.model.handle import ModelHandle, Outputs, Predictor
from serving.model.labels import OnePass, label_rule
from serving.model.mlmodel import PyfuncOutput
from serving.model.schema import Feature, feature, merge_features
from serving.model.schema_sklearn import estimator_features, estimator_missing

__all__ = ["estimator_handle", "final_estimator"]

log = logging.getLogger(__name__)


#: scikit-learn's finiteness check (sklearn.utils.validation._assert_all_finite) on the
#: input of a pipeline step: finite request values that overflowed in an earlier step.
_OVERFLOW = re.compile(r"Input \w* ?contains (infinity|NaN|a value too large)")


def final_estimator(model: object) -> object:
    """A pipeline's last step (a nested pipeline's, in turn), or ``model`` itself."""
    steps = getattr(model, "steps", None)  # sklearn Pipeline
    return final_estimator(steps[-1][1]) if steps else model


def _per_output(classes: object) -> bool:
    """Whether ``classes_`` holds one array per output (multi-output scikit-learn
    classifiers), not one label per class."""
    return isinstance(classes, list | tuple) and any(np.ndim(c) for c in classes)


def estimator_handle(
    model: Predictor,
    *,
    name: str,
    version: str,
    format: str,
    source: Path | None = None,
    declared: tuple[Feature, ...] | None = None,
    nulls: Literal["declared", "estimator"] = "declared",
    pyfunc_output: PyfuncOutput = "predictions",
) -> ModelHandle:
    """A handle for a scikit-learn style estimator (pipelines included).

    ``n_features`` comes from ``n_features_in_`` and ``classes`` from ``classes_`` where
    the estimator has them; ``probabilities`` is produced when ``predict_proba`` exists.
    The input schema is ``declared`` (a schema file beside the model), with what the
    estimator tells (``serving.model.schema_sklearn``). A model fitted on a DataFrame
    (``feature_names_in_``) is called with a pandas DataFrame of its training column
    names, each column of its feature's type; others get the batch array.

    A classifier whose final estimator ``serving.model.labels.label_rule`` knows runs both
    ``predict`` and ``predict_proba`` on its first batch (the warm-up's sample rows, on the
    worker) and, when every label derived from the probabilities is predict's own (value and
    dtype), only ``predict_proba`` from then on; otherwise both per batch, as every other
    model, with a warning saying what differed.

    :param nulls: whether ``declared``'s features may be missing as it says, or as the
        estimator takes NaN (``serving.model.schema.merge_features``).
    :param pyfunc_output: what ``/invocations`` answers (``serving.model.mlmodel``).
    :raises ModelLoadError: when the object has no ``predict``, ``declared`` names
        features the model was not fitted on, or ``pyfunc_output`` is ``probabilities``
        for a model without ``predict_proba``.
    """
    if not callable(getattr(model, "predict", None)):
        raise ModelLoadError(source, f"the loaded {type(model).__name__} object has no predict()")
    predict_proba, classes = _probability_outputs(model, name)
    if pyfunc_output == "probabilities" and predict_proba is None:
        msg = "MLmodel's predict_fn is predict_proba, but the model answers no probabilities"
        raise ModelLoadError(source, msg)
    n_features = getattr(model, "n_features_in_", None)
    features = _estimator_features(model, n_features, declared, source, nulls)
    named = getattr(model, "feature_names_in_", None) is not None
    feature_names = tuple(f.name for f in features) if features and (named or declared) else None
    to_input = frame_builder(features) if named and features else _array_input
    label_array = np.asarray(classes) if classes is not None else None
    rule = label_rule(final_estimator(model), classes) if predict_proba is not None else None
    one_pass = OnePass(label_array, rule, name=name) if rule and label_array is not None else None
    predict_outputs = _outputs_of(model.predict, predict_proba, to_input, one_pass)
    return ModelHandle(
        name=name,
        version=version,
        format=format,
        predict_batch=_refusing_overflow(predict_outputs),
        source=source,
        n_features=int(n_features) if n_features is not None else None,
        classes=tuple(label_array.tolist()) if label_array is not None else None,
        feature_names=feature_names,
        features=features,
        output_names=("predictions",) + (("probabilities",) if predict_proba is not None else ()),
        pyfunc_output=pyfunc_output,
        estimator=model,
    )


def _probability_outputs(model: Predictor, name: str) -> tuple[Any, Any]:
    """``(predict_proba, classes_)`` of ``model``, each None where it has none; both None for
    a multi-output classifier, answered without probabilities."""
    # absent (AttributeError) on pipelines ending in a regressor
    predict_proba = getattr(model, "predict_proba", None)
    classes = getattr(model, "classes_", None)
    if _per_output(classes):
        # A multi-output classifier: classes_ and predict_proba's arrays per output, not
        # per instance (merged into one array they gave each instance another's rows).
        log.info("model %r: multi-output classifier, answered without probabilities", name)
        return None, None
    return predict_proba, classes


def _estimator_features(
    model: Predictor,
    n_features: Any,
    declared: tuple[Feature, ...] | None,
    source: Path | None,
    nulls: Literal["declared", "estimator"],
) -> tuple[Feature, ...] | None:
    """The input schema: ``declared`` merged with what the estimator tells (its columns, or
    ``n_features`` float64 features named by position).

    :raises ModelLoadError: when ``declared`` names features the model was not fitted on,
        or the model's own categories cannot be read.
    """
    try:
        inferred = estimator_features(model)
        if inferred is None and n_features is not None:
            missing = estimator_missing(model)
            inferred = tuple(feature(str(j), "float", np.float64, missing=missing)
                             for j in range(int(n_features)))  # fmt: skip
        return merge_features(declared, inferred, nulls)
    except ValueError as exc:
        raise ModelLoadError(source, str(exc)) from None


def _outputs_of(
    predict: Any, predict_proba: Any, to_input: Any, one_pass: OnePass | None
) -> Callable[[npt.NDArray[Any]], Outputs]:
    """``batch -> {"predictions", "probabilities"?}``: ``predict`` and ``predict_proba`` on
    the model's input built from the batch, or only ``predict_proba`` once ``one_pass``
    holds (labels derived from the probabilities, ties asked of ``predict``)."""

    def predict_outputs(batch: npt.NDArray[Any]) -> Outputs:
        rows = to_input(batch)
        if one_pass is not None and one_pass.holds:
            assert predict_proba is not None
            probabilities = np.asarray(predict_proba(rows))
            labels = one_pass.labels(
                probabilities, lambda tied: np.asarray(predict(to_input(batch[tied])))
            )
            return {"predictions": labels, "probabilities": probabilities}
        outputs = {"predictions": np.asarray(predict(rows))}
        if predict_proba is not None:
            outputs["probabilities"] = np.asarray(predict_proba(rows))
        if one_pass is not None and one_pass.holds is None:  # the first batch that ran:
            # the warm-up's, or a request's where the warm-up on invented rows raised
            one_pass.check(outputs["predictions"], outputs["probabilities"])
        return outputs

    return predict_outputs


def _refusing_overflow(
    predict_outputs: Callable[[npt.NDArray[Any]], Outputs],
) -> Callable[[npt.NDArray[Any]], Outputs]:
    """``predict_outputs`` with values too large for the model's arithmetic refused as
    ``InvalidInput`` (a 4xx: the caller's values, not a broken model).

    scikit-learn's own finiteness check stays on: finite input can still overflow inside
    a pipeline (1e308 through a StandardScaler), and its error beats NaN probabilities.
    """

    def predict_batch(rows: npt.NDArray[Any]) -> Outputs:
        try:
            # Overflow is reported by the finiteness check of the next step (below), not
            # as a RuntimeWarning per batch on stderr.
            with np.errstate(over="ignore", invalid="ignore"):
                return predict_outputs(rows)
        except ValueError as exc:
            if _OVERFLOW.search(str(exc)):
                raise InvalidInput(
                    f"the model cannot compute with these values: {exc} (finite, but too "
                    "large for the model's arithmetic)",
                    [{"loc": "instances", "msg": str(exc), "type": "model_overflow"}],
                ) from exc
            raise

    return predict_batch


def _array_input(batch: npt.NDArray[Any]) -> Any:
    """A record batch as a 2-D object array for a model fitted on an array; a matrix as is."""
    if batch.dtype.names is None:
        return batch
    return np.stack([batch[name].astype(object) for name in batch.dtype.names], axis=1)
