"""Build the demo models on scikit-learn's breast-cancer data: the bundled logistic
regression, or a larger MLP classifier for the ONNX/GPU path.

Trains on a stratified 80 % of scikit-learn's built-in breast-cancer data set (569 rows,
30 features, classes 0 = malignant, 1 = benign; no download), prints the held-out
accuracy, and writes ``<name>.joblib`` and ``<name>.onnx`` (skl2onnx, float32 input with
a dynamic batch axis, ZipMap off, class labels in the ``classes`` metadata entry).

    python examples/build_demo_model.py                       # rewrites serving/demo/
    python examples/build_demo_model.py --model mlp           # writes models/breast_cancer_mlp.*
    python examples/build_demo_model.py --out-dir /tmp/m

``logistic`` is StandardScaler + LogisticRegression (``breast_cancer``, bundled); ``mlp``
is StandardScaler + MLPClassifier with two hidden layers of 512 (``breast_cancer_mlp``,
about 280k weights: a model worth a GPU, or at least worth batching).

The joblib file is a pickle: it loads without warnings only under the scikit-learn
version that wrote it, which is why ``setup.cfg`` pins scikit-learn. Rebuild after
changing that pin.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import joblib
from skl2onnx import to_onnx
from skl2onnx.common.data_types import FloatTensorType
from sklearn.datasets import load_breast_cancer
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

ROOT = Path(__file__).resolve().parent.parent
DEMO_DIR = ROOT / "serving" / "demo"


def build(kind: str) -> tuple[str, Pipeline]:
    """The model's file stem and its unfitted pipeline."""
    if kind == "mlp":
        mlp = MLPClassifier(
            hidden_layer_sizes=(512, 512), max_iter=300, early_stopping=True, random_state=0
        )
        return "breast_cancer_mlp", make_pipeline(StandardScaler(), mlp)
    return "breast_cancer", make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))


def export_onnx(model: Pipeline, n_features: int, path: Path) -> None:
    """Write ``model`` as an ONNX graph with input ``X`` of shape ``(batch, n_features)``."""
    onnx_model = to_onnx(
        model,
        initial_types=[("X", FloatTensorType([None, n_features]))],
        options={id(model): {"zipmap": False}},
        target_opset=17,
    )
    entry = onnx_model.metadata_props.add()
    entry.key, entry.value = "classes", json.dumps(model.classes_.tolist())
    path.write_bytes(onnx_model.SerializeToString())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("logistic", "mlp"), default="logistic")
    parser.add_argument(
        "--out-dir", type=Path, help="default: serving/demo (logistic), models (mlp)"
    )
    args = parser.parse_args()
    out_dir = args.out_dir or (DEMO_DIR if args.model == "logistic" else Path("models"))
    out_dir.mkdir(parents=True, exist_ok=True)

    X, y = load_breast_cancer(return_X_y=True)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=0.2, stratify=y, random_state=0
    )
    name, model = build(args.model)
    model.fit(X_train, y_train)
    print(f"{name}: held-out accuracy {model.score(X_test, y_test):.4f} on {len(y_test)} rows")
    print(f"{name}: accuracy on all {len(y)} rows {model.score(X, y):.4f}")

    joblib.dump(model, out_dir / f"{name}.joblib")
    export_onnx(model, X.shape[1], out_dir / f"{name}.onnx")
    print(f"wrote {name}.joblib and {name}.onnx to {out_dir}")


if __name__ == "__main__":
    main()
