"""What a hostile request costs beside a valid one of the same size, side by side in one run.

    python bench/hostile_cost.py              # every case, 3 CPU runs each
    python bench/hostile_cost.py --runs 1

Each hostile body of issue 22 (a tiny V2 request declaring a huge BYTES tensor, a million
bare numbers where lists belong, 200,000 unknown fields or columns, a CSV of bad cells, an
unknown integer category, a 5,000-digit or non-ASCII CSV number) is sent to an in-process
``create_app`` test client with the default ``SERVING_MAX_BODY_BYTES`` (2 MiB) and
``SERVING_MAX_INSTANCES_PER_REQUEST`` (1024), next to a valid request of about the same
byte size on the same route. Two models: ``wide`` (any number of float features: the
valid twin of a 2 MB body is 1024 rows as wide as it takes) and ``typed`` (a string
``plan``, an integer ``n`` of categories 1..3, a float ``x``; its model answers zeros).

Per request: the answer's status, the CPU time of this process (median of ``--runs``, the
batcher's thread included, without tracemalloc) and the peak of Python allocations
(tracemalloc, numpy's arrays included; one run). The documented bound (docs/operations.md,
"Cost of a request") is that the hostile column stays about at or under the valid one.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry  # noqa: E402

from bench.host import cpu_model  # noqa: E402
from serving.app import create_app  # noqa: E402
from serving.model.handle import ModelHandle  # noqa: E402
from serving.model.schema import feature  # noqa: E402
from serving.observe.metrics import ServingMetrics  # noqa: E402
from serving.settings import Settings  # noqa: E402

MB = 2 * 1024 * 1024 - 4096  # bodies just under the default SERVING_MAX_BODY_BYTES
JSON = {"Content-Type": "application/json"}
CSV = {"Content-Type": "text/csv"}
TYPED = (
    feature("plan", "string", object, categories=frozenset({"basic", "pro"})),
    feature("n", "integer", np.int64, categories=frozenset({1, 2, 3})),
    feature("x", "float", np.float64),
)
TYPED_ROW = {"plan": "pro", "n": 2, "x": 1.5}


def _zeros(rows: Any) -> dict[str, Any]:
    return {"predictions": np.zeros(len(rows))}


def matrix(size: int, width: int) -> tuple[int, int]:
    """(instances, features) of a body of about ``size`` bytes of values ``width`` bytes
    each with their separator, at most 1024 instances."""
    instances = max(1, min(1024, int((size / width) ** 0.5)))
    return instances, max(1, (size - 40) // (instances * width))


def valid_twin(path: str, size: int) -> tuple[bytes, dict[str, str]]:
    """A valid request for the ``wide`` model on ``path``, of about ``size`` bytes."""
    if path == "csv":
        n, w = matrix(size, 4)  # "1.5,"
        lines = [",".join(f"c{j}" for j in range(w))] + [",".join(["1.5"] * w)] * n
        return "\n".join(lines).encode(), CSV
    n, w = matrix(size, 5)  # "1.5, "
    rows = [[1.5] * w for _ in range(n)]
    if path.startswith("/v2"):
        tensor = {"name": "input-0", "shape": [n, w], "datatype": "FP64",
                  "data": [v for row in rows for v in row]}  # fmt: skip
        return json.dumps({"inputs": [tensor]}).encode(), {}
    field = "inputs" if path == "/invocations" else "instances"
    return json.dumps({field: rows}).encode(), JSON


def keys(n: int, value: str = "0") -> str:
    return ", ".join(f'"k{i}": {value}' for i in range(n))


def cases() -> list[tuple[str, str, str, bytes, dict[str, str], bytes, dict[str, str]]]:
    """(name, app, path, hostile body, its headers, valid body, its headers)."""
    numbers = ",".join(["1"] * (MB // 2 - 20))
    header = json.dumps({"inputs": [{"name": "plan", "shape": [268435456], "datatype": "BYTES",
                                     "parameters": {"binary_data_size": 9}}]}).encode()  # fmt: skip
    tiny_v2 = {"Inference-Header-Content-Length": str(len(header))}
    valid_v2 = json.dumps({"inputs": [
        {"name": "plan", "shape": [1], "datatype": "BYTES", "data": ["pro"]},
        {"name": "n", "shape": [1], "datatype": "INT64", "data": [2]},
        {"name": "x", "shape": [1], "datatype": "FP64", "data": [1.5]},
    ]}).encode()  # fmt: skip
    many_keys = keys(MB // 15)
    bad_csv_rows = "\n".join([",".join(["x"] * 1000)] * 1000)
    bad_csv = (",".join(f"c{j}" for j in range(1000)) + "\n" + bad_csv_rows).encode()
    typed_csv = "plan,n,x\npro,{},1.5\n"
    typed_valid = typed_csv.format(2).encode()
    typed_valid_5k = ("plan,n,x\n" + "pro,2,1.5\n" * 501).encode()
    wide: list[tuple[str, str, bytes, dict[str, str]]] = [
        ("/predict: 1M bare numbers", "/predict", f'{{"instances": [{numbers}]}}'.encode(), JSON),
        ("/invocations: inputs, 1M numbers", "/invocations",
         f'{{"inputs": [{numbers}]}}'.encode(), JSON),
        ("/invocations: records, 1M numbers", "/invocations",
         f'{{"dataframe_records": [{numbers}]}}'.encode(), JSON),
        ("/predict: 140k unknown fields", "/predict",
         f'{{"instances": [[1]], {many_keys}}}'.encode(), JSON),
        ("TF: inputs of 140k non-lists", "/v1/models/wide:predict",
         f'{{"inputs": {{{many_keys}}}}}'.encode(), JSON),
        ("V2: inputs, 1M numbers", "/v2/models/wide/infer",
         f'{{"inputs": [{numbers}]}}'.encode(), {}),
        ("CSV: 1M bad cells", "/invocations", bad_csv, CSV),
    ]  # fmt: skip
    out = []
    for name, path, body, headers in wide:
        twin, twin_headers = valid_twin("csv" if headers is CSV else path, len(body))
        out.append((name, "wide", path, body, headers, twin, twin_headers))
    typed = [
        ("V2: BYTES [268435456], 121 B", "/v2/models/typed/infer",
         header + b"\x05\0\0\0basic", tiny_v2, valid_v2, {}),
        ("/predict: n = 7 (unknown)", "/predict",
         json.dumps({"instances": [TYPED_ROW | {"n": 7}]}).encode(), JSON,
         json.dumps({"instances": [TYPED_ROW]}).encode(), JSON),
        ("CSV: a 5,000-digit integer", "/invocations",
         typed_csv.format("1" * 5000).encode(), CSV, typed_valid_5k, CSV),
        ("CSV: Arabic-Indic digits", "/invocations",
         typed_csv.format("\u0662").encode(), CSV, typed_valid, CSV),
    ]  # fmt: skip
    out += [(name, "typed", path, b, h, v, vh) for name, path, b, h, v, vh in typed]
    return out


def apps() -> dict[str, Any]:
    settings = Settings(workers=1)
    wide = ModelHandle.from_callable(lambda X: X[:, 0], name="wide", version="1")
    typed = ModelHandle("typed", "1", "callable", _zeros, features=TYPED,
                        feature_names=tuple(f.name for f in TYPED))  # fmt: skip
    return {
        name: create_app(settings, models=[handle], metrics=ServingMetrics(CollectorRegistry()))
        for name, handle in (("wide", wide), ("typed", typed))
    }


def measure(call: Callable[[], Any], runs: int) -> tuple[int, float, float]:
    """(status, median CPU ms over ``runs``, tracemalloc peak MB of one more run)."""
    cpu = []
    for _ in range(runs):
        start = time.process_time()
        status = call().status_code
        cpu.append((time.process_time() - start) * 1000)
    tracemalloc.start()
    try:
        call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return status, statistics.median(cpu), peak / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="CPU runs per request (median)")
    args = parser.parse_args()
    built = apps()
    clients = {name: app.test_client() for name, app in built.items()}
    print(f"CPU: {cpu_model()}; in-process test client, default limits (2 MiB, 1024)")
    print(f"{'case':36} {'bytes':>9} {'status':>6} {'CPU ms':>8} {'peak MB':>8} | "
          f"{'valid bytes':>11} {'status':>6} {'CPU ms':>8} {'peak MB':>8}")  # fmt: skip
    try:
        for name, app, path, body, headers, twin, twin_headers in cases():
            client = clients[app]
            bad = measure(lambda c=client, p=path, b=body, h=headers: c.post(p, data=b, headers=h),
                          args.runs)  # fmt: skip
            good = measure(lambda c=client, p=path, b=twin, h=twin_headers: c.post(
                p, data=b, headers=h), args.runs)  # fmt: skip
            print(f"{name:36} {len(body):>9} {bad[0]:>6} {bad[1]:>8.1f} {bad[2]:>8.1f} | "
                  f"{len(twin):>11} {good[0]:>6} {good[1]:>8.1f} {good[2]:>8.1f}")  # fmt: skip
    finally:
        for app in built.values():
            app.extensions["serving"].get_models().stop(timeout_s=10)


if __name__ == "__main__":
    main()
