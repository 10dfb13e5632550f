"""``python -m serving.tune``: load the model as the server does, sweep it (and, for a
scikit-learn model, its compiled form), print the sweeps, the engine and the
recommendation; ``--plot`` saves the curve (matplotlib, the bench extra).

Boundary: see README.md beside this file.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from serving.model.handle import ModelHandle
from serving.model_settings import ModelSettings
from serving.tune.advice import Recommendation, recommend
from serving.tune.engines import EngineChoice, choose_engine
from serving.tune.sweep import SweepPoint, plateau_start, schema_rows, sweep

__all__ = ["load_as_served", "main", "plot"]


def plot(points: list[SweepPoint], path: Path, title: str) -> None:
    """rows/s and us/row against batch size, plateau start marked, saved as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plateau = plateau_start(points)
    fig, left = plt.subplots(figsize=(7, 4))
    sizes = [p.batch_size for p in points]
    left.plot(sizes, [p.rows_per_s for p in points], "o-", label="rows/s")
    left.set_xscale("log", base=2)
    left.set_xlabel("batch size (instances per predict call)")
    left.set_ylabel("rows/s")
    left.axvline(plateau.batch_size, color="grey", linestyle="--", label="plateau start")
    right = left.twinx()
    right.plot(sizes, [p.us_per_row for p in points], "s:", color="tab:red", label="us/row")
    right.set_yscale("log")
    right.set_ylabel("us/row")
    left.set_title(title)
    left.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def load_as_served(
    path: Path, fmt: str | None = None, model_class: str | None = None
) -> ModelHandle:
    """The model at ``path`` loaded exactly as the server loads it (``load_artifact``): a
    directory's one artifact (an MLflow folder's ``model.skops``), its owner, mode and
    SHA-256 checked, the loaders the ``SERVING_*`` environment configures
    (``SERVING_SKOPS_TRUSTED_TYPES``, ``SERVING_ONNX_PROVIDERS``, ...), your own class.

    :raises SettingsError: when those settings are invalid, naming the variable.
    :raises ModelLoadError: naming the path and the cause.
    """
    from serving.loading import load_artifact

    return load_artifact(_model_settings(path, fmt, model_class))


def _model_settings(path: Path, fmt: str | None, model_class: str | None) -> ModelSettings:
    from pydantic import ValidationError

    from serving.errors import SettingsError
    from serving.settings import Settings

    where = {"model_dir": path} if path.is_dir() else {"model_path": path}
    try:
        settings = Settings(**where, model_format=fmt, model_class=model_class, workers=1)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise SettingsError("--model/--format/--class", str(exc.errors()[0]["msg"])) from None
    return settings.model_settings()[0]


def _engines(
    model: ModelSettings, handle: ModelHandle, points: list[SweepPoint], rows: Any, batch: int
) -> tuple[EngineChoice, ModelHandle, list[SweepPoint]]:
    """Both engines swept and printed, the choice, and the handle and sweep it picks."""
    from serving.loading import AUTO_COMPILE_MAX_NODES
    from serving.model.compiled import LIBRARIES, NotCompiled, compile_handle, tree_nodes

    if handle.engine not in LIBRARIES:
        why = f"it is served by {handle.engine}, not scikit-learn or XGBoost"
        return choose_engine(points, None, batch_size=batch, auto_compiles=False,
                             not_compiled=why), handle, points  # fmt: skip
    nodes = tree_nodes(handle.estimator)
    try:
        fast = compile_handle(
            handle, providers=model.onnx_providers, cuda_device=model.cuda_device,
            threads=model.blas_threads, tolerance=model.compile_tolerance,
        )  # fmt: skip
    except Exception as exc:  # NotCompiled, or a converter's own failure
        why = str(exc) if isinstance(exc, NotCompiled) else f"{type(exc).__name__}: {exc}"
        choice = choose_engine(points, None, batch_size=batch, auto_compiles=False,
                               not_compiled=why[:300])  # fmt: skip
        return choice, handle, points
    fast_points = sweep(fast, rows)
    print("\ncompiled to ONNX Runtime (SERVING_COMPILE):")
    _print_sweep(fast_points)
    auto = 0 < nodes <= AUTO_COMPILE_MAX_NODES and handle.engine != "lightgbm"
    choice = choose_engine(points, fast_points, batch_size=batch, auto_compiles=auto, nodes=nodes)
    if choice.compiled:
        return choice, fast, fast_points
    return choice, handle, points


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m serving.tune", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--model", type=Path, required=True,
        help="model to measure: a file, or a directory holding one (an MLflow folder)",
    )  # fmt: skip
    parser.add_argument(
        "--format", default=None,
        help="pickle, joblib, skops, onnx or python (default: from the extension)",
    )  # fmt: skip
    parser.add_argument(
        "--class", dest="model_class", default=None,
        help="package.module:ClassName of your own model class (as SERVING_MODEL_CLASS)",
    )  # fmt: skip
    parser.add_argument("--p99-ms", type=float, default=50.0, help="p99 latency budget in ms")
    parser.add_argument(
        "--clients", type=int, default=64, help="concurrent requests expected (default: 64)"
    )
    parser.add_argument(
        "--plot", type=Path, default=Path("tune.png"), help="where to save the plot"
    )
    return parser.parse_args(argv)


