"""Explicit model control (``SERVING_MODEL_CONTROL=explicit``) under the real Gunicorn,
driven by tritonclient's ``load_model``, ``unload_model`` and
``get_model_repository_index``: each call answers once every worker serves what it
asked, the answers equal the files loaded in-process, a model that cannot load is
answered with why while the rest serve on, and the other modes refuse the calls."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import pytest
import requests
import tritonclient.http as triton
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from tritonclient.utils import InferenceServerException

from serving.settings import DEMO_MODEL_PATH
from tests.e2e.server import GunicornServer


def repository(root: Path, X: np.ndarray, y: np.ndarray) -> dict[tuple[str, str], Path]:
    """churn/1 (the demo); cancer/1 (the demo) and cancer/2 (another fit)."""
    files = {}
    for model, number in (("churn", "1"), ("cancer", "1")):
        (root / model / number).mkdir(parents=True)
        files[model, number] = shutil.copy(DEMO_MODEL_PATH, root / model / number / "m.joblib")
    (root / "cancer" / "2").mkdir()
    files["cancer", "2"] = root / "cancer" / "2" / "model.joblib"
    joblib.dump(make_pipeline(StandardScaler(), LogisticRegression(C=0.002)).fit(X, y),
                files["cancer", "2"])  # fmt: skip
    return files


def infer(
    client: triton.InferenceServerClient, name: str, rows: np.ndarray, version: str = ""
) -> Any:
    answer = client.infer(name, [_tensor(rows)], model_version=version)
    return answer.as_numpy("predictions").tolist(), answer.get_response()["model_version"]


def states(client: triton.InferenceServerClient) -> dict[tuple[str, str], tuple[str, str]]:
    return {
        (e["name"], e.get("version", "")): (e["state"], e.get("reason", ""))
        for e in client.get_model_repository_index()
    }


class Sender(threading.Thread):
    """Sends to model ``churn`` until stopped; counts the answers that were not 200."""

    def __init__(self, url: str, rows: list[list[float]]) -> None:
        super().__init__(daemon=True)
        self.url, self.rows = url, rows
        self.stopped = threading.Event()
        self.sent, self.failed = 0, []

    def run(self) -> None:
        with requests.Session() as session:
            while not self.stopped.is_set():
                try:
                    answer = session.post(
                        f"{self.url}/predict/churn", json={"instances": self.rows}, timeout=30
                    )
                    status = answer.status_code
                except requests.RequestException as exc:
                    status = repr(exc)
                self.sent += 1
                if status != 200:
                    self.failed.append(status)


@pytest.mark.usefixtures("cpu_hog")  # a lifecycle: on a busy machine, as production is
def test_explicit_control_loads_and_unloads_through_tritonclient_while_others_serve_on(
    tmp_path: Path, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    X, y = breast_cancer
    root = tmp_path / "models"
    files = repository(root, X, y)
    expect = {key: joblib.load(path).predict(X[:20]).tolist() for key, path in files.items()}
    assert expect["cancer", "1"] != expect["cancer", "2"]
    server = GunicornServer(tmp_path, model_repository=root, model_control="explicit")
    server.start()
    sender = Sender(server.url, X[:3].tolist())
    client = triton.InferenceServerClient(url=f"127.0.0.1:{server.port}", network_timeout=120)
    try:
        server.wait_ready()
        at_start = states(client)
        sender.start()

        client.unload_model("cancer")
        unloaded = states(client)
        gone = requests.post(f"{server.url}/v2/models/cancer/infer", json={}, timeout=30)

        client.load_model("cancer", config=json.dumps({"version_policy": {"all": {}}}))
        both = states(client)
        cancer_2 = infer(client, "cancer", X[:20])
        cancer_1 = infer(client, "cancer", X[:20], version="1")
        again = requests.post(f"{server.url}/v2/repository/models/churn/load", timeout=120)
        churn = infer(client, "churn", X[:20])
    finally:
        client.close()
        sender.stopped.set()
        sender.join(60)
        server.kill()

    assert at_start[("churn", "1")] == at_start[("cancer", "2")] == ("READY", "")
    assert unloaded[("cancer", "")] == ("UNAVAILABLE", "unloaded")
    assert ("cancer", "2") not in unloaded
    assert gone.status_code == 404 and gone.json()["code"] == "model_not_found"
    assert both[("cancer", "1")] == both[("cancer", "2")] == ("READY", "")
    assert cancer_2 == (expect["cancer", "2"], "2")
    assert cancer_1 == (expect["cancer", "1"], "1")
    assert (again.status_code, again.content) == (200, b"")  # churn read again
    assert again.headers["Connection"] == "close"  # its next request: a worker serving it
    assert churn == (expect["churn", "1"], "1")
    assert sender.sent > 20 and sender.failed == []  # churn served throughout, unchanged


@pytest.mark.usefixtures("cpu_hog")
def test_explicit_control_a_failed_load_is_answered_with_why_and_undone(
    tmp_path: Path, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    X, _ = breast_cancer
    root = tmp_path / "models"
    for model in ("churn", "cancer"):
        (root / model / "1").mkdir(parents=True)
        shutil.copy(DEMO_MODEL_PATH, root / model / "1" / "m.joblib")
    server = GunicornServer(tmp_path, model_repository=root, model_control="explicit")
    server.start()
    client = triton.InferenceServerClient(url=f"127.0.0.1:{server.port}", network_timeout=120)
    try:
        server.wait_ready()
        (root / "broken" / "1").mkdir(parents=True)  # found, but its load fails
        (root / "broken" / "1" / "m.joblib").write_bytes(DEMO_MODEL_PATH.read_bytes()[:500])
        with pytest.raises(InferenceServerException) as failed:
            client.load_model("broken")
        after_failure = states(client)
        server.wait_ready(timeout_s=120)  # the failed load undone: ready again
        with pytest.raises(InferenceServerException) as missing:
            client.load_model("nope")
        client.unload_model("cancer")
        with pytest.raises(InferenceServerException) as last:
            client.unload_model("churn")
        churn = infer(client, "churn", X[:20])
    finally:
        client.close()
        server.kill()

    assert failed.value.status() == "400"
    assert "broken" in str(failed.value) and "serving on as before" in str(failed.value)
    assert "m.joblib" in str(failed.value)  # which file, and why
    assert after_failure[("broken", "")] == ("UNAVAILABLE", "unloaded")
    assert after_failure[("churn", "1")] == after_failure[("cancer", "1")] == ("READY", "")
    assert "the model repository has no model 'nope'" in str(missing.value)
    assert "last model served" in str(last.value)
    assert churn == (joblib.load(DEMO_MODEL_PATH).predict(X[:20]).tolist(), "1")


def _tensor(rows: np.ndarray) -> triton.InferInput:
    tensor = triton.InferInput("input-0", list(rows.shape), "FP64")
    tensor.set_data_from_numpy(rows)
    return tensor


def test_load_and_unload_need_explicit_control_and_a_key(tmp_path: Path) -> None:
    root = tmp_path / "models"
    (root / "churn" / "1").mkdir(parents=True)
    shutil.copy(DEMO_MODEL_PATH, root / "churn" / "1" / "m.joblib")
    server = GunicornServer(
        tmp_path, model_repository=root, api_keys="key-0123456789abcdef", workers=1
    )
    server.start()
    try:
        server.wait_ready(workers=1)
        url = f"{server.url}/v2/repository/models/churn"
        keyless = requests.post(f"{url}/load", timeout=30)
        polled = requests.post(
            f"{url}/load", headers={"X-API-Key": "key-0123456789abcdef"}, timeout=30
        )
        unload = requests.post(
            f"{url}/unload", headers={"X-API-Key": "key-0123456789abcdef"}, json={}, timeout=30
        )
    finally:
        server.kill()

    assert keyless.status_code == 401
    assert (polled.status_code, polled.json()["code"]) == (409, "control_refused")
    assert "SERVING_MODEL_CONTROL=explicit" in polled.json()["error"]
    assert (unload.status_code, unload.json()["code"]) == (409, "control_refused")
