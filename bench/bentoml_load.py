"""Our service vs BentoML 1.4 serving the same heavy forest, one instance per request, as users
deploy them, taking turns.

    python bench/bentoml_load.py                           # 3 rounds, 1/8/64 connections: ~2-3 min
    python bench/bentoml_load.py --nginx                   # both behind deploy/nginx (1 worker)
    python bench/bentoml_load.py --rounds 1 --duration 2   # smoke test

Servers (2 workers each, on 127.0.0.1, each started with ``setsid``: its own session):
  service  gunicorn wsgi:app -c gunicorn.conf.py, default settings (so each worker compiles the
           forest to ONNX Runtime at load: SERVING_COMPILE=auto), SERVING_WORKERS=2
  bentoml  bentoml serve bentoml_service:HeavyForest (bench/bentoml_service.py) from BentoML's
           own venv (``--bentoml-python``): a batchable API (adaptive batching, at most 32
           rows a batch as our SERVING_MAX_BATCH_SIZE), ``workers=2``, ``threads=1``, and
           OMP/OpenBLAS/MKL threads 1 per worker as our SERVING_BLAS_THREADS=1 pins them

The model is ``bench.models.model_path("heavy")`` (StandardScaler + RandomForestClassifier,
300 trees), loaded once per worker by both; both venvs must hold the same scikit-learn.
Each round starts both servers afresh, one after the other (the first changes from round to
round), checks each one's answer to the row the forest is least sure of against the forest's
``predict``/``predict_proba`` in this process (labels equal, probabilities within 1e-6: a
wrong answer ends the run), then drives it with wrk (one thread, pinned to the last CPU,
``bench/wrk_predict.lua``: the 569 real rows, one per request, keep-alive). Every run is
printed: requests/s, p50/p99, the mean batch (each server's /metrics) and the **server's CPU
per request** (utime + stime of the master or arbiter and its workers from /proc over the
requests answered; nginx's apart); then the ratio service / bentoml round by round. A JSON
of every run goes to bench/results/bentoml_load.json.

What differs by design, as each is deployed by default:
  * BentoML's circus arbiter starts each worker in a session of its own (``setsid``), so
    with ``kernel.sched_autogroup_enabled=1`` its two workers are two CFS autogroups where
    our master and workers are one: BentoML's workers get a larger share of the CPUs that
    wrk shares with them.
  * BentoML's ``max_latency_ms`` is a deadline, not a batching window: a request its
    dispatcher expects to finish later is answered 503. ``--max-latency-ms`` (1000 here,
    BentoML's own default 60000) is set far above a batch of 32 (about 20 ms), so it sheds
    nothing unless the server stalls; our batching window is SERVING_MAX_BATCH_LATENCY_MS
    (10 ms by default).
  * JSON: BentoML validates the body with pydantic (numpy array from a JSON list) and writes
    the answer with pydantic; ours parses and writes with orjson.
  * Both write an access log line per request (both defaults).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

import joblib
import numpy as np
import sklearn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.http_load import (  # noqa: E402
    WORKERS,
    Server,
    cpu_seconds,
    free_port,
    machine,
    request,
    spread,
    wrk,
)
from bench.models import RESULTS, model_path, real_rows, write_bodies  # noqa: E402

#: Most rows BentoML's dispatcher merges into one call: our SERVING_MAX_BATCH_SIZE default.
MAX_BATCH_SIZE = 32
#: Largest absolute difference of a server's probabilities from the forest's in this process.
TOLERANCE = 1e-6
#: Variables that size BLAS/OpenMP thread pools: 1 each, as our SERVING_BLAS_THREADS=1.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "BENTOML_NUM_THREAD", "NUMEXPR_NUM_THREADS")  # fmt: skip


class Served(Protocol):
    """What a run needs of a started server (``http_load.Server`` and ``BentoServer``)."""

    proc: subprocess.Popen[Any]
    nginx: Any
    port: int
    target_port: int

    def batch_stats(self) -> tuple[float, float]: ...
    def stop(self) -> None: ...


def main_checkout() -> Path:
    """The main checkout of this repository: ROOT, or the one this worktree belongs to."""
    marker = ROOT / ".git"
    if marker.is_file():  # a worktree: "gitdir: <main>/.git/worktrees/<name>"
        return Path(marker.read_text().split(":", 1)[1].strip()).parents[2]
    return ROOT


def bentoml_versions(python: Path) -> dict[str, str]:
    """bentoml, scikit-learn and numpy versions in BentoML's venv; exit 2 (one line, with
    the command that makes the venv) when it is missing or lacks them, or when its
    scikit-learn is not ours (the pickled forest needs the same one)."""
    venv = main_checkout() / ".venv-bento"  # its own venv: this project's stays untouched
    make = (
        f"python3.11 -m venv {venv} && {venv}/bin/pip install 'bentoml>=1.4,<1.5' "
        f"scikit-learn=={sklearn.__version__} joblib numpy"
    )
    if not python.is_file():
        print(f"no BentoML venv: {python} is missing; make it with: {make}", file=sys.stderr)
        sys.exit(2)
    probe = (
        "import json, bentoml, sklearn, numpy; print(json.dumps({'bentoml': bentoml.__version__,"
        " 'scikit-learn': sklearn.__version__, 'numpy': numpy.__version__}))"
    )
    command = [str(python), "-c", probe]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        error = (done.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"{python} cannot run BentoML ({error}); make its venv with: {make}", file=sys.stderr)
        sys.exit(2)
    versions: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    same_sklearn = versions["scikit-learn"] == sklearn.__version__
    if not versions["bentoml"].startswith("1.4.") or not same_sklearn:
        print(
            f"{python} has bentoml {versions['bentoml']}, scikit-learn {versions['scikit-learn']}; "
            f"this bench needs bentoml 1.4 and scikit-learn {sklearn.__version__}: {make}",
            file=sys.stderr,
        )
        sys.exit(2)
    return versions


class BentoServer:
    """``bentoml serve`` of ``bench/bentoml_service.py`` on 127.0.0.1 in its own session (and
    deploy/nginx in front with ``nginx=True``), ready once 20 answers in a row were 200.

        server = BentoServer(python, model_path("heavy"), max_latency_ms=1000)
        status, body = request(server.target_port, "POST", "/predict", body)
        server.stop()
    """

    kind = "bentoml"

    def __init__(self, python: Path, model: Path, *, max_latency_ms: int, nginx: bool) -> None:
        self.port = self.target_port = free_port()
        self.home = Path(tempfile.mkdtemp(prefix="bench-bentoml-home-"))
        env = {**os.environ, "BENTOML_HOME": str(self.home), "BENTOML_DO_NOT_TRACK": "True"}
        env |= dict.fromkeys(THREAD_VARIABLES, "1")
        env.pop("PYTHONPATH", None)  # BentoML's venv, none of this project's code
        cmd = [
            str(python), "-m", "bentoml", "serve", "bentoml_service:HeavyForest",
            "--working-dir", str(ROOT / "bench"), "--host", "127.0.0.1", "--port", str(self.port),
            "--arg", f"model_path={model}", "--arg", f"workers={WORKERS}",
            "--arg", f"max_batch_size={MAX_BATCH_SIZE}",
            "--arg", f"max_latency_ms={max_latency_ms}",
        ]  # fmt: skip
        RESULTS.mkdir(exist_ok=True)
        self.log_path = RESULTS / "bentoml-heavy.log"
        self.log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        self.workers: list[int] = []
        self.nginx: Any = None
        try:
            self._wait_ready()
            if nginx:
                from bench.protocols_load import front  # deploy/nginx, as http_load runs it

                self.nginx = front(self.port)
                self.target_port = self.nginx.port
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, timeout_s: float = 120) -> None:
        body = json.dumps({"instances": [real_rows()[0].tolist()]})
        deadline = time.monotonic() + timeout_s
        ok = 0
        while time.monotonic() < deadline and ok < 20 and self.proc.poll() is None:
            try:
                status, _ = request(self.port, "POST", "/predict", body)
                ok = ok + 1 if status == 200 else 0
            except OSError:
                time.sleep(0.2)
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        self.workers = [int(pid) for pid in children.read_text().split()] if ok else []
        if ok < 20:
            raise SystemExit(f"bentoml did not start:\n{self.log_path.read_text()}")

    def batch_stats(self) -> tuple[float, float]:
        """(predict calls, instances) so far: BentoML's adaptive batch size histogram."""
        _, text = request(self.port, "GET", "/metrics")
        totals = {"bentoml_service_adaptive_batch_size_count": 0.0,
                  "bentoml_service_adaptive_batch_size_sum": 0.0}  # fmt: skip
        for line in text.splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in totals:
                totals[name] += float(line.rsplit(" ", 1)[1])
        return tuple(totals.values())  # type: ignore[return-value]

    def _ours(self, pid: int) -> bool:
        """Whether ``pid`` is still one of this server's workers (not a reused pid)."""
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return False
        return f"BENTOML_HOME={self.home}".encode() in environ

    def stop(self) -> None:
        """SIGTERM to the arbiter (it stops its workers); SIGKILL to what is left after 30 s
        (the workers too: each is in a session of its own, outside the arbiter's group)."""
        if self.nginx is not None:
            self.nginx.stop()
            shutil.rmtree(self.nginx.directory, ignore_errors=True)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        for pid in self.workers:
            if self._ours(pid):
                os.killpg(pid, signal.SIGKILL)  # a worker leads its own session and group
        self.log.close()
        shutil.rmtree(self.home, ignore_errors=True)


