"""The typed data plane's cost, side by side in one run: the demo model before and after
the change, and the DataFrame pipeline of ``examples/churn.py`` (string columns, missing
values) after it.

    python bench/typed_path.py                       # 5 s per cell, 2 rounds
    python bench/typed_path.py --before 7eaa337 --duration 3 --rounds 1

Each server is ``gunicorn wsgi:app -c gunicorn.conf.py`` with its default settings (2
workers, access log on), started from a git worktree of ``--before`` or from this tree,
and driven by wrk (one thread pinned to the last CPU) with single-instance ``/predict``
bodies at ``--connections`` keep-alive connections. Rounds alternate before/after so a
drift of the machine hits both. Prints the CPU model and each cell's requests/s and
latency percentiles, and the after/before ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.host import cpu_model  # noqa: E402
from bench.http_load import GUNICORN, free_port, request, wrk  # noqa: E402
from bench.models import real_rows  # noqa: E402
from tests.tabular import churn_rows, write_churn  # noqa: E402


def start(tree: Path, model: Path, body: str, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A server of ``tree``'s code serving ``model``, answering ``body`` from both workers."""
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "SERVING_MODEL_PATH": str(model),
        "SERVING_BIND": f"127.0.0.1:{port}",
        "SERVING_WORKERS": "2",
        "SERVING_METRICS_DIR": tempfile.mkdtemp(prefix="bench-typed-"),
    }
    cmd = [str(GUNICORN), "wsgi:app", "-c", "gunicorn.conf.py", "--no-control-socket"]
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT, process_group=0)  # fmt: skip
    deadline, ok = time.monotonic() + 90, 0
    while ok < 20 and time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited:\n{log.read_text()}")
        try:
            status, _ = request(port, "POST", "/predict", body)
            ok = ok + 1 if status == 200 else 0
        except OSError:
            time.sleep(0.1)
    if ok < 20:
        raise SystemExit(f"server not ready:\n{log.read_text()}")
    return proc, port


def stop(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, 15)
    proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="7eaa337", help="commit before the typed path")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per cell")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=64)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-typed-"))
    before = work / "before"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(before),
                    args.before], check=True, capture_output=True)  # fmt: skip
    _, _, _ = write_churn(work)
    demo_bodies, churn_bodies = work / "demo.jsonl", work / "churn.jsonl"
    demo_bodies.write_text(
        "\n".join(json.dumps({"instances": [row.tolist()]}) for row in real_rows()) + "\n"
    )
    churn_bodies.write_text("\n".join(json.dumps({"instances": [r]}) for r in churn_rows()) + "\n")
    demo = ROOT / "serving" / "demo" / "breast_cancer.joblib"
    cells = {
        "demo, before": (before, demo, demo_bodies),
        "demo, after": (ROOT, demo, demo_bodies),
        "churn DataFrame pipeline, after": (ROOT, work / "churn.joblib", churn_bodies),
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in cells}
    try:
        for _ in range(args.rounds):
            for name, (tree, model, bodies) in cells.items():
                first = bodies.read_text().splitlines()[0]
                proc, port = start(tree, model, first, work / f"{name.split(',')[0]}.log")
                try:
                    results[name].append(wrk(port, args.connections, args.duration, bodies,
                                             close=False))  # fmt: skip
                finally:
                    stop(proc)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(before)],
                       check=False, capture_output=True)  # fmt: skip

    print(
        f"CPU: {cpu_model()} ({os.cpu_count()} cores); {args.connections} keep-alive "
        f"connections, single-instance bodies, {args.duration:g} s x {args.rounds} rounds"
    )
    print(f"{'server':<34} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}  per round")
    medians = {}
    for name, runs in results.items():
        rps = statistics.median(r["rps"] for r in runs)
        medians[name] = rps
        p50 = statistics.median(r["p50_us"] for r in runs) / 1000
        p99 = statistics.median(r["p99_us"] for r in runs) / 1000
        kinds = ("connect_errors", "read_errors", "write_errors", "status_errors", "timeouts")
        errors = ",".join(f"{k.split('_')[0]}:{sum(r[k] for r in runs)}" for k in kinds
                          if any(r[k] for r in runs)) or "0"  # fmt: skip
        rounds = ", ".join(f"{r['rps']:.0f}" for r in runs)
        print(f"{name:<34} {rps:>8.0f} {p50:>8.2f} {p99:>8.2f} {errors:>7}  {rounds}")
    ratio = medians["demo, after"] / medians["demo, before"]
    print(f"demo after/before: {ratio:.2f}x")


if __name__ == "__main__":
    main()
