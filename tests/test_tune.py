"""serving.tune: the sweep on a tiny real model and the recommendation rules."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import pandas as pd
import pytest

from serving.model.loaders import ModelHandle, load_model
from serving.tune import (
    SweepPoint,
    load_as_served,
    main,
    monotone,
    plateau_start,
    recommend,
    schema_rows,
    sweep,
)
from serving.tune.engines import BYTES_PER_NODE, choose_engine
from tests.tabular import ROOT, write_churn


def test_sweep_times_every_batch_size_on_the_model() -> None:
    seen: list[int] = []

    def model(rows: np.ndarray) -> np.ndarray:
        seen.append(len(rows))
        return rows[:, 0]

    handle = ModelHandle.from_callable(model, name="m", version="1", n_features=2)
    points = sweep(handle, np.ones((3, 2)), sizes=(1, 4, 16), min_time_s=0.001)

    assert [p.batch_size for p in points] == [1, 4, 16]
    assert set(seen) == {1, 4, 16}
    assert all(p.seconds_per_call > 0 for p in points)


def test_sweep_sees_a_fixed_cost_model_plateau_late() -> None:
    def fixed_cost(rows: np.ndarray) -> np.ndarray:
        time.sleep(0.002)  # like a forest: the same cost whatever the batch size
        return rows[:, 0]

    handle = ModelHandle.from_callable(fixed_cost, name="m", version="1", n_features=1)
    points = sweep(handle, np.ones((1, 1)), sizes=(1, 2, 4, 8), min_time_s=0.01)

    assert plateau_start(points).batch_size == 8
    assert points[-1].rows_per_s > 4 * points[0].rows_per_s


def curve(costs_ms: dict[int, float]) -> list[SweepPoint]:
    return [SweepPoint(size, ms / 1000) for size, ms in costs_ms.items()]


def test_plateau_start_is_the_smallest_size_within_ten_percent_of_the_best() -> None:
    # rows/s: 1000, 1800, 3000, 3300, 3400 -> 3300 >= 0.9 * 3400 -> plateau at 32.
    points = curve({4: 4.0, 8: 4.444, 16: 5.333, 32: 9.697, 64: 18.82})
    assert plateau_start(points).batch_size == 32


def test_recommend_caps_the_batch_by_latency_budget_and_concurrency() -> None:
    points = curve({1: 1.0, 2: 1.0, 4: 1.1, 8: 1.2, 16: 2.0, 32: 4.0, 64: 8.0, 128: 16.0})

    roomy = recommend(points, p99_ms=100, cpus=2, clients=256)
    assert roomy.max_batch_size == 16  # plateau start: 16 rows/2 ms beats 8/1.2 by > 10 %
    assert roomy.threads == 32 and roomy.workers == 2

    tight = recommend(points, p99_ms=7, cpus=2, clients=256)
    assert tight.max_batch_size == 8  # 2 x 2.0 ms > 3.5 ms (half the budget); 2 x 1.2 fits

    few_clients = recommend(points, p99_ms=100, cpus=2, clients=8)
    assert few_clients.max_batch_size == 4  # 8 clients / 2 workers
    assert any("no bigger batch can form" in r for r in few_clients.reasons)


def test_sweep_warms_up_so_a_slow_first_call_is_not_measured() -> None:
    calls = 0

    def cold_start(rows: np.ndarray) -> np.ndarray:
        nonlocal calls
        calls += 1
        time.sleep(0.2 if calls == 1 else 0.0005)  # lazy initialisation on the first call
        return rows[:, 0]

    handle = ModelHandle.from_callable(cold_start, name="m", version="1", n_features=1)
    points = sweep(handle, np.ones((1, 1)), sizes=(1, 2), min_time_s=0.001)

    assert max(points[0].samples) < 0.1  # the 0.2 s call was a warmup call, not a sample
    assert len(points[0].samples) >= 7


def test_sweep_point_is_the_median_so_one_slow_call_does_not_move_it() -> None:
    point = SweepPoint.from_samples(1, [0.0409, 0.019, 0.0192, 0.0189, 0.0191])
    assert point.seconds_per_call == 0.0191


def test_monotone_reads_a_smaller_batch_as_costing_no_more_than_a_bigger_one() -> None:
    points = monotone(curve({1: 40.9, 2: 26.0, 4: 26.6, 8: 26.2, 16: 30.0}))
    assert [round(p.seconds_per_call * 1000, 1) for p in points] == [26.0, 26.0, 26.2, 26.2, 30.0]


# Recorded sweeps (ms per call, median of several calls) on the 2-core development machine.
FOREST_300_TREES = {  # flat cost: per-tree Python overhead, whatever the rows
    1: 19.0, 2: 19.1, 4: 19.2, 8: 19.3, 16: 19.4, 32: 19.5, 64: 19.8,
    128: 21.5, 256: 25.0, 512: 33.0, 1024: 50.0,
}  # fmt: skip
MLP_LINEAR = {  # linear cost: 0.05 ms fixed + 0.01 ms per row
    1: 0.06, 2: 0.07, 4: 0.09, 8: 0.13, 16: 0.21, 32: 0.37, 64: 0.69,
    128: 1.33, 256: 2.61, 512: 5.17, 1024: 10.29,
}  # fmt: skip
# One-shot sweep of the forest on a loaded machine (issue 15): a cold first call at batch 1
# and one slow call at 128.
FOREST_NOISY = {
    1: 40.9, 2: 27.0, 4: 26.6, 8: 26.9, 16: 27.1, 32: 27.2, 64: 27.4,
    128: 56.0, 256: 31.0, 512: 40.0, 1024: 60.0,
}  # fmt: skip


def test_recommend_flat_cost_forest_takes_the_batch_concurrency_allows() -> None:
    rec = recommend(curve(FOREST_300_TREES), p99_ms=100, cpus=2, clients=64)
    assert rec.meets_budget
    assert rec.max_batch_size == 32  # 64 clients / 2 workers; 2 x 19.5 ms fits in 50 ms
    assert rec.threads == 64


def test_recommend_says_when_no_setting_meets_the_budget_and_still_picks_the_knee() -> None:
    rec = recommend(curve(FOREST_300_TREES), p99_ms=30, cpus=2, clients=512)
    assert not rec.meets_budget  # 2 x 19 ms > 15 ms
    (verdict,) = [r for r in rec.reasons if "NO SETTING MEETS p99 <= 30 ms" in r]
    # the rule says why (trial: "cannot be met" beside an expected p99 under the budget)
    assert "the other half is kept for HTTP and the queue under load" in verdict
    # the largest batch costing at most 1.25 x batch 1 (23.75 ms): 128 (21.5 ms), not 256
    assert rec.max_batch_size == 128
    assert rec.expected_p99_ms == pytest.approx(43.0)

    capped = recommend(curve(FOREST_300_TREES), p99_ms=30, cpus=2, clients=64)
    assert capped.max_batch_size == 32  # no bigger batch can form with 32 per worker


def test_recommend_linear_cost_mlp_stops_at_the_plateau_and_its_knee_is_small() -> None:
    roomy = recommend(curve(MLP_LINEAR), p99_ms=50, cpus=2, clients=256)
    assert roomy.meets_budget
    assert roomy.max_batch_size == 64  # plateau: 92.8k rows/s >= 0.9 x 99.5k

    hopeless = recommend(curve(MLP_LINEAR), p99_ms=0.1, cpus=2, clients=256)
    assert not hopeless.meets_budget
    assert hopeless.max_batch_size == 2  # 0.07 ms <= 1.25 x 0.06; batch 4 (0.09) is not


def test_recommend_noisy_forest_sweep_is_not_fooled_by_a_slow_first_call() -> None:
    rec = recommend(curve(FOREST_NOISY), p99_ms=100, cpus=2, clients=64)
    # Issue 15: read as-is, batch 1 (40.9 ms) "cannot hold two calls" in 50 ms and the
    # tool recommended batch 1 and 2 threads; batch 1 costs at most what batch 4 costs
    # (26.6 ms), which still does not fit twice in 50 ms: say so, and take the knee
    # (31 ms at 256 <= 1.25 x 26.6), capped at the 32 requests in flight per worker.
    assert not rec.meets_budget
    assert rec.max_batch_size == 32
    assert rec.threads == 64
    assert any("batch 1 (40.90 -> 26.60 ms)" in r for r in rec.reasons)

    tight = recommend(curve(FOREST_NOISY), p99_ms=40, cpus=2, clients=512)
    assert not tight.meets_budget
    assert tight.max_batch_size == 256  # 31 ms <= 1.25 x 26.6; the 56 ms call at 128 is noise


def test_sweep_times_a_typed_dataframe_model_on_varied_rows_from_its_schema(
    tmp_path: Path,
) -> None:
    """docs/models.md's churn pipeline (string columns): the sweep crashed with IndexError."""
    model, path, _ = write_churn(tmp_path)
    handle = load_model(path)
    assert handle.features is not None and handle.matrix_dtype is None
    rows = schema_rows(handle.features, 64)

    points = sweep(handle, rows, sizes=(1, 8, 100), min_time_s=0.001, rounds=1, min_calls=1)

    assert [p.batch_size for p in points] == [1, 8, 100]
    assert set(rows["plan"]) == {"basic", "pro", "team"}  # drawn from the encoder's categories
    expected = model.predict(pd.DataFrame({name: rows[name] for name in rows.dtype.names}))
    np.testing.assert_array_equal(handle.predict_batch(rows)["predictions"], expected)