def expected_answer(model: Path) -> tuple[list[float], Any, np.ndarray]:
    """The real row the forest is least sure of, its label (``predict``) and its
    probabilities (``predict_proba``, (2,) float64), computed in this process."""
    forest = joblib.load(model)
    rows = real_rows()
    row = rows[int(forest.predict_proba(rows).max(axis=1).argmin())][None, :]
    return row[0].tolist(), forest.predict(row)[0].item(), forest.predict_proba(row)[0]


def check(server: Served, name: str, expected: tuple[list[float], Any, np.ndarray]) -> str:
    """The server's answer to the row equals the forest's, or the run ends (exit 1)."""
    row, label, probabilities = expected
    status, text = request(server.target_port, "POST", "/predict", json.dumps({"instances": [row]}))
    if status != 200:
        raise SystemExit(f"{name}: /predict answered {status}: {text}")
    answer = json.loads(text)
    if name == "bentoml":  # [{"prediction": label, "probabilities": [...]}]
        got_label, got = answer[0]["prediction"], np.asarray(answer[0]["probabilities"])
    else:  # {"predictions": [label], "probabilities": [[...]], ...}
        got_label, got = answer["predictions"][0], np.asarray(answer["probabilities"][0])
    difference = float(np.abs(got - probabilities).max()) if got.shape == probabilities.shape else 1
    if got_label != label or difference > TOLERANCE:
        raise SystemExit(
            f"{name} answers label {got_label!r}, probabilities {got.tolist()}; the forest "
            f"in-process {label!r}, {probabilities.tolist()} (tolerance {TOLERANCE})"
        )
    engine = "scikit-learn"  # bentoml_service.py calls the joblib pipeline
    if name == "service":  # SERVING_COMPILE=auto: onnxruntime once parity holds
        engine = json.loads(request(server.port, "GET", "/healthz")[1])["models"][0]["engine"]
    return f"label {got_label}, probabilities within {difference:.1e}, engine {engine}"


