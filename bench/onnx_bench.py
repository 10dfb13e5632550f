"""ONNX Runtime vs scikit-learn on the same MLP, in-process, side by side in one run.

    python bench/onnx_bench.py                          # sklearn vs ONNX on the CPU
    python bench/onnx_bench.py --providers cpu cuda --batch-sizes 1 32 256 1024

Loads ``breast_cancer_mlp`` (StandardScaler + MLPClassifier(512, 512), built on first use
by ``examples/build_demo_model.py``) through the service's own loaders: the joblib file
as the ``sklearn`` engine and the ONNX graph once per execution provider asked for. For
each batch size the engines take turns (``--rounds`` rounds of about ``--seconds`` each,
median kept), so a change in machine load hits all of them alike. Threads are pinned as
the service pins them: one BLAS thread, one ONNX Runtime intra-op thread (``--threads``).

Prints rows/s per engine and batch size and each engine's ratio to the first one, and
checks that every ONNX engine's probabilities agree with sklearn's within ``--atol``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.models import model_path, real_rows  # noqa: E402
from serving.model.loaders import load_model  # noqa: E402
from serving.model.onnx_loader import OnnxLoader  # noqa: E402


def rows_per_s(predict: Callable[[np.ndarray], Any], rows: np.ndarray, seconds: float) -> float:
    """Rows per second of back-to-back ``predict(rows)`` calls for about ``seconds``."""
    predict(rows)
    calls, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        predict(rows)
        calls += 1
    return calls * len(rows) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--providers", nargs="+", default=["cpu"], help="ONNX providers")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 32, 256])
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--atol", type=float, default=1e-4)
    args = parser.parse_args()

    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=args.threads)
    engines = {"sklearn": load_model(model_path("mlp"), threads=args.threads)}
    for spec in args.providers:
        handle = load_model(
            model_path("mlp-onnx"), threads=args.threads, loaders={"onnx": OnnxLoader(spec)}
        )
        engines[f"onnx-{spec}"] = handle
        print(f"onnx-{spec}: session on {handle.execution_provider}")

    X = real_rows()
    expected = engines["sklearn"].predict_batch(X)
    for name, handle in engines.items():
        got = handle.predict_batch(X)
        gap = float(np.abs(got["probabilities"] - expected["probabilities"]).max())
        labels = int((got["predictions"] != expected["predictions"]).sum())
        verdict = "ok" if gap <= args.atol else f"FAIL (> {args.atol:g})"
        print(f"{name}: max |p - p_sklearn| = {gap:.2e} {verdict}; {labels} labels differ")
        if gap > args.atol:
            raise SystemExit(1)

    names = list(engines)
    print(f"\nrows/s (median of {args.rounds} rounds of {args.seconds:g} s, {args.threads} thread)")
    print(f"{'batch':>6} " + " ".join(f"{n:>14}" for n in names) + "  ratio to " + names[0])
    for batch in args.batch_sizes:
        rows = np.resize(X, (batch, X.shape[1]))
        samples: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(args.rounds):
            for name in names:
                samples[name].append(rows_per_s(engines[name].predict_batch, rows, args.seconds))
        medians = {name: statistics.median(values) for name, values in samples.items()}
        ratios = " ".join(f"{medians[n] / medians[names[0]]:.2f}x" for n in names[1:])
        print(f"{batch:>6} " + " ".join(f"{medians[n]:>14,.0f}" for n in names) + f"  {ratios}")


if __name__ == "__main__":
    main()
