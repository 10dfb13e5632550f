"""Rebuild the bundled demo model: StandardScaler + LogisticRegression on breast-cancer data.

Trains on a stratified 80 % of scikit-learn's built-in breast-cancer data set (569 rows,
30 features, classes 0 = malignant, 1 = benign; no download), prints the held-out
accuracy, and writes ``breast_cancer.joblib`` and ``breast_cancer.onnx`` (skl2onnx,
ZipMap off, class labels in the ``classes`` metadata entry).

    python examples/build_demo_model.py                 # rewrites serving/demo/
    python examples/build_demo_model.py --out-dir /tmp/m

The joblib file is a pickle: it loads without warnings only under the scikit-learn
version that wrote it, which is why ``setup.cfg`` pins scikit-learn. Rebuild after
changing that pin.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import joblib
import numpy as np
from skl2onnx import to_onnx
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

DEMO_DIR = Path(__file__).resolve().parent.parent / "serving" / "demo"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=DEMO_DIR)
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)

    X, y = load_breast_cancer(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=0.2, stratify=y, random_state=0
    )
    model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
    model.fit(X_train, y_train)
    print(f"held-out accuracy: {model.score(X_test, y_test):.4f} on {len(y_test)} rows")
    print(f"accuracy on all {len(y)} rows: {model.score(X, y):.4f}")

    joblib.dump(model, args.out_dir / "breast_cancer.joblib")
    onnx_model = to_onnx(
        model,
        X_train[:1].astype(np.float32),
        options={id(model): {"zipmap": False}},
        target_opset=17,
    )
    entry = onnx_model.metadata_props.add()
    entry.key, entry.value = "classes", json.dumps(model.classes_.tolist())
    (args.out_dir / "breast_cancer.onnx").write_bytes(onnx_model.SerializeToString())
    print(f"wrote breast_cancer.joblib and breast_cancer.onnx to {args.out_dir}")


if __name__ == "__main__":
    main()