def run_once(server: Served, connections: int, duration_s: float, bodies: Path) -> dict[str, Any]:
    """One keep-alive wrk run: wrk's figures, the mean batch and the CPU per request."""
    calls0, rows0 = server.batch_stats()
    cpu0 = cpu_seconds(server.proc.pid)
    nginx0 = cpu_seconds(server.nginx.proc.pid) if server.nginx else 0.0
    result = wrk(server.target_port, connections, duration_s, bodies, close=False)
    cpu1 = cpu_seconds(server.proc.pid)
    nginx1 = cpu_seconds(server.nginx.proc.pid) if server.nginx else 0.0
    calls1, rows1 = server.batch_stats()
    answered = max(result["requests"], 1)
    result["mean_batch"] = (rows1 - rows0) / (calls1 - calls0) if calls1 > calls0 else None
    result["cpu_us_per_request"] = (cpu1 - cpu0) / answered * 1e6
    nginx_us = (nginx1 - nginx0) / answered * 1e6
    result["nginx_cpu_us_per_request"] = nginx_us if server.nginx else None
    return result


def print_run(run: dict[str, Any]) -> None:
    batch = f"{run['mean_batch']:.1f}" if run["mean_batch"] is not None else "-"
    nginx = run["nginx_cpu_us_per_request"]
    print(
        f"round {run['round']} {run['server']:>7} c={run['connections']:<3} {run['rps']:7.0f} "
        f"req/s  p50 {run['p50_us'] / 1000:7.2f}  p99 {run['p99_us'] / 1000:7.2f} ms  "
        f"errors {run['errors']:<4} batch {batch:>5}  cpu {run['cpu_us_per_request']:6.0f} us/req"
        + (f" (+nginx {nginx:.0f})" if nginx is not None else ""),
        flush=True,
    )


