"""A model repository folder (``SERVING_MODEL_REPOSITORY``) under the real Gunicorn: each
model's chosen versions answer on every protocol exactly as the same file loaded
in-process, the broken entries are named in the log and in the V2 repository index
(tritonclient's ``get_model_repository_index``), and the rest serve."""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import time
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

from serving.settings import DEMO_MODEL_PATH
from tests.e2e.server import GunicornServer


def build(root: Path, X: np.ndarray, y: np.ndarray) -> dict[tuple[str, str], Path]:
    """cancer/1 (the demo) and cancer/2 (another fit: some answers differ), served by
    the policy "all" with labels; churn/3 (the demo), churn/4 broken (two files)."""
    files = {}
    for model, number in (("cancer", "1"), ("churn", "3"), ("churn", "4")):
        (root / model / number).mkdir(parents=True)
        files[model, number] = shutil.copy(DEMO_MODEL_PATH, root / model / number / "m.joblib")
    (root / "cancer" / "2").mkdir()
    other = make_pipeline(StandardScaler(), LogisticRegression(C=0.002)).fit(X, y)
    files["cancer", "2"] = root / "cancer" / "2" / "model.joblib"
    joblib.dump(other, files["cancer", "2"])
    shutil.copy(DEMO_MODEL_PATH, root / "churn" / "4" / "second.joblib")
    (root / "cancer" / "config.json").write_text(json.dumps(
        {"version_policy": {"all": {}}, "labels": {"stable": 1, "canary": 2}}
    ))  # fmt: skip
    (root / "bad name").mkdir()
    return files


def one_version(root: Path) -> Path:
    """``root`` holding model churn, version 1: the demo model."""
    (root / "churn" / "1").mkdir(parents=True)
    shutil.copy(DEMO_MODEL_PATH, root / "churn" / "1" / "m.joblib")
    return root


