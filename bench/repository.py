"""A model repository changing under load: 5 models, a client at 16 threads sending one
row at a time to all of them, while versions are published and rolled back (``poll``) or
models unloaded and loaded again by API (``explicit``).

    python bench/repository.py                        # poll: publish / roll back, ~3 min
    python bench/repository.py --control explicit     # unload / load by API
    python bench/repository.py --cycles 20 --settle-s 10
    python bench/repository.py --changed onnx --untouched onnx   # changes taken in place
    python bench/repository.py --changed-share off --untouched onnx   # joblib, in place

The server runs in its own session (2 workers, the demo model copied as each model's
version 1, as joblib or as ONNX: ``--changed`` for ``m0``..``m2``, ``--untouched`` for
the others; ``SERVING_REPOSITORY_POLL_S=0.5`` under ``poll``). A change of ONNX models
only is taken in place by the running workers; one of a joblib (shared) model rolls the
workers over, unless ``--changed-share off`` (``"share": "off"`` in those models'
config.json: each worker loads its own copy, and takes their changes in place). First
``--settle-s`` seconds of load alone (the "before" p99), then ``--cycles`` changes to the
models ``m0``..``m2`` in turn (``m3`` and ``m4`` never change):

- ``poll``: a version ``n+1`` published (copied beside the model under a hidden name,
  renamed into place), timed from the rename to the first answer naming it and to the
  end of the rollover, then removed, timed to the end of that rollover;
- ``explicit``: ``POST /v2/repository/models/<m>/unload`` then ``/load``, each timed to
  its answer.

Printed: the CPU model; requests sent and failed (any answer but 200 from a model that
was meant to serve; an unloaded model's 404s are counted apart); p50/p99 per model before,
during and after the changes (``--settle-s`` more of the same load once the last change
is over), the p99 during over before and over after; the CPUs each worker may run on
before and after (pinned while quiet, or not: it moves the p99); each change's time;
the server's PSS (master and workers, ``/proc/<pid>/smaps_rollup``) before the first
change and after the last; the workers forked and each untouched model's loads
(``serving_model_load_seconds_count``) over the whole run. Figures also go to
``bench/results/repository-<control>-<changed>-<untouched>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.host import cpu_model  # noqa: E402
from bench.http_load import free_port  # noqa: E402
from bench.models import RESULTS, real_rows  # noqa: E402
from bench.share_memory import children, pss_mib  # noqa: E402
from serving.settings import DEMO_MODEL_PATH  # noqa: E402

GUNICORN = Path(sys.executable).parent / "gunicorn"
MODELS = [f"m{i}" for i in range(5)]
CHANGED = MODELS[:3]
ROW = [float(v) for v in real_rows()[0]]
#: What each model's versions are copied from: a shared format, or one loaded per worker.
SOURCES = {"joblib": DEMO_MODEL_PATH, "onnx": DEMO_MODEL_PATH.with_suffix(".onnx")}


class Client:
    """16 threads, each sending one row to each model in turn; every answer kept as
    ``(monotonic time, model, status, seconds, version)``."""

    def __init__(self, url: str, threads: int) -> None:
        self.url, self.threads = url, threads
        self.answers: list[tuple[float, str, int, float, str]] = []
        self.stopped = threading.Event()
        self._lock = threading.Lock()
        self._workers = [threading.Thread(target=self._run, args=(i,)) for i in range(threads)]

    def start(self) -> None:
        for worker in self._workers:
            worker.start()

    def stop(self) -> None:
        self.stopped.set()
        for worker in self._workers:
            worker.join(60)

    def _run(self, offset: int) -> None:
        with requests.Session() as session:
            turn = offset
            while not self.stopped.is_set():
                model = MODELS[turn % len(MODELS)]
                turn += 1
                started = time.perf_counter()
                try:
                    answer = session.post(
                        f"{self.url}/predict/{model}", json={"instances": [ROW]}, timeout=30
                    )
                    status = answer.status_code
                    version = answer.json().get("model_version", "") if status == 200 else ""
                except requests.RequestException:
                    status, version = 0, ""
                seconds = time.perf_counter() - started
                with self._lock:
                    self.answers.append((time.monotonic(), model, status, seconds, version))

    def since(self, start: float, end: float) -> list[tuple[float, str, int, float, str]]:
        with self._lock:
            return [a for a in self.answers if start <= a[0] < end]


def server_pss(pid: int) -> float:
    return round(pss_mib(pid) + sum(pss_mib(child) for child in children(pid)), 1)


def until(check: Any, timeout_s: float = 120) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if check():
            return time.monotonic() - started
        time.sleep(0.02)
    raise TimeoutError("not within the time")


def settled(url: str, pid: int, workers: int = 2) -> bool:
    """Every worker ready and of one generation, no other left: the rollover over."""
    answer = requests.get(f"{url}/healthz", timeout=30)
    fleet = answer.json().get("workers", {})
    return answer.status_code == 200 and "rollout" not in fleet and len(children(pid)) == workers


def answers_version(url: str, model: str, version: str) -> bool:
    answer = requests.post(f"{url}/predict/{model}", json={"instances": [ROW]}, timeout=30)
    return answer.status_code == 200 and answer.json()["model_version"] == version


def percentiles(
    answers: list[tuple[float, str, int, float, str]], model: str
) -> tuple[float, float]:
    seconds = sorted(a[3] for a in answers if a[1] == model and a[2] == 200)
    if not seconds:
        return float("nan"), float("nan")
    p99 = seconds[min(len(seconds) - 1, int(len(seconds) * 0.99))]
    return statistics.median(seconds) * 1000, p99 * 1000


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--control", choices=["poll", "explicit"], default="poll")
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--settle-s", type=float, default=15.0)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--changed", choices=sorted(SOURCES), default="joblib")
    parser.add_argument("--untouched", choices=sorted(SOURCES), default="joblib")
    parser.add_argument(
        "--changed-share", choices=["auto", "off"], default="auto",
        help='the changed models\' "share" in their config.json (off: a joblib model is '
        "loaded by each worker, and its changes are taken in place)",
    )  # fmt: skip
    parser.add_argument(
        "--every-s", type=float, default=0.0,
        help="start a step (a publish, a removal; an unload, a load) every this many "
        "seconds at most, so runs whose changes take different times change as often "
        "(0: each step once the last is over)",
    )  # fmt: skip
    return parser.parse_args()


def repository(args: argparse.Namespace) -> Path:
    """A temporary folder holding version 1 of each model."""
    root = Path(tempfile.mkdtemp(prefix="serving-repository-"))
    for model in MODELS:
        (root / model / "1").mkdir(parents=True)
        source = SOURCES[args.changed if model in CHANGED else args.untouched]
        shutil.copy(source, root / model / "1" / source.name)
        if model in CHANGED and args.changed_share == "off":
            (root / model / "config.json").write_text(json.dumps({"share": "off"}))
    return root


def main() -> None:
    args = arguments()
    RESULTS.mkdir(parents=True, exist_ok=True)
    print(
        f"CPU: {cpu_model()}; control {args.control}, 2 workers, {args.threads} threads; "
        f"changed models {args.changed} (share {args.changed_share}), untouched "
        f"{args.untouched}"
    )

    root = repository(args)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "SERVING_BIND": f"127.0.0.1:{port}",
        "SERVING_WORKERS": "2",
        "SERVING_MODEL_REPOSITORY": str(root),
        "SERVING_MODEL_CONTROL": args.control,
        "SERVING_ACCESS_LOG": "false",
        "SERVING_METRICS_DIR": tempfile.mkdtemp(),
        **({"SERVING_REPOSITORY_POLL_S": "0.5"} if args.control == "poll" else {}),
    }
    log_path = RESULTS / f"repository-{args.control}.log"
    log = log_path.open("wb")
    command = [str(GUNICORN), "wsgi:app", "-c", "gunicorn.conf.py", "--no-control-socket"]
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True
    )
    client = Client(url, args.threads)
    try:
        until(lambda: _ready(url), 120)
        client.start()
        started = time.monotonic()
        time.sleep(args.settle_s)
        quiet = time.monotonic()
        pss_before = server_pss(proc.pid)
        pinned = {"before": cpus_of_workers(proc.pid)}
        times: list[tuple[str, str, float]] = []
        pace = Pace(args.every_s)
        for cycle in range(args.cycles):
            model = CHANGED[cycle % len(CHANGED)]
            source = SOURCES[args.changed]
            times.extend(_change(
                args.control, url, root, model, source, cycle=cycle, pid=proc.pid, pace=pace
            ))  # fmt: skip
        changed = time.monotonic()
        until(lambda: settled(url, proc.pid))
        pss_after = server_pss(proc.pid)
        settled_at = time.monotonic()
        time.sleep(args.settle_s)  # the same load again, once every change is over
        ended = time.monotonic()
        pinned["after"] = cpus_of_workers(proc.pid)
        loads = untouched_loads(url)
    finally:
        client.stop()
        proc.terminate()
        proc.wait(60)
        shutil.rmtree(root, ignore_errors=True)

    before, during = client.since(started, quiet), client.since(quiet, changed)
    after = client.since(settled_at, ended)
    forked = log_path.read_text(errors="replace").count("Booting worker")
    report = _report(
        args, before=before, during=during, after=after, times=times,
        pss_before=pss_before, pss_after=pss_after, pinned=pinned,
    )  # fmt: skip
    print(f"  workers forked: {forked} (2 at start); untouched models' loads: {loads}")
    report |= {"workers_forked": forked, "untouched_loads": loads}
    name = f"repository-{args.control}-{args.changed}-{args.changed_share}-{args.untouched}.json"
    (RESULTS / name).write_text(json.dumps(report, indent=2))


class Pace:
    """Each call returns at the next tick of ``every_s`` seconds (at once when 0, or
    when the last step took longer)."""

    def __init__(self, every_s: float) -> None:
        self.every_s, self.next = every_s, time.monotonic()

    def __call__(self) -> None:
        time.sleep(max(0.0, self.next - time.monotonic()))
        self.next = max(self.next, time.monotonic() - self.every_s) + self.every_s


def untouched_loads(url: str) -> dict[str, float]:
    """Each untouched model's loads by the live and dead workers, from /metrics."""
    counts = dict.fromkeys(MODELS[len(CHANGED) :], 0.0)
    for line in requests.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("serving_model_load_seconds_count{"):
            for model in counts:
                if f'model="{model}"' in line:
                    counts[model] += float(line.rsplit(" ", 1)[1])
    return counts


