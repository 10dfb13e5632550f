"""A classifier's labels from its probabilities: one ``predict_proba`` call per batch where
the estimator's ``predict`` is the argmax of it, instead of ``predict`` and ``predict_proba``
(each a full pass over the model: a 300-tree forest walks every tree once instead of twice).

Which estimators qualify is read from their source (scikit-learn 1.9.1, SciPy 1.17.1 as
installed; XGBoost's and LightGBM's ``sklearn.py`` as published, neither installed here; the
reasons are beside each set below), recognised by the package and name of the final
estimator's class, never imported. Whatever the sets say, a handle checks on its first
batch (the warm-up's sample rows, on the worker) that labels derived so are predict's own,
value and dtype, and keeps two passes, logging why, if any row differs (``OnePass``).

Boundary: the standard library and numpy only (see README.md beside this file).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

__all__ = ["ARGMAX_CLASSIFIERS", "SCORE_ARGMAX_CLASSIFIERS", "OnePass", "Rule", "label_rule"]

log = logging.getLogger(__name__)

#: ``predict`` is ``classes_[argmax(predict_proba)]``, ties included (first class wins):
#: trees and forests take the argmax of the very array predict_proba returns; MLPClassifier
#: too (multi-class: ``LabelBinarizer`` takes ``argmax`` of the softmax; binary: ``p > 0.5``,
#: which is argmax of ``[1 - p, p]``, ``1 - p`` exact for p >= 0.5); LGBMClassifier's predict
#: is ``argmax(predict_proba)``. KNeighborsClassifier only with ``weights="uniform"``: predict
#: is either ``classes_[argmax(predict_proba)]`` (brute force, ``ArgKminClassMode``) or
#: ``scipy.stats.mode`` of the neighbours' encoded labels, which sorts them and takes the first
#: largest run (``_stats_py.mode``: the smallest index among ties, as argmax), while
#: predict_proba divides the same integer counts by the same total.
ARGMAX_CLASSIFIERS = frozenset(
    {
        "sklearn.DecisionTreeClassifier",
        "sklearn.ExtraTreeClassifier",
        "sklearn.ExtraTreesClassifier",
        "sklearn.KNeighborsClassifier",
        "sklearn.MLPClassifier",
        "sklearn.RandomForestClassifier",
        "lightgbm.LGBMClassifier",
    }
)

#: ``predict`` is the argmax of a score that ``predict_proba`` maps monotonically, row by
#: row: softmax (LogisticRegression, LinearDiscriminantAnalysis, gradient boosting
#: multi-class), ``exp(jll - logsumexp(jll))`` (naive Bayes, QuadraticDiscriminantAnalysis),
#: ``[1 - expit(s), expit(s)]`` for two classes. Rounding can make the top two probabilities
#: equal where the scores were not, and the binary rules differ on ties (GradientBoosting:
#: ``raw >= 0`` is the second class, argmax of ``[0.5, 0.5]`` the first; LogisticRegression,
#: LDA and HistGradientBoosting: ``s > 0``, with ``expit(1e-20) == 0.5``). Rows whose top
#: probabilities are (nearly, ``_TIE_RTOL``) tied ask ``predict``, on those rows only.
#: KNeighborsClassifier with distance weights is here too: predict's ``weighted_mode`` sums
#: the weights with ``np.sum`` (pairwise from 8 neighbours), predict_proba in neighbour order.
#: XGBClassifier: argmax of the softprob output, ``p > 0.5`` for binary, and argmax of the
#: margins for ``multi:softmax``, whose predict_proba is their softmax.
SCORE_ARGMAX_CLASSIFIERS = frozenset(
    {
        "sklearn.BernoulliNB",
        "sklearn.CategoricalNB",
        "sklearn.ComplementNB",
        "sklearn.GaussianNB",
        "sklearn.GradientBoostingClassifier",
        "sklearn.HistGradientBoostingClassifier",
        "sklearn.LinearDiscriminantAnalysis",
        "sklearn.LogisticRegression",
        "sklearn.MultinomialNB",
        "sklearn.QuadraticDiscriminantAnalysis",
        "xgboost.XGBClassifier",
    }
)

#: ``argmax``: labels are ``classes.take(argmax)``; ``untied``: the same except rows whose
#: top probabilities are tied, which ask ``predict``.
Rule = Literal["argmax", "untied"]

#: Relative gap, in units of the probabilities' machine epsilon, under which the top two
#: count as tied: summing k weights in another order moves a sum by at most about k eps.
_TIE_EPS = 1024


def label_rule(estimator: object, classes: object) -> Rule | None:
    """How ``estimator`` (the final step of a pipeline) may derive its labels from its
    probabilities, or None (two passes): an estimator in neither set, or one whose
    ``classes`` is not one 1-D array (multi-output estimators keep a list of arrays)."""
    if not isinstance(classes, np.ndarray) or classes.ndim != 1:
        return None
    kind = type(estimator)
    key = f"{kind.__module__.partition('.')[0]}.{kind.__name__}"
    if key == "sklearn.KNeighborsClassifier" and getattr(estimator, "weights", None) != "uniform":
        return "untied"
    if key in ARGMAX_CLASSIFIERS:
        return "argmax"
    return "untied" if key in SCORE_ARGMAX_CLASSIFIERS else None


class OnePass:
    """Labels from probabilities for one classifier, once its first batch has shown that they
    are ``predict``'s own.

    :param classes: ``classes_``, 1-D, in the column order of the probabilities.
    :param rule: from ``label_rule``.
    :param name: the model's name, for the log line.

    Usage::

        one_pass = OnePass(model.classes_, "argmax", name="churn")
        one_pass.check(model.predict(rows), model.predict_proba(rows))   # first batch
        if one_pass.holds: labels = one_pass.labels(model.predict_proba(rows), ask)
    """

    def __init__(self, classes: npt.NDArray[Any], rule: Rule, *, name: str) -> None:
        self.classes = classes
        self.rule = rule
        self.name = name
        #: None until ``check`` ran, then whether labels may come from the probabilities.
        self.holds: bool | None = None

    def labels(
        self,
        probabilities: npt.NDArray[Any],
        predict_rows: Callable[[npt.NDArray[np.bool_]], Any],
    ) -> npt.NDArray[Any]:
        """``(n_instances,)`` labels of ``classes``' dtype from ``(n_instances, n_classes)``
        probabilities; rows with a NaN among them and, under ``untied``, rows whose top
        two are tied get ``predict_rows(mask)`` (predict on the rows where ``mask`` is
        true). A NaN's argmax is its own column, and a score overflowing to infinity makes
        every probability of its row NaN (``inf - inf`` in a softmax): predict, the argmax
        of the scores, names the infinite one's class (found by the attack on this branch:
        LogisticRegression answered its first class where predict said the third)."""
        labels: npt.NDArray[Any] = self.classes.take(probabilities.argmax(axis=1))
        ask = np.isnan(probabilities).any(axis=1)
        if self.rule == "untied":
            top = probabilities.max(axis=1, keepdims=True)
            rtol = _TIE_EPS * np.finfo(probabilities.dtype).eps
            ask |= np.count_nonzero(probabilities >= top - rtol * np.abs(top), axis=1) > 1
        if ask.any():
            labels[ask] = predict_rows(ask)
        return labels

    def check(self, predictions: npt.NDArray[Any], probabilities: npt.NDArray[Any]) -> bool:
        """Set and return ``holds``: whether ``labels`` gives ``predictions`` (shape, dtype,
        every value) from ``probabilities``, both computed on the same rows. Logs the
        outcome: info when it holds, a warning saying what differed when not."""
        problem = self._difference(predictions, probabilities)
        self.holds = problem is None
        if problem is None:
            log.info(
                "model %r: labels from predict_proba (one call per batch; checked against "
                "predict on %d sample rows)", self.name, len(predictions),
            )  # fmt: skip
        else:
            log.warning(
                "model %r: predict and predict_proba both run per batch: %s", self.name, problem
            )
        return self.holds

    def _difference(self, predictions: npt.NDArray[Any], probs: npt.NDArray[Any]) -> str | None:
        n, width = len(predictions), len(self.classes)
        if predictions.shape != (n,) or probs.shape != (n, width):
            return (
                f"predict gave shape {predictions.shape} and predict_proba {probs.shape} "
                f"for {n} rows of {width} classes"
            )
        if predictions.dtype != self.classes.dtype:
            return f"predict gave {predictions.dtype} labels, classes_ is {self.classes.dtype}"
        derived = self.labels(probs, lambda tied: predictions[tied])
        differ = np.flatnonzero(derived != predictions)
        if len(differ):
            j = differ[0]
            return (
                f"{len(differ)} of {n} sample rows differ from argmax(predict_proba) "
                f"(row {j}: predict {predictions[j]!r}, argmax {derived[j]!r})"
            )
        return None