def test_repository_serves_each_version_on_every_protocol_and_names_what_it_cannot(
    tmp_path: Path, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    X, y = breast_cancer
    root = tmp_path / "models"
    files = build(root, X, y)
    expect = {key: joblib.load(path) for key, path in files.items()}
    rows = X[:40]
    assert (expect["cancer", "1"].predict(rows) != expect["cancer", "2"].predict(rows)).any()
    server = GunicornServer(tmp_path, model_repository=root)
    server.start()
    try:
        server.wait_ready()
        url = server.url
        answers = {
            "predict/cancer": requests.post(
                f"{url}/predict/cancer", json={"instances": rows.tolist()}, timeout=30
            ),
            "predict/cancer/1": requests.post(
                f"{url}/predict/cancer",
                json={"instances": rows.tolist(), "model_version": "1"}, timeout=30,
            ),
            "predict": server.predict(rows.tolist()),
            "tf stable": requests.post(
                f"{url}/v1/models/cancer/labels/stable:predict",
                json={"instances": rows.tolist()}, timeout=30,
            ),
            "tf canary": requests.post(
                f"{url}/v1/models/cancer/labels/canary:predict",
                json={"instances": rows.tolist()}, timeout=30,
            ),
            "invocations": requests.post(
                f"{url}/invocations", json={"inputs": rows.tolist()}, timeout=30
            ),
        }  # fmt: skip
        client = triton.InferenceServerClient(url=f"127.0.0.1:{server.port}", network_timeout=30)
        tensor = triton.InferInput("input-0", list(rows.shape), "FP64")
        tensor.set_data_from_numpy(rows)
        churn = client.infer("churn", [tensor], model_version="3").as_numpy("predictions")
        index = client.get_model_repository_index()
        metadata = client.get_model_metadata("cancer")
        server.wait_for_log("model repository:", 2)
        log = server.output()
    finally:
        server.kill()

    assert {name: a.status_code for name, a in answers.items()} == dict.fromkeys(answers, 200)
    newest, first = expect["cancer", "2"].predict(rows), expect["cancer", "1"].predict(rows)
    assert answers["predict/cancer"].json()["predictions"] == newest.tolist()  # the newest
    assert answers["predict/cancer"].json()["probabilities"] == (
        expect["cancer", "2"].predict_proba(rows).tolist()
    )
    assert answers["predict/cancer/1"].json()["predictions"] == first.tolist()
    assert answers["predict"].json()["predictions"] == newest.tolist()  # first model: cancer
    # TF Serving's row format: one object per instance
    assert [p["predictions"] for p in answers["tf stable"].json()["predictions"]] == (
        first.tolist()
    )
    assert [p["predictions"] for p in answers["tf canary"].json()["predictions"]] == (
        newest.tolist()
    )
    assert answers["invocations"].json()["predictions"] == newest.tolist()
    assert churn.tolist() == expect["churn", "3"].predict(rows).tolist()
    assert sorted(metadata["versions"]) == ["1", "2"]
    states = {(e["name"], e.get("version", "")): (e["state"], e.get("reason", "")) for e in index}
    assert states["cancer", "2"] == states["cancer", "1"] == ("READY", "")
    assert states["churn", "3"] == ("READY", "")
    digests = {(e["name"], e["version"]): e.get("sha256") for e in index}
    for key in (("cancer", "1"), ("cancer", "2"), ("churn", "3")):  # of the bytes loaded
        assert digests[key] == hashlib.sha256(files[key].read_bytes()).hexdigest(), key
    assert states["churn", "4"][0] == "UNAVAILABLE" and "second.joblib" in states["churn", "4"][1]
    assert states["bad name", ""][0] == "UNAVAILABLE"
    assert "not a safe model name" in states["bad name", ""][1]
    assert "model repository: churn/4 not served: must hold exactly one model file" in log
    assert "model repository: bad name not served" in log


def test_repository_beside_another_model_source_stops_the_start_with_one_line(
    tmp_path: Path,
) -> None:
    one_version(tmp_path / "models")
    server = GunicornServer(
        tmp_path, model_repository=tmp_path / "models", model_path=DEMO_MODEL_PATH
    )
    server.start()
    try:
        status = server.wait_exit(timeout_s=60)
        lines = server.output().strip().splitlines()
    finally:
        server.kill()

    assert status == 2
    assert len(lines) == 1, lines
    assert lines[0].startswith("serving: invalid setting SERVING_MODEL_REPOSITORY: set it or")


@pytest.mark.usefixtures("cpu_hog")
def test_repository_sighup_reads_it_again_serving_a_new_version_and_naming_a_bad_one(
    tmp_path: Path, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    X, y = breast_cancer
    root = one_version(tmp_path / "models")
    server = GunicornServer(tmp_path, model_repository=root)
    server.start()
    try:
        server.wait_ready()
        before = requests.post(f"{server.url}/predict/churn", json={"instances": X[:5].tolist()},
                               timeout=30).json()  # fmt: skip
        # Publish as the docs say: copy beside, then rename into place.
        staging = root / "churn" / ".2"
        staging.mkdir()
        joblib.dump(make_pipeline(StandardScaler(), LogisticRegression(C=0.002)).fit(X, y),
                    staging / "model.joblib")  # fmt: skip
        staging.rename(root / "churn" / "2")
        (root / "churn" / "3").mkdir()  # empty: named, not served
        server.proc.send_signal(signal.SIGHUP)  # type: ignore[union-attr]
        server.wait_for_log("model repository: churn/3 not served", 1)
        deadline = time.monotonic() + 60
        after: dict[str, Any] = {}
        while time.monotonic() < deadline:
            after = requests.post(
                f"{server.url}/predict/churn", json={"instances": X[:5].tolist()}, timeout=30
            ).json()
            if after.get("model_version") == "2":
                break
            time.sleep(0.2)
    finally:
        server.kill()

    assert before["model_version"] == "1"
    assert after["model_version"] == "2"
    published = joblib.load(root / "churn" / "2" / "model.joblib")
    assert after["probabilities"] == published.predict_proba(X[:5]).tolist()


def churn_version(server: GunicornServer, rows: np.ndarray) -> str:
    answer = requests.post(
        f"{server.url}/predict/churn", json={"instances": rows.tolist()}, timeout=30
    )
    assert answer.status_code == 200, answer.text
    return str(answer.json()["model_version"])


def until(check: Any, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.2)
    raise AssertionError("not within the time")


@pytest.mark.usefixtures("cpu_hog")  # a lifecycle: on a busy machine, as production is
def test_repository_poll_serves_a_published_version_and_rides_out_an_emptied_repository(
    tmp_path: Path, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    X, y = breast_cancer
    root, aside = one_version(tmp_path / "models"), tmp_path / "aside"
    aside.mkdir()
    server = GunicornServer(tmp_path, model_repository=root, repository_poll_s=1.0)
    server.start()
    try:
        server.wait_ready()
        assert churn_version(server, X[:3]) == "1"
        # A copy in progress, written slowly into place: never read half-written.
        (root / "churn" / "2").mkdir()
        published = make_pipeline(StandardScaler(), LogisticRegression(C=0.002)).fit(X, y)
        joblib.dump(published, tmp_path / "new.joblib")
        data = (tmp_path / "new.joblib").read_bytes()
        with (root / "churn" / "2" / "model.joblib").open("wb") as out:
            for start in range(0, len(data), 256):
                out.write(data[start : start + 256])
                out.flush()
                time.sleep(0.1 * 256 / len(data) * 40)  # ~4 s in all: several looks
        # The old workers answer (version 1) until the new ones are ready, then stop.
        until(lambda: [churn_version(server, X[:3]) for _ in range(10)] == ["2"] * 10)
        answer = requests.post(
            f"{server.url}/predict/churn", json={"instances": X[:5].tolist()}, timeout=30
        ).json()
        # Emptied for many looks, as a sync tool does first: nothing unloaded.
        shutil.move(root / "churn", aside / "churn")
        time.sleep(5)
        still = churn_version(server, X[:3])
        shutil.move(aside / "churn", root / "churn")
        log = server.output()
    finally:
        server.kill()

    assert answer["model_version"] == "2"
    assert answer["probabilities"] == published.predict_proba(X[:5]).tolist()
    assert still == "2"
    assert "looking at" in log and "changed; reloading" in log
    assert "holds no model folder; nothing unloaded, serving on" in log
    assert log.count("changed; reloading") == 1, log  # the slow copy: read once, whole
    assert "not served" not in log  # no half-copied version was ever read


@pytest.mark.usefixtures("cpu_hog")
def test_repository_poll_a_typo_in_a_serving_models_config_json_keeps_it_serving(
    tmp_path: Path, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    """Found by the new-user trial: ``"lables"`` written into a serving model's config.json
    took it offline at the next poll (404 ``model_not_found``), and a bare /predict then
    answered from another model. Now its versions serve on, the index says why its
    config.json is not taken, and the fixed file is taken at the next poll."""
    X, _ = breast_cancer
    root = one_version(tmp_path / "models")
    (root / "cancer" / "1").mkdir(parents=True)
    shutil.copy(DEMO_MODEL_PATH, root / "cancer" / "1" / "m.joblib")
    config = root / "churn" / "config.json"
    config.write_text(json.dumps({"labels": {"stable": 1}}))
    server = GunicornServer(tmp_path, model_repository=root, repository_poll_s=0.5)
    server.start()

    def index() -> dict[str, str]:
        entries = requests.post(f"{server.url}/v2/repository/index", json={}, timeout=10)
        return {f"{e['name']}/{e.get('version', '')}": e.get("reason", "") for e in entries.json()}

    def naming(entry: str, word: str) -> str:
        """The index's reason for ``entry`` once it holds ``word``, else "" (each worker
        answers with what it serves: the one asked may not have taken the change yet)."""
        reason = index().get(entry)
        return reason if reason is not None and word in reason else ""

    def listing(entry: str) -> dict[str, str] | None:
        entries = index()
        return entries if entry in entries else None

    try:
        server.wait_ready()
        config.write_text('{"lables": {"stable": 1}}')
        broken = until(lambda: naming("churn/", "lables"), 30)
        time.sleep(2)  # more looks: nothing else happens
        answers = [
            requests.post(f"{server.url}/predict/churn", json={"instances": X[:3].tolist()},
                          timeout=30)
            for _ in range(10)
        ]  # fmt: skip
        bare = requests.post(
            f"{server.url}/predict", json={"instances": X[:3].tolist()}, timeout=30
        )
        labelled = requests.post(
            f"{server.url}/v1/models/churn/labels/stable:predict",
            json={"instances": X[:3].tolist()}, timeout=30,
        )  # fmt: skip
        # Every model's config.json broken at once: each serves on (the second attack: the
        # reload was refused, "nothing to serve", and the index went stale).
        (root / "cancer" / "config.json").write_text("{")
        both = until(lambda: listing("cancer/"), 30)

        def settled() -> bool:  # the second worker may still be taking the change
            workers = requests.get(f"{server.url}/healthz", timeout=10).json()["workers"]
            return "rollout" not in workers

        until(settled, 30)  # it stayed "failed" (the reload refused)
        cancer = requests.post(
            f"{server.url}/predict/cancer", json={"instances": X[:3].tolist()}, timeout=30
        )
        (root / "cancer" / "config.json").unlink()
        config.write_text(json.dumps({"labels": {"stable": 1}}))
        until(lambda: "churn/" not in index() and "cancer/" not in index(), 30)
        log = server.output()
    finally:
        server.kill()

    assert both["cancer/"].endswith("serve on (1) until it is fixed"), both
    assert both["churn/"] == broken
    assert cancer.status_code == 200, cancer.text

    expected = joblib.load(DEMO_MODEL_PATH).predict_proba(X[:3]).tolist()
    assert [a.status_code for a in answers] == [200] * 10, answers[0].text
    assert all(a.json()["probabilities"] == expected for a in answers)
    assert bare.json()["model_name"] == "cancer"  # the first model, as before the typo
    assert labelled.status_code == 200, labelled.text  # its labels as it served
    assert broken == (
        "config.json: lables: unknown field; the versions it served serve on (1) until it is fixed"
    )
    assert "lables" in log


@pytest.mark.usefixtures("cpu_hog")
def test_repository_poll_a_version_that_cannot_load_is_left_out_and_the_rest_goes_through(
    tmp_path: Path, breast_cancer: tuple[np.ndarray, np.ndarray]
) -> None:
    """Issue 32 item 3: churn/2 (cut short) and cancer/2 published together; the workers of
    that reload cannot load churn/2, so it is left out (the index says why), cancer/2 is
    served and churn/1 serves on, every request answered; once churn/2's files change
    it is tried again, and served."""
    X, y = breast_cancer
    root = one_version(tmp_path / "models")
    (root / "cancer" / "1").mkdir(parents=True)
    shutil.copy(DEMO_MODEL_PATH, root / "cancer" / "1" / "m.joblib")
    other = make_pipeline(StandardScaler(), LogisticRegression(C=0.002)).fit(X, y)
    server = GunicornServer(tmp_path, model_repository=root, repository_poll_s=0.3)
    server.start()
    try:
        server.wait_ready()
        for model, body in (("churn", DEMO_MODEL_PATH.read_bytes()[:300]), ("cancer", None)):
            staging = root / model / ".2"
            staging.mkdir()
            if body is None:
                joblib.dump(other, staging / "m.joblib")
            else:
                (staging / "m.joblib").write_bytes(body)  # cut short
            staging.rename(root / model / "2")

        def version_of(model: str) -> str:
            answer = requests.post(
                f"{server.url}/predict/{model}", json={"instances": X[:3].tolist()}, timeout=30
            )
            assert answer.status_code == 200, answer.text
            return str(answer.json()["model_version"])

        during = [version_of("churn")]
        until(lambda: during.append(version_of("churn")) or version_of("cancer") == "2", 120)

        def settled() -> bool:  # the rollover over: no old worker answers any more
            workers = requests.get(f"{server.url}/healthz", timeout=30).json()["workers"]
            return "rollout" not in workers and len(server.worker_pids()) == 2

        until(lambda: during.append(version_of("churn")) or settled(), 120)
        index = {
            (e["name"], e["version"]): (e["state"], e["reason"])
            for e in requests.post(f"{server.url}/v2/repository/index", timeout=30).json()
        }
        health = requests.get(f"{server.url}/healthz", timeout=30)
        joblib.dump(other, root / "churn" / "2" / "m.joblib")  # fixed: tried again
        until(lambda: version_of("churn") == "2", 120)
        log = server.output()
    finally:
        server.kill()

    assert set(during) == {"1"}  # the version before it served on, every request answered
    assert index["churn", "1"] == index["cancer", "2"] == ("READY", "")
    assert index["churn", "2"][0] == "UNAVAILABLE"
    assert index["churn", "2"][1].startswith("a worker could not load it: cannot load model")
    assert "churn/2/m.joblib" in index["churn", "2"][1]
    assert health.status_code == 200 and "rollout" not in health.json()["workers"]
    assert "model repository: churn/2 left out until its files change" in log


class _CrashesOnLoad:
    """Unpickling it reads address 0: the process dies of SIGSEGV, as a native library
    built for another version can."""

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        import ctypes

        return ctypes.string_at, (0,)


@pytest.mark.usefixtures("cpu_hog")
@pytest.mark.parametrize("share", ["off", "auto"])
def test_repository_poll_a_version_whose_load_crashes_its_workers_is_left_out(
    tmp_path: Path, breast_cancer: tuple[np.ndarray, np.ndarray], share: str
) -> None:
    """Found by the second attack: a version that crashed every worker loading it left no
    error behind, and the master forked workers 20 times a second for good. Shared
    (``auto``), its load in the master took the master down, and every model with it:
    now a trial load in a separate process dies instead."""
    import pickle

    X, _ = breast_cancer
    root = one_version(tmp_path / "models")
    (root / "cancer" / "1").mkdir(parents=True)
    shutil.copy(DEMO_MODEL_PATH, root / "cancer" / "1" / "m.joblib")
    server = GunicornServer(
        tmp_path, model_repository=root, repository_poll_s=0.3, share_model=share
    )
    server.start()
    try:
        server.wait_ready()
        staging = root / "churn" / ".2"
        staging.mkdir()
        (staging / "m.pkl").write_bytes(pickle.dumps(_CrashesOnLoad()))
        staging.rename(root / "churn" / "2")
        server.wait_for_log("churn/2 left out until its files change", 1, timeout_s=60)

        def index() -> dict[tuple[str, str], tuple[str, str]]:
            answer = requests.post(f"{server.url}/v2/repository/index", timeout=30)
            return {(e["name"], e["version"]): (e["state"], e["reason"]) for e in answer.json()}

        # the rollover onto the settings leaving it out: over once every answer says so
        until(lambda: all(("churn", "2") in index() for _ in range(4)), 120)
        # a worker that died loading it in place: replaced, and serving
        until(lambda: requests.get(f"{server.url}/healthz", timeout=10).json()["workers"]
              == {"ready": 2, "total": 2}, 60)  # fmt: skip
        booted = server.output().count("Booting worker")
        time.sleep(3)  # nothing forked any more
        booted_later = server.output().count("Booting worker")
        entries = index()
        cancer = requests.post(
            f"{server.url}/predict/cancer", json={"instances": X[:3].tolist()}, timeout=30
        )
        version = churn_version(server, X[:3])
    finally:
        server.kill()

    assert entries["churn", "2"][0] == "UNAVAILABLE"
    assert "died while loading" in entries["churn", "2"][1]
    assert version == "1" and cancer.status_code == 200
    assert booted_later == booted, "workers still forked after the version was left out"
    if share == "auto":
        assert "a trial load of 'churn' version '2' in a separate process died of SIGSEGV" in (
            server.output()
        )