def print_summary(runs: list[dict[str, Any]]) -> None:
    """Per cell min/median/max over the rounds, then service / bentoml round by round."""
    cells: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for run in runs:
        cells.setdefault((run["server"], run["connections"]), []).append(run)
    print("\ncells, min / median / max over the rounds:")
    for (server, c), cell in sorted(cells.items()):
        print(
            f"  {server:>7} c={c:<3} req/s {spread([r['rps'] for r in cell])}"
            f"  p99 ms {spread([r['p99_us'] / 1000 for r in cell], 1)}"
            f"  cpu us/req {spread([r['cpu_us_per_request'] for r in cell])}"
            f"  errors {sum(r['errors'] for r in cell)}"
        )
    print("\nservice / bentoml, round by round (min / median / max):")
    for (server, c), cell in sorted(cells.items()):
        other = {r["round"]: r for r in cells.get(("bentoml", c), [])}
        if server != "service" or not other:
            continue
        pairs = [(r, other[r["round"]]) for r in cell if r["round"] in other]
        for label, key in (("req/s", "rps"), ("p50", "p50_us"), ("p99", "p99_us"),
                           ("cpu/req", "cpu_us_per_request")):  # fmt: skip
            values = [a[key] / b[key] if b[key] else float("nan") for a, b in pairs]
            rounds = " ".join(f"{v:.2f}" for v in values)
            print(f"  c={c:<3} {label:>7}: {rounds}  ({spread(values, 2)})")


def start(name: str, args: argparse.Namespace, model: Path) -> Served:
    """A fresh ``service`` (our default settings, the heavy forest) or ``bentoml`` server."""
    if name == "service":
        return Server("service", "heavy", nginx=args.nginx)
    latency_ms = args.max_latency_ms
    return BentoServer(args.bentoml_python, model, max_latency_ms=latency_ms, nginx=args.nginx)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds taking turns")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per wrk run")
    parser.add_argument("--connections", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--nginx", action="store_true", help="both servers behind deploy/nginx")
    parser.add_argument(
        "--bentoml-python",
        type=Path,
        default=main_checkout() / ".venv-bento" / "bin" / "python",
        help="python of BentoML's venv (default: .venv-bento in the main checkout)",
    )
    parser.add_argument(
        "--max-latency-ms",
        type=int,
        default=1000,
        help="BentoML's max_latency_ms: the deadline past which its dispatcher answers 503",
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    versions = bentoml_versions(args.bentoml_python)
    if not shutil.which("wrk"):
        raise SystemExit("wrk not found: apt-get install wrk")
    model = model_path("heavy")
    expected = expected_answer(model)
    bodies = write_bodies(RESULTS / "bodies.txt")
    where = "behind deploy/nginx" if args.nginx else "direct"
    print(
        f"machine: {machine()}\n"
        f"bentoml {versions['bentoml']} (scikit-learn {versions['scikit-learn']}, numpy "
        f"{versions['numpy']}) from {args.bentoml_python}; ours: scikit-learn "
        f"{sklearn.__version__}, numpy {np.__version__}\n"
        f"model {model}; {WORKERS} workers each, each server in its own session, {where}; "
        f"BentoML max_batch_size {MAX_BATCH_SIZE}, max_latency_ms {args.max_latency_ms}",
        flush=True,
    )
    runs: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    names = ["service", "bentoml"]
    for round_ in range(1, args.rounds + 1):
        shift = (round_ - 1) % len(names)
        for name in names[shift:] + names[:shift]:
            server = start(name, args, model)
            try:
                verdict = check(server, name, expected)
                print(f"round {round_} {name:>7} answer checked: {verdict}", flush=True)
                checks.append({"round": round_, "server": name, "verdict": verdict})
                for connections in args.connections:
                    run = run_once(server, connections, args.duration, bodies)
                    run.update(round=round_, server=name, connections=connections)
                    runs.append(run)
                    print_run(run)
            finally:
                server.stop()
    print(f"\nmachine: {machine('at the end')}")
    print_summary(runs)
    latency_ms = args.max_latency_ms
    document = {
        "machine": machine("at the end"),
        "where": where,
        "bentoml": {**versions, "max_batch_size": MAX_BATCH_SIZE, "max_latency_ms": latency_ms},
        "checks": checks,
        "runs": runs,
    }
    (RESULTS / "bentoml_load.json").write_text(json.dumps(document, indent=1))


if __name__ == "__main__":
    main()
