"""A repository change that only models loaded in each worker take (ONNX here) is taken
in place by the running workers under the real Gunicorn: no worker is forked, the
models that did not change are not loaded again (their loads counted in
``serving_model_load_seconds_count``), the new version answers as onnxruntime does on
the same rows in-process, no request fails, and a version that cannot load is left out
while the one before serves on. A change of a shared (joblib) model still rolls the
workers over."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import requests
from skl2onnx import to_onnx
from sklearn.linear_model import LogisticRegression

from serving.settings import DEMO_MODEL_PATH
from tests.e2e.server import GunicornServer
from tests.e2e.test_repository import until

MODELS = ("fixed", "shared", "moving")
DEMO_ONNX_PATH = DEMO_MODEL_PATH.with_suffix(".onnx")


def build(root: Path) -> Path:
    """fixed/1 and moving/1: the demo ONNX model; shared/1: the demo joblib model."""
    for model, source in (
        ("fixed", DEMO_ONNX_PATH), ("moving", DEMO_ONNX_PATH), ("shared", DEMO_MODEL_PATH)
    ):  # fmt: skip
        (root / model / "1").mkdir(parents=True)
        shutil.copy(source, root / model / "1" / source.name)
    return root


def publish(root: Path, model: str, version: str, data: bytes, name: str = "m.onnx") -> None:
    """Copy beside the model under a hidden name, then rename into place."""
    hidden = root / model / f".{version}.partial"
    hidden.mkdir()
    (hidden / name).write_bytes(data)
    os.rename(hidden, root / model / version)


def other_onnx(X: np.ndarray, y: np.ndarray) -> bytes:
    """Another fit of the breast cancer rows as ONNX (some answers differ from the demo)."""
    model = LogisticRegression(C=0.002, max_iter=2000).fit(X, y)
    graph = to_onnx(model, X[:1].astype(np.float32), options={"zipmap": False})
    return bytes(graph.SerializeToString())


def in_process(data: bytes, rows: np.ndarray) -> list[np.ndarray]:
    """The ONNX model ``data`` run by onnxruntime in this process: its labels and
    probabilities for ``rows`` (float32, as the graph's input)."""
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return list(session.run(None, {session.get_inputs()[0].name: rows.astype(np.float32)}))


class Client:
    """Threads sending 3 rows to each model in turn until stopped; every status kept."""

    def __init__(self, url: str, rows: list[list[float]], threads: int = 4) -> None:
        self.url, self.rows = url, rows
        self.statuses: Counter[tuple[str, int]] = Counter()
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self._run) for _ in range(threads)]

    def __enter__(self) -> Client:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join(30)

    def _run(self) -> None:
        with requests.Session() as session:
            while not self.stopped.is_set():
                for model in MODELS:
                    answer = session.post(
                        f"{self.url}/predict/{model}", json={"instances": self.rows}, timeout=30
                    )
                    self.statuses[model, answer.status_code] += 1


def version_of(server: GunicornServer, model: str, rows: np.ndarray) -> str:
    answer = requests.post(
        f"{server.url}/predict/{model}", json={"instances": rows.tolist()}, timeout=30
    )
    assert answer.status_code == 200, answer.text
    return str(answer.json()["model_version"])


def loads(server: GunicornServer, model: str, version: str = "1") -> float:
    return server.metric(f'serving_model_load_seconds_count{{model="{model}",version="{version}"}}')


def unloads(server: GunicornServer, model: str, version: str) -> float:
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    name = f'serving_model_unloads_total{{model="{model}",version="{version}"}}'
    return server.metric(name, text) if name in text else 0.0


def settled(server: GunicornServer) -> bool:
    body = requests.get(f"{server.url}/healthz", timeout=10).json()
    return body.get("status") == "ready" and "rollout" not in body.get("workers", {})


