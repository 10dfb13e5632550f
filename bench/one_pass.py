"""In-process ``predict_batch`` of a GradientBoostingClassifier pipeline on a DataFrame: labels
from ``predict_proba`` alone (one pass, ``serving.model.labels``) against ``predict`` and
``predict_proba`` (two passes, as before), at batch sizes 1, 8 and 32.

    python bench/one_pass.py                 # 7 rounds taking turns, 200 calls per point

The two-pass handle serves a subclass defined here, which ``label_rule`` does not know:
the same model, answered as every unlisted classifier is. Prints µs per batch, median
(min-max) over the rounds, wall clock and this process's CPU time (steadier on a shared
host), and the CPU model.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sklearn.compose import ColumnTransformer  # noqa: E402
from sklearn.ensemble import GradientBoostingClassifier  # noqa: E402
from sklearn.impute import SimpleImputer  # noqa: E402
from sklearn.pipeline import Pipeline  # noqa: E402
from sklearn.preprocessing import OneHotEncoder  # noqa: E402

from bench.host import cpu_model  # noqa: E402
from serving.model.handle import ModelHandle  # noqa: E402
from serving.model.loaders import estimator_handle  # noqa: E402
from tests.tabular import churn_module  # noqa: E402


class UnlistedGradientBoosting(GradientBoostingClassifier):  # type: ignore[misc]
    """The same estimator under a name ``label_rule`` does not know: two passes."""


def pipeline(final: GradientBoostingClassifier) -> Any:
    frame, target = churn_module().churn_frame(2000, seed=0)
    columns = ColumnTransformer(
        [("strings", OneHotEncoder(handle_unknown="ignore"), ["plan", "region"]),
         ("numbers", SimpleImputer(), ["seats", "usage_hours"])]
    )  # fmt: skip
    labels = np.array(["stays", "churns"], dtype=object)[target]
    return Pipeline([("columns", columns), ("gbc", final)]).fit(frame, labels), frame


def batch_of(handle: ModelHandle, frame: Any, n: int) -> np.ndarray:
    batch = np.zeros(n, dtype=handle.batch_dtype)
    for name in batch.dtype.names or ():
        batch[name] = frame[name].to_numpy()[:n]
    return batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    settings = {"n_estimators": 100, "random_state": 0}
    one_model, frame = pipeline(GradientBoostingClassifier(**settings))
    two_model, _ = pipeline(UnlistedGradientBoosting(**settings))
    handles = {
        "one pass": estimator_handle(one_model, name="gbc", version="1", format="joblib"),
        "two passes": estimator_handle(two_model, name="gbc", version="1", format="joblib"),
    }
    sizes = (1, 8, 32)
    batches = {n: batch_of(handles["one pass"], frame, n) for n in sizes}
    for handle in handles.values():
        handle.warmup(1, 32)  # the first batch decides one pass or two
    for n in sizes:  # same answers, byte for byte
        one, two = (h.predict_batch(batches[n]) for h in handles.values())
        assert one["predictions"].dtype == two["predictions"].dtype
        assert np.array_equal(one["predictions"], two["predictions"])
        assert np.array_equal(one["probabilities"], two["probabilities"])

    times: dict[tuple[str, str, int], list[float]] = {}
    for r in range(args.rounds):
        order = list(handles) if r % 2 == 0 else list(reversed(handles))
        for n in sizes:
            for name in order:
                predict_batch, batch = handles[name].predict_batch, batches[n]
                started, cpu_started = time.perf_counter(), time.process_time()
                for _ in range(args.calls):
                    predict_batch(batch)
                cpu = (time.process_time() - cpu_started) / args.calls
                wall = (time.perf_counter() - started) / args.calls
                times.setdefault(("wall", name, n), []).append(wall * 1e6)
                times.setdefault(("cpu", name, n), []).append(cpu * 1e6)

    print(f"CPU: {cpu_model()}; {args.rounds} rounds taking turns, {args.calls} calls each")
    print("GradientBoostingClassifier(100 trees) pipeline on a 4-column DataFrame")
    print(f"{'clock':>5} {'batch':>5}  {'two passes µs':>22}  {'one pass µs':>22}  {'ratio':>5}")
    for clock in ("wall", "cpu"):
        for n in sizes:
            cells = []
            for name in ("two passes", "one pass"):
                t = times[(clock, name, n)]
                cells.append(f"{statistics.median(t):8.0f} ({min(t):.0f}-{max(t):.0f})")
            fast, slow = (
                statistics.median(times[(clock, h, n)]) for h in ("one pass", "two passes")
            )
            print(f"{clock:>5} {n:>5}  {cells[0]:>22}  {cells[1]:>22}  {fast / slow:5.2f}")


if __name__ == "__main__":
    main()
