"""The two benchmark models, built once into ``bench/results/models/`` (seeded, no download).

- ``light``: the bundled demo (StandardScaler + LogisticRegression), about 0.3 ms per
  predict call at any batch size up to a few hundred.
- ``heavy``: StandardScaler + RandomForestClassifier(300 trees, n_jobs=1), about 17 ms per
  call whatever the batch size: the case where batching pays most.
- ``mlp``: StandardScaler + MLPClassifier(512, 512) from ``examples/build_demo_model.py``,
  as joblib (``mlp``) and ONNX (``mlp-onnx``): the ONNX and GPU path.
- ``big``: RandomForestClassifier(300 trees, unlimited depth) on ``BIG_ROWS`` synthetic
  rows of 20 features (20 % of labels flipped, so the trees grow deep): a file of well over
  100 MB, the model whose memory per worker matters (``bench/share_memory.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import joblib
import numpy as np
from sklearn.datasets import load_breast_cancer

from serving.settings import DEMO_MODEL_PATH

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = RESULTS / "models"


def model_path(name: str) -> Path:
    """Path of the ``light`` or ``heavy`` model, building ``heavy`` on first use."""
    if name == "light":
        return DEMO_MODEL_PATH
    if name in ("mlp", "mlp-onnx"):
        path = MODELS / "breast_cancer_mlp.joblib"
        if not path.exists():
            script = Path(__file__).resolve().parent.parent / "examples" / "build_demo_model.py"
            command = [sys.executable, str(script), "--model", "mlp", "--out-dir", str(MODELS)]
            subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        return path.with_suffix(".onnx") if name == "mlp-onnx" else path
    if name == "big":
        return _big_forest()
    if name != "heavy":
        raise ValueError(f"unknown model {name!r}: light, heavy, big, mlp or mlp-onnx")
    path = MODELS / "heavy_forest.joblib"
    if not path.exists():
        from sklearn.ensemble import RandomForestClassifier
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        X, y = load_breast_cancer(return_X_y=True)
        forest = RandomForestClassifier(n_estimators=300, n_jobs=1, random_state=0)
        MODELS.mkdir(parents=True, exist_ok=True)
        joblib.dump(make_pipeline(StandardScaler(), forest).fit(X, y), path)
    return path


#: Training rows of the ``big`` forest.
BIG_ROWS = 20_000


def big_rows(n: int = BIG_ROWS) -> np.ndarray:
    """The ``big`` forest's training rows, (n, 20) float64 (seeded)."""
    from sklearn.datasets import make_classification

    X, _ = make_classification(n_samples=n, n_features=20, n_informative=10, flip_y=0.2,
                               random_state=0)  # fmt: skip
    rows: np.ndarray = X
    return rows


def _big_forest() -> Path:
    path = MODELS / "big_forest.joblib"
    if not path.exists():
        from sklearn.datasets import make_classification
        from sklearn.ensemble import RandomForestClassifier

        X, y = make_classification(n_samples=BIG_ROWS, n_features=20, n_informative=10,
                                   flip_y=0.2, random_state=0)  # fmt: skip
        forest = RandomForestClassifier(n_estimators=300, n_jobs=1, random_state=0).fit(X, y)
        MODELS.mkdir(parents=True, exist_ok=True)
        joblib.dump(forest, path)
    return path


def real_rows() -> np.ndarray:
    """The 569 breast-cancer rows, (569, 30) float64."""
    rows: np.ndarray = load_breast_cancer().data
    return rows


def write_bodies(path: Path) -> Path:
    """One single-instance ``/predict`` body per line, one per real row (for wrk's Lua)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"instances": [row.tolist()]}) for row in real_rows()]
    path.write_text("\n".join(lines) + "\n")
    return path


def batch_totals(scrape: str) -> tuple[float, float]:
    """(predict calls, instances) in a /metrics scrape, summed over model/version labels."""
    totals = {"inference_batch_size_count": 0.0, "inference_batch_size_sum": 0.0}
    for line in scrape.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals["inference_batch_size_count"], totals["inference_batch_size_sum"]