@pytest.mark.usefixtures("cpu_hog")  # a lifecycle: on a busy machine, as production is
def test_repository_in_place_an_onnx_version_published_and_removed_reloads_nothing_else(
    tmp_path: Path, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    X, y = breast_cancer
    root = build(tmp_path / "models")
    data = other_onnx(X, y)
    labels, probabilities = in_process(data, X[:5])
    server = GunicornServer(tmp_path, model_repository=root, repository_poll_s=0.5)
    server.start()
    try:
        server.wait_ready()
        pids = sorted(server.worker_pids())
        before = {model: loads(server, model) for model in MODELS}
        with Client(server.url, X[:3].tolist()) as client:
            publish(root, "moving", "2", data)
            until(lambda: [version_of(server, "moving", X[:3]) for _ in range(10)] == ["2"] * 10)
            until(lambda: settled(server))
            answer = requests.post(
                f"{server.url}/predict/moving", json={"instances": X[:5].tolist()}, timeout=30
            ).json()
            pids_published = sorted(server.worker_pids())
            after = {model: loads(server, model) for model in MODELS}
            loaded = loads(server, "moving", "2")
            shutil.rmtree(root / "moving" / "2")
            until(lambda: [version_of(server, "moving", X[:3]) for _ in range(10)] == ["1"] * 10)
            until(lambda: unloads(server, "moving", "2"))
            pids_removed = sorted(server.worker_pids())
            untouched = {model: loads(server, model) for model in MODELS}
        # A change of the shared joblib model rolls the workers over, as before.
        publish(root, "shared", "2", DEMO_MODEL_PATH.read_bytes(), DEMO_MODEL_PATH.name)
        until(lambda: version_of(server, "shared", X[:3]) == "2")
        until(lambda: set(server.worker_pids()).isdisjoint(pids))
        log = server.output()
    finally:
        server.kill()

    assert before == {"fixed": 2, "shared": 2, "moving": 2}
    assert pids_published == pids_removed == pids, log  # no worker forked
    assert after == before  # the others not loaded again
    # moving/1, dropped for version 2 (the policy serves the latest), is loaded again
    assert untouched == {"fixed": 2, "shared": 2, "moving": 4}
    assert loaded == 2  # the new version, once in each worker
    assert answer["model_version"] == "2"
    assert answer["predictions"] == labels.tolist()
    np.testing.assert_allclose(answer["probabilities"], probabilities, rtol=1e-6)
    assert set(client.statuses) == {(model, 200) for model in MODELS}, client.statuses
    assert log.count("taken in place by the running workers") == 2, log
    assert (
        "the change rolls the workers over (loads shared/2, drops shared/1: loaded once in "
        "the master and shared)"
    ) in log


@pytest.mark.usefixtures("cpu_hog")
def test_repository_in_place_a_joblib_model_not_shared_takes_its_change_in_place(
    tmp_path: Path, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    """Issue 32 item 5, where "one copy per host" and "only what changed" conflict: a
    joblib model with ``"share": "off"`` in its config.json is loaded by each worker, and a
    version published is taken in place (no worker forked, the ONNX models not loaded
    again), answering as the new file does in-process."""
    import json

    import joblib
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = breast_cancer
    root = build(tmp_path / "models")
    (root / "shared" / "config.json").write_text(json.dumps({"share": "off"}))
    published = make_pipeline(StandardScaler(), LogisticRegression(C=0.002)).fit(X, y)
    joblib.dump(published, tmp_path / "new.joblib")
    server = GunicornServer(tmp_path, model_repository=root, repository_poll_s=0.5)
    server.start()
    try:
        server.wait_ready()
        pids = sorted(server.worker_pids())
        with Client(server.url, X[:3].tolist()) as client:
            publish(root, "shared", "2", (tmp_path / "new.joblib").read_bytes(), "m.joblib")
            until(lambda: [version_of(server, "shared", X[:3]) for _ in range(10)] == ["2"] * 10)
            until(lambda: settled(server))
        answer = requests.post(
            f"{server.url}/predict/shared", json={"instances": X[:5].tolist()}, timeout=30
        ).json()
        after = sorted(server.worker_pids())
        onnx_loads = {model: loads(server, model) for model in ("fixed", "moving")}
        log = server.output()
    finally:
        server.kill()

    assert after == pids, log  # no worker forked
    assert onnx_loads == {"fixed": 2, "moving": 2}  # not loaded again
    assert answer["model_version"] == "2"
    assert answer["probabilities"] == published.predict_proba(X[:5]).tolist()
    assert set(client.statuses) == {(model, 200) for model in MODELS}, client.statuses
    assert "'shared' version '1' per worker (share: off)" in log
    assert "taken in place by the running workers" in log, log


@pytest.mark.usefixtures("cpu_hog")
def test_repository_in_place_a_version_that_cannot_load_is_left_out_the_one_before_serves(
    tmp_path: Path, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    X, y = breast_cancer
    root = build(tmp_path / "models")
    server = GunicornServer(tmp_path, model_repository=root, repository_poll_s=0.5)
    server.start()
    try:
        server.wait_ready()
        pids = sorted(server.worker_pids())
        with Client(server.url, X[:3].tolist()) as client:
            publish(root, "moving", "2", other_onnx(X, y)[:200])  # cut short
            server.wait_for_log("moving/2 left out until its files change", 1)
            until(lambda: settled(server))
            index = requests.post(f"{server.url}/v2/repository/index", json={}, timeout=10).json()
            version = version_of(server, "moving", X[:3])
        after = sorted(server.worker_pids())
        log = server.output()
    finally:
        server.kill()

    assert after == pids, log
    assert version == "1"
    left_out = [e for e in index if (e["name"], e["version"]) == ("moving", "2")]
    assert [e["state"] for e in left_out] == ["UNAVAILABLE"], index
    assert "a worker could not load it" in left_out[0]["reason"], left_out
    assert set(client.statuses) == {(model, 200) for model in MODELS}, client.statuses


@pytest.mark.usefixtures("cpu_hog")
def test_repository_in_place_explicit_load_and_unload_calls_fork_no_worker(
    tmp_path: Path, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    import tritonclient.http as triton
    from tritonclient.utils import InferenceServerException

    X, y = breast_cancer
    root = build(tmp_path / "models")
    data = other_onnx(X, y)
    labels, _ = in_process(data, X[:20])
    server = GunicornServer(tmp_path, model_repository=root, model_control="explicit")
    server.start()
    client = triton.InferenceServerClient(url=f"127.0.0.1:{server.port}", network_timeout=120)
    try:
        server.wait_ready()
        pids = sorted(server.worker_pids())
        with Client(server.url, X[:3].tolist()) as client_load:
            client_load.statuses.clear()
            client.unload_model("moving")
            gone = requests.post(f"{server.url}/predict/moving", json={"instances": [[0] * 30]})
            publish(root, "moving", "2", data)
            client.load_model("moving", config='{"version_policy": {"all": {}}}')
            two = version_of(server, "moving", X[:3])
            answer = requests.post(
                f"{server.url}/predict/moving", json={"instances": X[:20].tolist()}, timeout=30
            ).json()
            publish(root, "moving", "3", data[:300])  # cut short
            with pytest.raises(InferenceServerException) as failed:
                client.load_model("moving")
            after_failure = version_of(server, "moving", X[:3])
            fixed_loads = loads(server, "fixed")
        after = sorted(server.worker_pids())
        log = server.output()
    finally:
        client.close()
        server.kill()

    assert after == pids, log  # no worker forked by any call
    assert gone.status_code == 404
    assert two == "2" and answer["predictions"] == labels.tolist()
    assert "moving/3" in str(failed.value) and after_failure == "2"
    assert fixed_loads == 2
    statuses = {key for key in client_load.statuses if key[0] != "moving"}
    assert statuses == {("fixed", 200), ("shared", 200)}, client_load.statuses
    assert log.count("taken in place by the running workers") >= 4, log


@pytest.mark.usefixtures("cpu_hog")
def test_repository_in_place_a_worker_forked_after_the_change_serves_it(
    tmp_path: Path, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    """A worker forked after a change in place (one killed, replaced) serves what the
    running ones took, not what gunicorn.conf.py read at start."""
    import signal

    X, y = breast_cancer
    root = build(tmp_path / "models")
    server = GunicornServer(tmp_path, model_repository=root, repository_poll_s=0.5)
    server.start()
    try:
        server.wait_ready()
        publish(root, "moving", "2", other_onnx(X, y))
        until(lambda: [version_of(server, "moving", X[:3]) for _ in range(10)] == ["2"] * 10)
        until(lambda: settled(server))
        killed = server.worker_pids()[0]
        os.kill(killed, signal.SIGKILL)
        server.wait_replaced(killed)
        until(lambda: settled(server))
        versions = {version_of(server, "moving", X[:3]) for _ in range(20)}
        index = requests.post(f"{server.url}/v2/repository/index", json={}, timeout=10).json()
    finally:
        server.kill()

    assert versions == {"2"}
    assert {(e["name"], e["version"], e["state"]) for e in index} == {
        ("fixed", "1", "READY"), ("shared", "1", "READY"), ("moving", "2", "READY"),
        ("moving", "1", "UNAVAILABLE"),  # passed over by its policy
    }  # fmt: skip


@pytest.mark.usefixtures("cpu_hog")
def test_repository_in_place_a_label_moved_forks_no_worker_and_loads_nothing(
    tmp_path: Path,
) -> None:
    """Issue 32 item 5: a label move goes only to a version already serving: the shared
    (joblib) model's versions both serve, and moving its label reloads neither."""
    import json

    root = build(tmp_path / "models")
    shutil.copytree(root / "shared" / "1", root / "shared" / "2")
    policy = {"version_policy": {"all": {}}}
    config = root / "shared" / "config.json"
    config.write_text(json.dumps(policy | {"labels": {"stable": 1}}))
    server = GunicornServer(tmp_path, model_repository=root, repository_poll_s=0.5)
    server.start()

    def stable() -> str:  # the version the label names, as every worker answers
        answer = requests.get(f"{server.url}/v1/models/shared/labels/stable", timeout=10)
        assert answer.status_code == 200, answer.text
        return str(answer.json()["model_version_status"][0]["version"])

    try:
        server.wait_ready()
        pids = sorted(server.worker_pids())
        loads_before = loads(server, "shared", "2")
        assert stable() == "1"
        config.write_text(json.dumps(policy | {"labels": {"stable": 2}}))
        server.wait_for_log("taken in place by the running workers", 1)
        until(lambda: {stable() for _ in range(20)} == {"2"})
        until(lambda: settled(server))
        after = sorted(server.worker_pids())
        loads_after = loads(server, "shared", "2")
        log = server.output()
    finally:
        server.kill()

    assert after == pids, log
    assert loads_after == loads_before == 2


@pytest.mark.usefixtures("cpu_hog")
def test_repository_in_place_a_worker_leaving_while_it_loads_a_change_leaves_it_to_the_next(
    tmp_path: Path, pickled: Callable[[Any, str], Path]
) -> None:
    """Found by the attack: a worker that left (SIGTERM, a recycle) while it loaded a
    change in place was taken for one that died loading it: the good version was left
    out until its files changed."""
    import signal

    from tests.models import SlowLoading

    root = tmp_path / "models"
    (root / "slow" / "1").mkdir(parents=True)
    shutil.copy(pickled(SlowLoading(n_features=30, load_s=0.0), "v1.pkl"), root / "slow" / "1")
    slow = pickled(SlowLoading(n_features=30, load_s=3.0), "v2.pkl")
    server = GunicornServer(
        tmp_path, model_repository=root, repository_poll_s=0.5, share_model="off"
    )
    server.start()
    try:
        server.wait_ready()
        publish(root, "slow", "2", slow.read_bytes(), "m.pkl")
        server.wait_for_log("changing in place (generation 1)", 1, timeout_s=60)
        first = int(server.output().split("changing in place (generation 1)")[0].rsplit(
            "worker ", 1)[1].split(":")[0])  # fmt: skip
        time.sleep(1.0)  # a second into its 3 s load
        os.kill(first, signal.SIGTERM)
        until(lambda: {version_of(server, "slow", np.zeros((1, 30))) for _ in range(10)}
              == {"2"}, 60)  # fmt: skip
        until(lambda: settled(server))
        log = server.output()
    finally:
        server.kill()

    assert "left out" not in log, log
    assert "died while loading" not in log, log


@pytest.mark.usefixtures("cpu_hog")
def test_repository_in_place_load_calls_at_once_fork_no_worker(tmp_path: Path) -> None:
    """Found by the attack: six load calls at once rolled every worker over (the second
    reload found no mark of its call: the first had applied both)."""
    from concurrent.futures import ThreadPoolExecutor

    root = build(tmp_path / "models")
    for model in ("a", "b", "c", "d"):
        (root / model / "1").mkdir(parents=True)
        shutil.copy(DEMO_ONNX_PATH, root / model / "1" / DEMO_ONNX_PATH.name)
    server = GunicornServer(tmp_path, model_repository=root, model_control="explicit")
    server.start()
    url = f"{server.url}/v2/repository/models"
    try:
        server.wait_ready()
        pids = sorted(server.worker_pids())
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(
                lambda model: requests.post(f"{url}/{model}/load", timeout=120).status_code,
                ["a", "b", "c", "d", "fixed", "moving"],
            ))  # fmt: skip
        after = sorted(server.worker_pids())
        log = server.output()
    finally:
        server.kill()

    assert answers == [200] * 6, log
    assert after == pids, log
    assert "rolls the workers over" not in log and log.count("Booting worker") == 2
