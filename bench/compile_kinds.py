"""Which model kinds compile, and what compiling buys: in-process, both engines, per kind.

    python bench/compile_kinds.py [--kinds light heavy gbc ct hgb big]

For each kind (issue 33's list: the light pipeline, the heavy forest, a gradient-boosted
pipeline, a ColumnTransformer with string columns feeding a forest, HistGradientBoosting
with native categories, and the deep ``big`` forest of ``bench/share_memory.py``): load it
as the server does, compile it with ``SERVING_COMPILE=on`` (``serving.loading.compiled``,
parity gate included), and print whether it compiled or why not, its tree nodes, the
compile time, the RSS the session added to this process (ONNX Runtime's own copy, what
each worker pays; the libraries' import is counted once, first), and the median µs per
``predict_batch`` call at batch 1, 8 and 32 for the library and the compiled model,
calls taking turns. The CPU model first; a JSON of
the rows to ``bench/results/compile_kinds.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import joblib
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.host import cpu_model  # noqa: E402
from bench.models import RESULTS, big_rows, model_path, real_rows  # noqa: E402
from serving.loading import compiled, load_model  # noqa: E402
from serving.model.compiled import tree_nodes  # noqa: E402
from serving.model_settings import ModelSettings  # noqa: E402

SIZES = (1, 8, 32)


def rss_mib() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 2**20


def build(kind: str, folder: Path) -> tuple[Path, Any]:
    """The kind's model file and rows to time it on (a matrix, or a DataFrame)."""
    if kind in ("light", "heavy", "big"):
        rows = big_rows(2000) if kind == "big" else real_rows()
        return model_path(kind), rows
    import pandas as pd
    from sklearn.compose import make_column_transformer
    from sklearn.datasets import load_breast_cancer
    from sklearn.ensemble import (
        GradientBoostingClassifier,
        HistGradientBoostingClassifier,
        RandomForestClassifier,
    )
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({
        "plan": rng.choice(["basic", "pro", "team", "edu"], 2000),
        "region": rng.choice(["emea", "apac", "amer"], 2000),
        "seats": rng.integers(1, 200, 2000).astype(float),
        "usage": rng.gamma(2.0, 10.0, 2000),
    })  # fmt: skip
    target = ((frame.usage > 20) ^ (frame.plan == "pro")).astype(int)
    if kind == "gbc":
        X, y = load_breast_cancer(return_X_y=True)
        model: Any = make_pipeline(StandardScaler(), GradientBoostingClassifier(random_state=0))
        model.fit(X, y)
        rows: Any = X
    elif kind == "ct":
        model = make_pipeline(
            make_column_transformer(
                (OneHotEncoder(handle_unknown="ignore"), ["plan", "region"]),
                (StandardScaler(), ["seats", "usage"]),
            ),
            RandomForestClassifier(n_estimators=100, random_state=0),
        ).fit(frame, target)
        rows = frame
    elif kind == "hgb":
        categorical = frame.astype({"plan": "category", "region": "category"})
        model = HistGradientBoostingClassifier(categorical_features="from_dtype", random_state=0)
        model.fit(categorical, target)
        rows = categorical
    else:
        raise ValueError(f"unknown kind {kind!r}")
    path = folder / f"{kind}.joblib"
    joblib.dump(model, path)
    return path, rows


def typed(handle: Any, rows: Any) -> Any:
    """``rows`` as the batch the batcher merges for ``handle``."""
    if not hasattr(rows, "columns"):
        return np.asarray(rows, dtype=handle.matrix_dtype or np.float64)
    batch = np.zeros(len(rows), dtype=handle.batch_dtype)
    for name in rows.columns:
        batch[name] = rows[name].astype(object if batch[name].dtype == object else float)
    return batch


def timings(engines: dict[str, Any], batch: Any, rounds: int = 7) -> dict[str, dict[int, float]]:
    """Median µs per call per engine and size, the engines taking turns each round."""
    samples: dict[str, dict[int, list[float]]] = {e: {n: [] for n in SIZES} for e in engines}
    for _ in range(rounds):
        for size in SIZES:
            rows = batch[:size]
            for engine, handle in engines.items():
                handle.predict_batch(rows)  # warm
                calls, started = 0, time.perf_counter()
                while calls < 3 or time.perf_counter() - started < 0.05:
                    handle.predict_batch(rows)
                    calls += 1
                samples[engine][size].append((time.perf_counter() - started) / calls * 1e6)
    return {e: {n: statistics.median(v) for n, v in by.items()} for e, by in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", default=["light", "heavy", "gbc", "ct", "hgb", "big"])
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="  log: %(message)s")
    print(f"CPU: {cpu_model()}")
    before = rss_mib()
    import onnxruntime  # noqa: F401
    import skl2onnx  # noqa: F401

    print(f"importing onnxruntime and skl2onnx: +{rss_mib() - before:.0f} MiB RSS (once a worker)")
    folder = Path(tempfile.mkdtemp())
    results = []
    for kind in args.kinds:
        path, rows = build(kind, folder)
        handle = load_model(path)
        batch = typed(handle, rows)
        gc.collect()
        before, started = rss_mib(), time.perf_counter()
        settings = ModelSettings(name=kind, version="1", format=handle.format, compile="on")
        fast = compiled(handle, settings)
        seconds = time.perf_counter() - started
        gc.collect()
        added = rss_mib() - before
        row: dict[str, Any] = {
            "kind": kind, "nodes": tree_nodes(handle.estimator), "engine": fast.engine,
            "compile_s": round(seconds, 2), "session_rss_mib": round(added, 1),
        }  # fmt: skip
        engines = {"library": handle} | ({"compiled": fast} if fast.engine != handle.engine else {})
        row["us_per_call"] = timings(engines, batch)
        results.append(row)
        print(f"\n{kind} ({path.name}): {fast.engine}, {row['nodes']:,} tree nodes, "
              f"compile {seconds:.2f} s, +{added:.0f} MiB RSS")  # fmt: skip
        for size in SIZES:
            lib = row["us_per_call"]["library"][size]
            line = f"  batch {size:>3}: library {lib:>9,.1f} us"
            if "compiled" in row["us_per_call"]:
                mine = row["us_per_call"]["compiled"][size]
                line += f"   compiled {mine:>8,.1f} us   {lib / mine:>7.1f}x"
            print(line)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "compile_kinds.json").write_text(json.dumps({"cpu": cpu_model(), "runs": results}))


if __name__ == "__main__":
    main()
