"""In-process ``predict_batch`` at batch sizes 1, 2, 4, ..., 1024: rows/s, us/row, plateau.

    python bench/batch_sweep.py                      # the light and heavy models
    python bench/batch_sweep.py --model my.joblib

The plateau start is the smallest size within 10 % of the best rows/s (serving.tune).
Writes bench/results/batch_sweep_<name>.png.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.models import RESULTS, model_path, real_rows  # noqa: E402
from serving.model.loaders import load_model  # noqa: E402
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
        handle = load_model(path)
        points = sweep(handle, real_rows())
        plateau = plateau_start(points)
        print(f"\n{spec} ({path.name})")
        print(f"{'batch':>6} {'ms/call':>9} {'rows/s':>12} {'us/row':>9}")
        for p in points:
            mark = "  <- plateau start" if p is plateau else ""
            ms = p.seconds_per_call * 1000
            print(f"{p.batch_size:>6} {ms:>9.3f} {p.rows_per_s:>12,.0f} {p.us_per_row:>9.1f}{mark}")
        best = max(points, key=lambda p: p.rows_per_s)
        print(
            f"batch {best.batch_size} moves {best.rows_per_s / points[0].rows_per_s:.0f}x "
            "the rows/s of one row per call"
        )
        out = RESULTS / f"batch_sweep_{spec if spec in ('light', 'heavy') else path.stem}.png"
        plot(points, out, f"{spec}: predict_batch sweep")
        print(f"plot: {out}")


if __name__ == "__main__":
    main()