def cpus_of_workers(pid: int) -> list[str]:
    """Each worker's CPUs (``Cpus_allowed_list``): pinned (``0``) or not (``0-1``)."""
    found = []
    for child in children(pid):
        for line in Path(f"/proc/{child}/status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                found.append(line.split()[1])
    return sorted(found)


def _ready(url: str) -> bool:
    try:
        return requests.get(f"{url}/healthz", timeout=5).status_code == 200
    except requests.RequestException:
        return False


def _change(
    control: str,
    url: str,
    root: Path,
    model: str,
    source: Path,
    *,
    cycle: int,
    pid: int,
    pace: Pace,
) -> list[tuple[str, str, float]]:
    """One change of ``model`` and back, each step after the last rollover is over;
    each step's name, model and seconds."""
    until(lambda: settled(url, pid))
    if control == "poll":
        version = str(cycle + 2)
        staging = root / model / f".{version}"
        staging.mkdir()
        shutil.copy(source, staging / source.name)
        pace()
        started = time.monotonic()
        staging.rename(root / model / version)
        first = until(lambda: answers_version(url, model, version))
        until(lambda: settled(url, pid))
        whole = time.monotonic() - started
        pace()
        started = time.monotonic()
        shutil.rmtree(root / model / version)
        until(lambda: answers_version(url, model, "1") and settled(url, pid))
        back = time.monotonic() - started
        return [
            ("publish: first answer", model, first),
            ("publish: every worker", model, whole),
            ("roll back: every worker", model, back),
        ]
    steps = []
    for step in ("unload", "load"):
        pace()
        started = time.monotonic()
        answer = requests.post(f"{url}/v2/repository/models/{model}/{step}", timeout=600)
        assert answer.status_code == 200, answer.text
        steps.append((step, model, time.monotonic() - started))
    return steps


def _report(
    args: argparse.Namespace,
    *,
    before: list[tuple[float, str, int, float, str]],
    during: list[tuple[float, str, int, float, str]],
    after: list[tuple[float, str, int, float, str]],
    times: list[tuple[str, str, float]],
    pss_before: float,
    pss_after: float,
    pinned: dict[str, list[str]],
) -> dict[str, Any]:
    unloading = args.control == "explicit"
    failed = [a for a in during + before + after if a[2] != 200 and not (unloading and a[2] == 404)]
    not_served = sum(1 for a in during if unloading and a[2] == 404)
    print(
        f"requests: {len(before) + len(during) + len(after)} sent, {len(failed)} failed"
        + (f", {not_served} answered 404 while their model was unloaded" if unloading else "")
    )
    rows = {}
    for model in MODELS:
        p50b, p99b = percentiles(before, model)
        p50d, p99d = percentiles(during, model)
        p50a, p99a = percentiles(after, model)
        rows[model] = {
            "p50_before_ms": p50b,
            "p99_before_ms": p99b,
            "p50_during_ms": p50d,
            "p99_during_ms": p99d,
            "p50_after_ms": p50a,
            "p99_after_ms": p99a,
        }
        kind = "changed" if model in CHANGED else "untouched"
        print(
            f"  {model} ({kind:9}): p50 {p50b:6.1f} -> {p50d:6.1f} -> {p50a:6.1f} ms, "
            f"p99 {p99b:6.1f} -> {p99d:6.1f} -> {p99a:6.1f} ms (during: {p99d / p99b:4.2f}x "
            f"before, {p99d / p99a:4.2f}x after)"
        )
    for step in sorted({s for s, _, _ in times}):
        seconds = [t for s, _, t in times if s == step]
        print(
            f"  {step:9}: median {statistics.median(seconds):5.2f} s, "
            f"max {max(seconds):5.2f} s over {len(seconds)}"
        )
    print(
        f"  PSS: {pss_before} MiB before the first change, {pss_after} MiB after the last "
        f"({args.cycles} cycles)"
    )
    print(f"  workers' CPUs: before {pinned['before']}, after {pinned.get('after')}")
    return {
        "cpu": cpu_model(),
        "control": args.control,
        "cycles": args.cycles,
        "sent": len(before) + len(during) + len(after),
        "workers_cpus": pinned,
        "failed": len(failed),
        "failed_statuses": sorted({a[2] for a in failed}),
        "models": rows,
        "times": times,
        "pss_before_mib": pss_before,
        "pss_after_mib": pss_after,
    }


if __name__ == "__main__":
    main()