def _sweep_rows(handle: ModelHandle) -> npt.NDArray[Any]:
    """Rows to time ``handle`` on: typed rows from its schema; the breast cancer data set
    for a model of 30 numbers (the demo's); else normal noise of its width."""
    from sklearn.datasets import load_breast_cancer

    n_features = handle.n_features or 30
    if handle.features is not None and handle.matrix_dtype is None:  # typed columns
        return schema_rows(handle.features, 1024)
    data: npt.NDArray[Any] = load_breast_cancer().data
    if n_features == data.shape[1]:
        return data
    return np.random.default_rng(0).normal(size=(1024, n_features))


def _print_sweep(points: list[SweepPoint]) -> None:
    print(
        f"{'batch':>6} {'ms/call':>9} {'p10-p90 ms':>17} {'calls':>5} {'rows/s':>12} {'us/row':>9}"
    )
    plateau = plateau_start(points)
    for p in points:
        mark = "  <- plateau start" if p is plateau else ""
        ms = p.seconds_per_call * 1000
        low, high = np.percentile(p.samples, [10, 90]) * 1000
        print(
            f"{p.batch_size:>6} {ms:>9.3f} {low:>8.3f}-{high:<8.3f} {len(p.samples):>5} "
            f"{p.rows_per_s:>12,.0f} {p.us_per_row:>9.1f}{mark}"
        )
    print("(median of the calls after a warmup, sizes timed in interleaved rounds)")


def _print_recommendation(rec: Recommendation, p99_ms: float, clients: int) -> None:
    verdict = "" if rec.meets_budget else " (cannot be met: see below)"
    load = f"{clients} concurrent clients (--clients)"
    print(f"\nfor p99 <= {p99_ms} ms on {os.cpu_count()} cores, {load}{verdict}:")
    from serving.settings import Settings

    defaults = Settings()
    lines = [
        ("SERVING_MAX_BATCH_SIZE", rec.max_batch_size, defaults.max_batch_size, ""),
        ("SERVING_BATCH_POLICY", "adaptive", defaults.batch_policy, ""),
        ("SERVING_MAX_BATCH_LATENCY_MS", rec.max_batch_latency_ms, None,
         "  (the window policy's wait; adaptive waits at most one predict call)"),
        ("SERVING_WORKERS", rec.workers, defaults.workers, ""),
        ("SERVING_THREADS", rec.threads, defaults.worker_threads, ""),
    ]  # fmt: skip
    for name, value, default, note in lines:
        same = "  (the default)" if value == default else ""
        print(f"  {name}={value}{same}{note}")
    print("because:")
    for reason in rec.reasons:
        print(f"  - {reason}")


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m serving.tune``: time the model's predict call per batch size, print the
    sweep and the settings it recommends, save the plot.

    :param argv: the arguments (default: ``sys.argv[1:]``).
    :raises SystemExit: with a one-line reason when the model cannot be loaded.
    """
    args = _arguments(argv)
    from serving.errors import ModelLoadError, SettingsError

    try:
        handle = load_as_served(args.model, args.format, args.model_class)
    except (ModelLoadError, SettingsError) as exc:
        raise SystemExit(f"serving.tune: {exc}") from None
    rows = _sweep_rows(handle)
    points = sweep(handle, rows)
    print(f"{handle.engine}:")
    _print_sweep(points)
    rec = recommend(points, args.p99_ms, os.cpu_count() or 1, args.clients)
    model = _model_settings(args.model, args.format, args.model_class)
    choice, handle, points = _engines(model, handle, points, rows, rec.max_batch_size)
    served = "compiled to ONNX Runtime" if choice.compiled else f"served by {handle.engine}"
    print(f"\nengine: SERVING_COMPILE={choice.setting} ({served})")
    for reason in choice.reasons:
        print(f"  - {reason}")
    rec = recommend(points, args.p99_ms, os.cpu_count() or 1, args.clients)
    _print_recommendation(rec, args.p99_ms, args.clients)
    try:
        plot(points, args.plot, f"{handle.name}: predict_batch sweep")
        print(f"plot saved to {args.plot}")
    except ImportError:
        print("no plot: matplotlib is not installed (pip install -e '.[bench]')")
