"""docs/models.md's examples run: the MLP demo builds, and its ONNX graph serves like its joblib."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from serving.model.loaders import load_model

ROOT = Path(__file__).resolve().parent.parent


def test_mlp_demo_builds_and_onnx_matches_the_pipeline_on_every_row(
    tmp_path: Path, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    X, y = breast_cancer
    command = [sys.executable, "examples/build_demo_model.py", "--model", "mlp"]
    subprocess.run([*command, "--out-dir", str(tmp_path)], cwd=ROOT, check=True, timeout=120)

    pipeline = load_model(tmp_path / "breast_cancer_mlp.joblib").predict_batch(X)
    graph = load_model(tmp_path / "breast_cancer_mlp.onnx")
    onnx = graph.predict_batch(X)

    assert (graph.n_features, graph.classes, np.dtype(graph.input_dtype)) == (30, (0, 1), "f4")
    assert float((pipeline["predictions"] == y).mean()) > 0.95
    np.testing.assert_array_equal(onnx["predictions"], pipeline["predictions"])
    np.testing.assert_allclose(onnx["probabilities"], pipeline["probabilities"], atol=1e-5)