def test_tune_command_recommends_settings_for_the_readme_churn_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's tune command, run in-process (the next test runs it as a process)."""
    _, path, _ = write_churn(tmp_path)
    main(["--model", str(path), "--plot", str(tmp_path / "tune.png")])

    out = capsys.readouterr().out
    assert "SERVING_MAX_BATCH_SIZE=" in out and "<- plateau start" in out
    assert "SERVING_BATCH_POLICY=adaptive  (the default)\n" in out
    assert "(the window policy's wait; adaptive waits at most one predict call)" in out
    saved = (tmp_path / "tune.png").exists()  # matplotlib is the bench extra's, not the test's
    assert (f"plot saved to {tmp_path / 'tune.png'}" in out) == saved
    assert ("no plot: matplotlib is not installed" in out) == (not saved)


def test_tune_loads_an_mlflow_folder_and_a_class_as_the_server_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reported by the new-user trial: a folder, a .skops file and a class all failed."""
    from tests.tabular import CHURN_SKOPS_TYPES, churn_module, save_with_mlflow

    model = churn_module().churn_pipeline()
    folder = save_with_mlflow(tmp_path / "churn_mlflow", model, list(CHURN_SKOPS_TYPES)).parent
    monkeypatch.setenv("SERVING_SKOPS_TRUSTED_TYPES", ",".join(CHURN_SKOPS_TYPES))
    served = load_as_served(folder)
    write_churn(tmp_path)
    typed = load_as_served(tmp_path, model_class="tests.models:TypedChurn")

    assert (served.name, served.format) == ("churn_mlflow", "skops")
    assert typed.format == "python"
    names = ["plan", "region", "seats", "usage_hours"]
    assert (
        [f.name for f in served.features or ()] == [f.name for f in typed.features or ()] == names
    )
    for handle in (served, typed):
        rows = schema_rows(handle.features or (), 16)
        points = sweep(handle, rows, sizes=(1, 8), min_time_s=0.001, rounds=1, min_calls=1)
        assert [p.batch_size for p in points] == [1, 8]


def test_tune_command_says_why_it_cannot_load_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "model.joblib"
    bad.write_bytes(b"not a joblib file")
    result = subprocess.run(
        [sys.executable, "-m", "serving.tune", "--model", str(bad)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.startswith(f"serving.tune: cannot load model {bad}")
    assert "Traceback" not in result.stderr


def test_choose_engine_compiled_when_faster_at_one_and_at_the_batch_with_the_memory_it_costs() -> (
    None
):
    library = curve({1: 12.0, 8: 12.5, 32: 13.0})
    fast = curve({1: 0.01, 8: 0.05, 32: 0.12})

    auto = choose_engine(library, fast, batch_size=32, auto_compiles=True, nodes=100_000)
    on = choose_engine(library, fast, batch_size=32, auto_compiles=False, nodes=2_000_000)

    assert (auto.setting, auto.compiled) == ("auto", True)
    assert "0.00083x the library's at 1 instance and 0.0092x at 32" in auto.reasons[0]
    assert f"about {100_000 * BYTES_PER_NODE / 2**20:.0f} MiB a worker" in auto.reasons[1]
    assert (on.setting, on.compiled) == ("on", True)
    assert on.reasons[-1] == "SERVING_COMPILE=auto does not compile it: set SERVING_COMPILE=on"


def test_choose_engine_off_when_compiled_is_not_faster_at_the_batch_the_server_runs() -> None:
    library = curve({1: 0.30, 32: 0.40})
    compiled = curve({1: 0.05, 32: 0.39})  # faster alone, not at 32

    auto = choose_engine(library, compiled, batch_size=32, auto_compiles=True)
    left = choose_engine(library, compiled, batch_size=32, auto_compiles=False)
    none = choose_engine(library, None, batch_size=32, auto_compiles=False, not_compiled="why")

    assert (auto.setting, auto.compiled) == ("off", False)
    assert (left.setting, left.compiled) == ("auto", False)
    assert (none.setting, none.compiled, none.reasons) == (
        "auto",
        False,
        ("it does not compile: why",),
    )


@pytest.mark.parametrize("library", ["sklearn", "xgboost"])
def test_tune_command_compares_both_engines_on_a_tree_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], library: str
) -> None:
    """A forest and an XGBoost model, timed as the server serves them (an attack found
    tune saying an XGBoost model "does not compile" while the server compiled it)."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.ensemble import RandomForestClassifier
    from xgboost import XGBClassifier

    X, y = load_breast_cancer(return_X_y=True)
    path = tmp_path / "model.joblib"
    model: Any = (
        RandomForestClassifier(n_estimators=100, random_state=0)
        if library == "sklearn"
        else XGBClassifier(n_estimators=50, n_jobs=1)
    )
    joblib.dump(model.fit(X, y), path)

    main(["--model", str(path), "--plot", str(tmp_path / "tune.png")])

    out = capsys.readouterr().out
    assert out.startswith(f"{library}:\n")
    assert "\ncompiled to ONNX Runtime (SERVING_COMPILE):\n" in out
    assert "engine: SERVING_COMPILE=auto (compiled to ONNX Runtime)" in out
