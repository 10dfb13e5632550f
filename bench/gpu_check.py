"""The checks behind ``bench/gpu_check.sh`` (run that: it installs the CUDA wheels first).

1. CUDA is usable (``serving.model.providers``) and a session asked for ``cuda,cpu`` really runs
   on ``CUDAExecutionProvider``.
2. GPU and CPU sessions agree on the 569 real rows: probabilities within 1e-4, labels equal.
3. In-process rows/s, CPU vs GPU, at batch sizes 1, 32, 256 and 1024 (bench/onnx_bench.py).
4. End to end: one Gunicorn worker serving the MLP graph, driven by 64 client threads with
   single-instance requests for ``--seconds``, on CPU then on GPU: requests/s, mean batch.
5. The heavy forest compiled to ONNX Runtime (``SERVING_COMPILE``) with ``cuda,cpu``: the
   session runs on ``CUDAExecutionProvider``, its labels equal scikit-learn's on the real
   rows and its probabilities are within 1e-6; µs per call at batch 1, 32 and 256 on the
   GPU session, the CPU session and scikit-learn (ONNX Runtime has no CUDA kernel for tree
   ensembles: their nodes run on the CPU provider within the CUDA session, which the
   timings show).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.http_load import free_port  # noqa: E402
from bench.models import batch_totals, model_path, real_rows  # noqa: E402
from serving.model.loaders import load_model  # noqa: E402
from serving.model.onnx_loader import OnnxLoader  # noqa: E402
from serving.model.providers import CUDA, provider_problem  # noqa: E402


def check(condition: bool, what: str) -> None:
    print(f"{'PASS' if condition else 'FAIL'}: {what}", flush=True)
    if not condition:
        raise SystemExit(1)


def serve_and_load(providers: str, seconds: float, clients: int) -> tuple[float, float, str]:
    """Requests/s, mean batch size and provider of one worker under ``clients`` threads."""
    port = free_port()
    env = {
        **os.environ,
        "SERVING_MODEL_PATH": str(model_path("mlp-onnx")),
        "SERVING_ONNX_PROVIDERS": providers,
        "SERVING_BIND": f"127.0.0.1:{port}",
        "SERVING_WORKERS": "1",
        "SERVING_MAX_BATCH_SIZE": "256",
        "SERVING_THREADS": str(clients),
        "SERVING_ACCESS_LOG": "false",
        "SERVING_METRICS_DIR": tempfile.mkdtemp(prefix="gpu-check-"),
    }
    gunicorn = Path(sys.executable).parent / "gunicorn"
    command = [str(gunicorn), "wsgi:app", "-c", "gunicorn.conf.py", "--no-control-socket"]
    server = subprocess.Popen(command, cwd=ROOT, env=env, process_group=0)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                health = requests.get(f"{url}/healthz", timeout=2)
                if health.status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit(f"FAIL: the {providers} server did not become ready")
            time.sleep(0.2)
        rows = real_rows().tolist()
        counts = [0] * clients
        stop = time.monotonic() + seconds

        def client(k: int) -> None:
            with requests.Session() as session:
                while time.monotonic() < stop:
                    body = {"instances": [rows[(k + counts[k]) % len(rows)]]}
                    response = session.post(f"{url}/predict", json=body, timeout=30)
                    response.raise_for_status()
                    counts[k] += 1

        threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        rate = sum(counts) / (time.perf_counter() - started)
        calls, instances = batch_totals(requests.get(f"{url}/metrics", timeout=10).text)
        mean = instances / calls
        return rate, mean, health.json()["execution_provider"]
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--clients", type=int, default=64)
    args = parser.parse_args()

    problem = provider_problem(CUDA)
    check(problem is None, f"CUDA is usable here ({problem or 'driver, device and libraries'})")
    gpu = load_model(model_path("mlp-onnx"), loaders={"onnx": OnnxLoader("cuda,cpu")})
    cpu = load_model(model_path("mlp-onnx"), loaders={"onnx": OnnxLoader("cpu")})
    check(gpu.execution_provider == CUDA, f"the session runs on {gpu.execution_provider}")

    X = real_rows()
    on_gpu, on_cpu = gpu.predict_batch(X), cpu.predict_batch(X)
    gap = float(np.abs(on_gpu["probabilities"] - on_cpu["probabilities"]).max())
    check(gap <= 1e-4, f"GPU vs CPU probabilities: max difference {gap:.2e} <= 1e-4")
    same = np.array_equal(on_gpu["predictions"], on_cpu["predictions"])
    check(same, "GPU and CPU labels agree on all 569 rows")

    bench = [sys.executable, str(ROOT / "bench" / "onnx_bench.py"), "--providers", "cpu"]
    bench += ["cuda,cpu", "--batch-sizes", "1", "32", "256", "1024", "--seconds", "0.5"]
    subprocess.run(bench, check=True)

    print(f"\nend to end, 1 worker, {args.clients} clients, single-instance requests:")
    results = {spec: serve_and_load(spec, args.seconds, args.clients) for spec in ("cpu", "cuda")}
    for spec, (rate, mean, provider) in results.items():
        print(f"  {spec:>4}: {rate:8,.0f} requests/s, mean batch {mean:5.1f}, on {provider}")
    check(results["cuda"][2] == CUDA, "the service's /healthz reports CUDAExecutionProvider")
    print(f"  GPU / CPU: {results['cuda'][0] / results['cpu'][0]:.2f}x")
    compiled_forest(X)


def compiled_forest(X: np.ndarray) -> None:
    """Check 5: the heavy forest compiled on ``cuda,cpu`` and on ``cpu``."""
    from serving.model.compiled import compile_handle

    forest = load_model(model_path("heavy"))
    on_gpu = compile_handle(forest, providers="cuda,cpu")
    on_cpu = compile_handle(forest, providers="cpu")
    check(on_gpu.execution_provider == CUDA, f"compiled forest on {on_gpu.execution_provider}")
    answer, expected = on_gpu.predict_batch(X), forest.predict_batch(X)
    same = np.array_equal(answer["predictions"], expected["predictions"])
    check(same, "the compiled forest's labels on the GPU session equal scikit-learn's")
    gap = float(np.abs(answer["probabilities"] - expected["probabilities"]).max())
    check(gap <= 1e-6, f"its probabilities: max difference {gap:.2e} <= 1e-6")
    print("\ncompiled forest, µs per call (median of 20):")
    for size in (1, 32, 256):
        rows = np.resize(X, (size, X.shape[1]))
        cells = []
        for handle in (on_gpu, on_cpu, forest):
            times = []
            for _ in range(20):
                started = time.perf_counter()
                handle.predict_batch(rows)
                times.append(time.perf_counter() - started)
            cells.append(f"{np.median(times) * 1e6:10,.0f}")
        print(f"  batch {size:>4}: cuda session {cells[0]}  cpu session {cells[1]}  "
              f"scikit-learn {cells[2]}")  # fmt: skip


if __name__ == "__main__":
    main()
