"""In-process ``predict_batch`` at batch sizes 1, 2, 4, ..., 1024: rows/s, us/row, plateau;
for a model that compiles (``SERVING_COMPILE=on``), both engines and their ratio.

    python bench/batch_sweep.py                      # the light and heavy models
    python bench/batch_sweep.py --model my.joblib

The plateau start is the smallest size within 10 % of the best rows/s (serving.tune).
Writes bench/results/batch_sweep_<name>_<engine>.png.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.models import RESULTS, model_path, real_rows  # noqa: E402
from serving.loading import compiled  # noqa: E402
from serving.model.loaders import load_model  # noqa: E402
from serving.model_settings import ModelSettings  # noqa: E402
from serving.tune import plateau_start, plot, sweep  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", nargs="+", default=["light", "heavy"], help="light, heavy, or paths of artifacts"
    )
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    for spec in args.model:
        path = model_path(spec) if spec in ("light", "heavy") else Path(spec)
        library = load_model(path)
        settings = ModelSettings(name=library.name, version="1", format=library.format,
                                 compile="on")  # fmt: skip
        fast = compiled(library, settings)
        engines = {library.engine: library} | (
            {"onnxruntime (compiled)": fast} if fast.engine != library.engine else {}
        )  # fmt: skip
        sweeps = {engine: sweep(handle, real_rows()) for engine, handle in engines.items()}
        for engine, points in sweeps.items():
            plateau = plateau_start(points)
            print(f"\n{spec} ({path.name}), {engine}")
            print(f"{'batch':>6} {'ms/call':>9} {'rows/s':>12} {'us/row':>9}")
            for p in points:
                mark = "  <- plateau start" if p is plateau else ""
                ms = p.seconds_per_call * 1000
                print(f"{p.batch_size:>6} {ms:>9.3f} {p.rows_per_s:>12,.0f} "
                      f"{p.us_per_row:>9.1f}{mark}")  # fmt: skip
            best = max(points, key=lambda p: p.rows_per_s)
            print(
                f"batch {best.batch_size} moves {best.rows_per_s / points[0].rows_per_s:.0f}x "
                "the rows/s of one row per call"
            )
            name = spec if spec in ("light", "heavy") else path.stem
            out = RESULTS / f"batch_sweep_{name}_{engine.split()[0]}.png"
            try:
                plot(points, out, f"{spec}, {engine}: predict_batch sweep")
                print(f"plot: {out}")
            except ImportError:
                print("no plot: matplotlib is not installed (pip install -e '.[bench]')")
        if len(sweeps) == 2:
            mine, theirs = sweeps["onnxruntime (compiled)"], sweeps[library.engine]
            ratios = "  ".join(
                f"{a.batch_size}: {b.seconds_per_call / a.seconds_per_call:,.1f}x"
                for a, b in zip(mine, theirs, strict=True)
            )
            print(f"compiled vs {library.engine}, calls per second at each batch: {ratios}")


if __name__ == "__main__":
    main()
