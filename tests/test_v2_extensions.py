"""KServe V2 statistics, model configuration and repository extensions in-process (Flask
test client, the tiny echo model of conftest); e2e with tritonclient in
tests/e2e/test_v2_extensions.py."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest
from flask.testing import FlaskClient
from prometheus_client import CollectorRegistry

from serving.app import create_app
from serving.model.loaders import estimator_handle
from serving.observe.metrics import ServingMetrics
from serving.protocols.v2.repository import V2ModelConfig, V2RepositoryIndex
from serving.protocols.v2.stats import V2InferenceStatistics
from serving.settings import Settings
from tests.models import FailsOnNegative


def infer(client: FlaskClient, rows: list[list[float]]) -> Any:
    flat = [value for row in rows for value in row]
    body = {
        "inputs": [{"name": "input-0", "shape": [len(rows), 3], "datatype": "FP64", "data": flat}]
    }
    response = client.post("/v2/models/echo/infer", json=body)
    assert response.status_code == 200, response.text
    return response.get_json()


def test_v2_stats_count_each_request_stage_and_batch(client: FlaskClient) -> None:
    infer(client, [[1.0, 2.0, 3.0]])
    infer(client, [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    bad = client.post(
        "/v2/models/echo/infer",
        json={"inputs": [{"name": "input-0", "shape": [1, 2], "datatype": "FP64", "data": [1, 2]}]},
    )
    assert bad.status_code == 400

    response = client.get("/v2/models/echo/stats")

    assert response.status_code == 200
    body = V2InferenceStatistics.model_validate(response.get_json())
    (stats,) = body.model_stats
    assert (stats.name, stats.version) == ("echo", "7")
    assert (stats.inference_count, stats.execution_count) == (3, 2)
    infer_stats = stats.inference_stats
    assert (infer_stats.success.count, infer_stats.fail.count) == (2, 1)
    assert infer_stats.compute_infer.count == 2  # as Triton: the successful requests
    stages = ("queue", "compute_input", "compute_infer", "compute_output")
    parts_ns = sum(getattr(infer_stats, s).ns for s in stages)
    assert abs(infer_stats.success.ns - parts_ns) <= len(stages)  # each rounded to a ns
    assert infer_stats.success.ns >= infer_stats.compute_infer.ns > 0
    assert infer_stats.fail.ns > 0
    assert [(b.batch_size, b.compute_infer.count) for b in stats.batch_stats] == [(1, 1), (2, 1)]
    assert stats.last_inference > 0
    assert client.get("/v2/models/echo/versions/7/stats").get_json() == response.get_json()
    assert client.get("/v2/models/stats").get_json() == response.get_json()


def test_v2_stats_and_config_answer_404_and_409_for_models_not_served(
    client: FlaskClient,
) -> None:
    for path in ("/v2/models/nope/stats", "/v2/models/nope/config"):
        assert client.get(path).status_code == 404
    for path in ("/v2/models/echo/versions/8/stats", "/v2/models/echo/versions/8/config"):
        assert client.get(path).status_code == 409


def test_v2_config_tells_batching_and_tensors(client: FlaskClient) -> None:
    response = client.get("/v2/models/echo/config")

    assert response.status_code == 200, response.text
    config = V2ModelConfig.model_validate(response.get_json())
    assert (config.name, config.max_batch_size) == ("echo", 8)
    assert [(t.name, t.data_type, t.dims) for t in config.input] == [("input-0", "TYPE_FP64", [3])]
    assert "predictions" in [t.name for t in config.output]
    assert config.dynamic_batching["default_queue_policy"]["max_queue_size"] > 0
    assert config.instance_group == [{"name": "echo", "kind": "KIND_CPU", "count": 1}]


def test_v2_repository_index_lists_models_with_their_state(client: FlaskClient) -> None:
    every = client.post("/v2/repository/index")
    ready = client.post("/v2/repository/index", json={"ready": True})
    bad = client.post("/v2/repository/index", json={"ready": "yes"})
    blank = client.post("/v2/repository/index", data="\n", content_type="application/json")

    assert every.status_code == 200 and ready.status_code == 200
    assert blank.status_code == 400  # whitespace is no JSON (found by schemathesis)
    index = V2RepositoryIndex.model_validate(every.get_json()).root
    assert [(m.name, m.version, m.state, m.reason) for m in index] == [("echo", "7", "READY", "")]
    assert index[0].path is None  # a model handed over in memory: no file
    loaded = datetime.strptime(index[0].loaded_at or "", "%Y-%m-%dT%H:%M:%SZ")
    assert abs(loaded.replace(tzinfo=UTC).timestamp() - time.time()) < 300
    assert ready.get_json() == every.get_json()
    assert bad.status_code == 400 and bad.get_json()["code"] == "invalid_input"


def test_v2_server_metadata_lists_the_extensions(client: FlaskClient) -> None:
    extensions = client.get("/v2").get_json()["extensions"]

    assert {"statistics", "model_configuration", "model_repository"} <= set(extensions)


def test_v2_stats_count_executions_and_inferences_of_predict_calls_that_succeeded(
    settings: Settings, metrics: ServingMetrics
) -> None:
    """Found by the attack: ``inference_count`` and ``execution_count`` were read from the
    batch size histogram, which also counts failed predict calls (and, when a batch fails,
    each retry of its halves), so a failing request raised both; Triton counts successful
    executions only, as ``batch_stats`` here already did."""
    handle = estimator_handle(FailsOnNegative(3), name="neg", version="1", format="pickle")
    app = create_app(settings, models=[handle], metrics=metrics)
    client = app.test_client()
    try:
        body = {"inputs": [{"name": "input-0", "shape": [1, 3], "datatype": "FP64"}]}
        for first, status in ((-1.0, 500), (1.0, 200)):
            body["inputs"][0]["data"] = [first, 2.0, 3.0]
            assert client.post("/v2/models/neg/infer", json=body).status_code == status

        (stats,) = V2InferenceStatistics.model_validate(
            client.get("/v2/models/neg/stats").get_json()
        ).model_stats
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    assert (stats.inference_stats.success.count, stats.inference_stats.fail.count) == (1, 1)
    assert (stats.inference_count, stats.execution_count) == (1, 1)
    assert [(b.batch_size, b.compute_infer.count) for b in stats.batch_stats] == [(1, 1)]


def test_v2_repository_index_gives_the_sha256_of_the_bytes_loaded(tmp_path: Any) -> None:
    """Issue 32 item 6: each version served says the digest of what was loaded, the
    file's own SHA-256 (computed here from the file, not by the server)."""
    import hashlib
    import shutil

    from serving.loading import load_model
    from serving.settings import DEMO_MODEL_PATH

    path = shutil.copy(DEMO_MODEL_PATH, tmp_path / "cancer.joblib")
    handle = load_model(path, name="cancer")
    app = create_app(Settings(), models=[handle], metrics=ServingMetrics(CollectorRegistry()))

    index = app.test_client().post("/v2/repository/index").get_json()

    assert index[0]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def test_v2_repository_index_gives_the_memory_each_version_added(tmp_path: Any) -> None:
    """Issue 32 item 6: the memory a version added, measured (PSS before and after its
    load), not its file's size: a pickle of 48 MiB of ones is 48 MiB loaded."""
    import pickle

    from serving.loading import load_model
    from tests.models import Ballast

    path = tmp_path / "ballast.pkl"
    path.write_bytes(pickle.dumps(Ballast(n_features=3, mib=48)))
    app = create_app(
        Settings(), models=[load_model(path, name="ballast")],
        metrics=ServingMetrics(CollectorRegistry()),
    )  # fmt: skip
    try:
        (entry,) = app.test_client().post("/v2/repository/index").get_json()
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    # handed over loaded (as the master's copy is): measured where it was loaded
    assert 46 * 2**20 <= entry["shared_memory_bytes"] <= 120 * 2**20
    assert entry["memory_bytes"] < 24 * 2**20  # this process's warm-up added little


def test_v2_repository_index_names_the_libraries_a_load_imported_first(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the new-user trial: the first version of a library's model carried the
    library's import in its memory (137 MB for a 5 MB forest, 16 MB after a reload), and
    nothing said so."""
    import pickle
    import sys

    from serving.loading import load_model

    (tmp_path / "echolib").mkdir()
    (tmp_path / "echolib" / "__init__.py").write_text(
        "class Echo:\n"
        "    n_features_in_ = 2\n"
        "    def predict(self, X):\n"
        "        return X[:, 0].copy()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import echolib

    path = tmp_path / "echo.pkl"
    path.write_bytes(pickle.dumps(echolib.Echo()))
    del sys.modules["echolib"]  # as in a master that has not loaded such a model yet
    handle = load_model(path, name="echo")
    app = create_app(Settings(), models=[handle], metrics=ServingMetrics(CollectorRegistry()))
    try:
        (entry,) = app.test_client().post("/v2/repository/index").get_json()
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)
        sys.modules.pop("echolib", None)

    assert entry["shared_memory_imports"] == ["echolib"]
    assert "memory_imports" not in entry  # this process imported nothing more for it
