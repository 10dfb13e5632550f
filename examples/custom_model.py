"""A model with its own Python code: feature engineering before a scikit-learn classifier.

Served with the python format (README, "Your own model code"):

    python examples/custom_model.py --out models/shape_ratios     # trains, writes model.joblib
    PYTHONPATH=examples SERVING_MODEL_CLASS=custom_model:ShapeRatioModel \\
      SERVING_MODEL_DIR=models/shape_ratios gunicorn wsgi:app -c gunicorn.conf.py

Requests send the 30 raw features of scikit-learn's breast-cancer data, as for the demo.
``preprocess`` derives shape features a pickled pipeline could not carry without custom
code: for each of the ten measurements, the ratio of its worst to its mean value, and
the compactness-like ratio perimeter^2 / area (for mean and worst values), plus log1p of
the raw features. The classifier is fitted on those 42 columns.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import numpy.typing as npt
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

ARTIFACT = "model.joblib"
#: Columns of the raw features: 0-9 means, 20-29 worst values; radius, perimeter, area
#: are 0, 2, 3 within each group.
MEAN, WORST = slice(0, 10), slice(20, 30)
PERIMETER, AREA = 2, 3


def engineer(instances: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """``(n, 30)`` raw features -> ``(n, 42)``: log1p of each raw value (30), worst/mean per
    measurement (10), perimeter^2/area for the mean and the worst values (2). Float64."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = np.where(instances[:, MEAN] != 0, instances[:, WORST] / instances[:, MEAN], 0.0)
        shape = [
            np.where(
                instances[:, offset + AREA] != 0,
                instances[:, offset + PERIMETER] ** 2 / instances[:, offset + AREA],
                0.0,
            )
            for offset in (0, 20)
        ]
    logs = np.log1p(np.clip(instances, 0.0, None))
    return np.column_stack([logs, ratios, *shape])


class ShapeRatioModel:
    """The contract of ``SERVING_MODEL_CLASS``: ``load(path)``, ``preprocess``, ``predict``.

    Usage::

        model = ShapeRatioModel(); model.load(Path("models/shape_ratios"))
        model.predict(model.preprocess(X))   # {"predictions": (n,), "probabilities": (n, 2)}
    """

    #: The input schema: the raw feature names of the data set, in column order.
    feature_names = tuple(str(name) for name in load_breast_cancer().feature_names)
    classes = (0, 1)

    def __init__(self) -> None:
        self.classifier: Pipeline | None = None

    def load(self, path: Path) -> None:
        """Read ``model.joblib`` from the directory ``path`` (or ``path`` itself, a file)."""
        path = Path(path)
        self.classifier = joblib.load(path / ARTIFACT if path.is_dir() else path)

    def preprocess(self, instances: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        return engineer(instances)

    def predict(self, features: npt.NDArray[np.float64]) -> dict[str, Any]:
        assert self.classifier is not None, "load() first"
        probabilities = self.classifier.predict_proba(features)
        return {"predictions": probabilities.argmax(axis=1), "probabilities": probabilities}


def train(out: Path) -> Path:
    """Fit the classifier on the engineered features of all 569 rows; write ``out/model.joblib``."""
    X, y = load_breast_cancer(return_X_y=True)
    classifier = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
    classifier.fit(engineer(X), y)
    out.mkdir(parents=True, exist_ok=True)
    joblib.dump(classifier, out / ARTIFACT)
    return out / ARTIFACT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("models/shape_ratios"))
    print(train(parser.parse_args().out))


if __name__ == "__main__":
    main()
