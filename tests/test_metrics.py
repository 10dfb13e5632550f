"""serving.observe.metrics in prometheus-client's multiprocess mode, in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHILD_WRITES = """
import os, sys
from prometheus_client import CollectorRegistry
from serving.observe.metrics import ServingMetrics

metrics = ServingMetrics(CollectorRegistry())
metrics.observe_request("POST", "/predict", 200, 0.01)      # the parent's file
pid = os.fork()
if pid == 0:                                                # a worker forked after import
    for _ in range(3):
        metrics.observe_request("POST", "/predict", 200, 0.01)
    os._exit(0)
os.waitpid(pid, 0)
print(pid)
"""


def test_metrics_written_after_a_fork_go_to_the_childs_own_file(tmp_path: Path) -> None:
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(Path.cwd())}
    out = subprocess.run(
        [sys.executable, "-c", CHILD_WRITES], env=env, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    child = int(out.stdout.strip())

    files = {p.name for p in tmp_path.glob("counter_*.db")}
    assert f"counter_{child}.db" in files and len(files) == 2, files
    from prometheus_client.mmap_dict import MmapedDict

    def requests_in(path: Path) -> float:
        db = MmapedDict(str(path), read_mode=True)
        try:
            return sum(v for k, v, _ in db.read_all_values() if '"http_requests_total"' in k)
        finally:
            db.close()

    assert requests_in(tmp_path / f"counter_{child}.db") == 3
    (parent,) = files - {f"counter_{child}.db"}
    assert requests_in(tmp_path / parent) == 1


def test_each_request_stage_is_recorded_under_its_own_label() -> None:
    from prometheus_client import CollectorRegistry

    from serving.observe.metrics import ServingMetrics

    metrics = ServingMetrics(CollectorRegistry())
    metrics.observe_stages(
        "m", "1", True, compute_input=1.0, queue=2.0, compute_infer=3.0, compute_output=4.0
    )
    metrics.observe_stages(
        "m", "1", False, compute_input=0.5, queue=0.0, compute_infer=0.0, compute_output=0.0
    )

    def total(stage: str) -> float | None:
        labels = {"model": "m", "version": "1", "stage": stage}
        return metrics.registry.get_sample_value("inference_request_stage_seconds_sum", labels)

    assert [total(s) for s in ("success", "fail")] == [10.0, 0.5]
    assert [total(s) for s in ("compute_input", "queue", "compute_infer", "compute_output")] == [
        1.5, 2.0, 3.0, 4.0,
    ]  # fmt: skip
