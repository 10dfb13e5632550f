"""deploy/kserve/: the ServingRuntime and InferenceServices validate against the KServe SDK's
models (pinned in setup.cfg's kserve-schema extra) and the Kubernetes schemas, meet the
container contract KServe expects, and the predictor container, rendered as KServe renders
it, serves each example under the real Gunicorn to the real tritonclient."""

from __future__ import annotations

import copy
import importlib.util
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import joblib
import kubernetes_validate
import numpy as np
import pytest
import requests
import tritonclient.http as triton
import yaml

from serving.settings import DEMO_MODEL_PATH, Settings
from tests.deploy.kserve_pod import (
    MODEL_MOUNT,
    kserve_problems,
    process_env,
    render_predictor_container,
)
from tests.deploy.test_containers import GUNICORN_CMD, instructions
from tests.e2e.server import ROOT, GunicornServer

KSERVE = ROOT / "deploy" / "kserve"
SERVICES = ("inferenceservice-serverless.yaml", "inferenceservice-raw.yaml",
            "inferenceservice-custom.yaml")  # fmt: skip
#: The artifact each model format is stored as under storageUri (KServe's own sklearn and
#: onnx runtimes take model.joblib and model.onnx).
ARTIFACTS = {"sklearn": "model.joblib", "onnx": "model.onnx", "serving-python": "model.joblib"}


def load(name: str) -> dict[str, Any]:
    (document,) = yaml.safe_load_all((KSERVE / name).read_text())
    assert isinstance(document, dict)
    return document


def runtime() -> dict[str, Any]:
    return load("servingruntime.yaml")


def runtime_container() -> dict[str, Any]:
    (container,) = runtime()["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def test_every_manifest_validates_against_the_kserve_sdk_models() -> None:
    paths = sorted(KSERVE.glob("*.yaml"))
    assert {p.name for p in paths} == {"servingruntime.yaml", *SERVICES}
    documents = [load(p.name) for p in paths]
    problems = kserve_problems(documents)
    assert problems == [[] for _ in paths], dict(
        zip([p.name for p in paths], problems, strict=True)
    )


def test_kserve_validation_catches_misspelt_and_mistyped_fields() -> None:
    """The check above can fail: a typo at each level and a wrong type are each reported."""
    serving_runtime, service = runtime(), load("inferenceservice-serverless.yaml")
    spec = serving_runtime["spec"]
    spec["supportedModelFormat"] = spec.pop("supportedModelFormats")
    container = spec["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    model = service["spec"]["predictor"]["model"]
    model["storageURI"] = model.pop("storageUri")
    service["spec"]["predictor"]["minReplicas"] = "zero"

    runtime_problems, service_problems = kserve_problems([serving_runtime, service])

    assert "spec.supportedModelFormat: unknown field of V1alpha1ServingRuntimeSpec" in (
        runtime_problems
    )
    assert "spec.containers[0].readinesProbe: unknown field of V1Container" in runtime_problems
    assert "spec.predictor.model.storageURI: unknown field of V1beta1ModelSpec" in (
        service_problems
    )
    assert "spec.predictor.minReplicas: expected int, got 'zero'" in service_problems


@pytest.mark.parametrize("version", ["1.29.0", kubernetes_validate.utils.latest_version()])
def test_runtime_container_validates_against_the_kubernetes_schema(version: str) -> None:
    """The pod parts KServe copies verbatim (container, volumes) are core Kubernetes types."""
    spec = runtime()["spec"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "predictor"},
        "spec": {"containers": spec["containers"], "volumes": spec["volumes"]},
    }
    kubernetes_validate.validate(pod, version, strict=True)
    for name in SERVICES:
        rendered = render_predictor_container(runtime(), load(name))
        pod["spec"] = {"containers": [rendered], "volumes": spec["volumes"]}
        kubernetes_validate.validate(pod, version, strict=True)


def test_runtime_meets_the_custom_runtime_contract() -> None:
    spec = runtime()["spec"]
    container = runtime_container()
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert spec["protocolVersions"] == ["v2"]
    assert {f["name"] for f in spec["supportedModelFormats"]} == set(ARTIFACTS)
    assert container["name"] == "kserve-container"
    assert [p["containerPort"] for p in container["ports"]] == [8080]
    assert env["SERVING_BIND"] == "0.0.0.0:8080"
    assert env["SERVING_MODEL_DIR"] == MODEL_MOUNT
    assert env["SERVING_MODEL_NAME"] == "{{.Name}}"
    # One worker per CPU of the limit, as deploy/k8s/deployment.yaml.
    assert env["SERVING_WORKERS"] == container["resources"]["limits"]["cpu"]
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": 8080}
    # No command or args: the image's CMD runs (args alone would replace it).
    assert "command" not in container and "args" not in container
    assert ("CMD", json.dumps(GUNICORN_CMD)) in instructions("Dockerfile")
    probe = container["readinessProbe"]
    assert probe["periodSeconds"] * probe["failureThreshold"] > float(
        env["SERVING_LOAD_TIMEOUT_S"] or 0
    )


@pytest.mark.parametrize("name", SERVICES)
def test_inference_services_pick_this_runtime_for_a_format_it_declares(name: str) -> None:
    service = load(name)
    model = service["spec"]["predictor"]["model"]
    formats = {f["name"] for f in runtime()["spec"]["supportedModelFormats"]}
    assert model["runtime"] == runtime()["metadata"]["name"]
    assert model["modelFormat"]["name"] in formats
    assert model["protocolVersion"] == "v2"
    mode = service["metadata"]["annotations"]["serving.kserve.io/deploymentMode"]
    assert mode in {"Serverless", "RawDeployment"}
    if model["modelFormat"]["name"] == "serving-python":
        env = {e["name"]: e["value"] for e in model["env"]}
        assert env["SERVING_MODEL_CLASS"] == "custom_model:ShapeRatioModel"


def test_raw_mode_keda_target_is_half_a_batch_per_worker() -> None:
    """As deploy/k8s/hpa.yaml: half a full batch (default max_batch_size) per worker
    waiting, with the workers the runtime's CPU limit gives."""
    (metric,) = load("inferenceservice-raw.yaml")["spec"]["predictor"]["autoScaling"]["metrics"]
    workers = int(runtime_container()["resources"]["limits"]["cpu"])
    batch = Settings.model_fields["max_batch_size"].default
    assert metric["external"]["target"] == {
        "type": "AverageValue",
        "averageValue": str(workers * batch // 2),
    }
    assert "inference_queue_depth{" in metric["external"]["metric"]["query"]


def test_examples_cover_both_deployment_modes() -> None:
    modes = {
        load(name)["metadata"]["annotations"]["serving.kserve.io/deploymentMode"]
        for name in SERVICES
    }
    assert modes == {"Serverless", "RawDeployment"}


def test_rendering_merges_env_by_name_and_fills_the_name() -> None:
    service = load("inferenceservice-custom.yaml")
    service["spec"]["predictor"]["model"]["env"].append({"name": "SERVING_WORKERS", "value": "1"})
    container = render_predictor_container(runtime(), service)
    env = {e["name"]: e for e in container["env"]}
    assert env["SERVING_MODEL_NAME"]["value"] == "shape-ratios"
    assert env["SERVING_WORKERS"] == {"name": "SERVING_WORKERS", "value": "1"}
    assert env["PYTHONPATH"]["value"] == MODEL_MOUNT
    assert {"name": "kserve-provision-location", "mountPath": MODEL_MOUNT, "readOnly": True} in (
        container["volumeMounts"]
    )
    with pytest.raises(AssertionError, match="placeholder"):
        bad = copy.deepcopy(runtime())
        bad["spec"]["containers"][0]["env"][0]["value"] = "{{.Labels}}"
        render_predictor_container(bad, service)


def module_at(path: Path) -> ModuleType:
    """The module in the file ``path``, imported here without touching ``sys.path``."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def provision(service: dict[str, Any], directory: Path) -> Path:
    """What the storage initializer leaves in /mnt/models for each example's storageUri."""
    directory.mkdir()
    fmt = service["spec"]["predictor"]["model"]["modelFormat"]["name"]
    if fmt == "serving-python":  # the module and its artifact, as the example's storageUri
        shutil.copy(ROOT / "examples" / "custom_model.py", directory)
        module_at(directory / "custom_model.py").train(directory)
    else:
        source = DEMO_MODEL_PATH.with_suffix(".onnx" if fmt == "onnx" else ".joblib")
        shutil.copy(source, directory / ARTIFACTS[fmt])
    return directory


def in_process(service: dict[str, Any], directory: Path, rows: np.ndarray) -> dict[str, Any]:
    """The same model called here: the demo pipeline, or the example class."""
    if service["spec"]["predictor"]["model"]["modelFormat"]["name"] != "serving-python":
        pipeline = joblib.load(DEMO_MODEL_PATH)
        return {
            "predictions": pipeline.predict(rows),
            "probabilities": pipeline.predict_proba(rows),
        }
    model = module_at(directory / "custom_model.py").ShapeRatioModel()
    model.load(directory)
    outputs: dict[str, Any] = model.predict(model.preprocess(rows))
    return outputs


@pytest.fixture
def kserve_pod(tmp_path: Path) -> Iterator[Any]:
    """``kserve_pod(service)``: the rendered predictor container run under Gunicorn on
    127.0.0.1, /mnt/models provisioned in a temporary directory; (server, container,
    model directory)."""
    servers: list[GunicornServer] = []

    def start(service: dict[str, Any]) -> tuple[GunicornServer, dict[str, Any], Path]:
        container = render_predictor_container(runtime(), service)
        models = provision(service, tmp_path / "mnt-models")
        env = process_env(container, {MODEL_MOUNT: models, "/tmp/metrics": tmp_path / "prom"})
        server = GunicornServer(tmp_path)
        assert env["SERVING_BIND"] == "0.0.0.0:8080"
        # Only the address changes: loopback and a free port instead of the pod's 8080.
        server.env = {"PATH": server.env["PATH"], "HOME": str(tmp_path)} | env
        server.env["SERVING_BIND"] = f"127.0.0.1:{server.port}"
        servers.append(server.start())
        server.wait_ready(workers=int(env["SERVING_WORKERS"]))
        return server, container, models

    yield start
    for server in servers:
        server.kill()


@pytest.mark.parametrize("name", SERVICES)
def test_rendered_predictor_serves_v2_to_tritonclient(
    kserve_pod: Any, breast_cancer: tuple[np.ndarray, np.ndarray], name: str
) -> None:
    service = load(name)
    server, container, models = kserve_pod(service)
    model_name = service["metadata"]["name"]
    for probe in ("readinessProbe", "livenessProbe"):
        path = container[probe]["httpGet"]["path"]
        assert requests.get(f"{server.url}{path}", timeout=5).status_code == 200, path
    X, _ = breast_cancer
    rows = X[:64]

    client = triton.InferenceServerClient(url=f"127.0.0.1:{server.port}", network_timeout=30)
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready(model_name)
        (spec,) = client.get_model_metadata(model_name)["inputs"]
        tensor = triton.InferInput(spec["name"], list(rows.shape), "FP64")
        tensor.set_data_from_numpy(rows)
        result = client.infer(model_name, [tensor])
    finally:
        client.close()

    expected = in_process(service, models, rows)
    assert result.get_response()["model_name"] == model_name
    np.testing.assert_array_equal(result.as_numpy("predictions"), expected["predictions"])
    np.testing.assert_allclose(
        result.as_numpy("probabilities"), expected["probabilities"], atol=1e-4
    )
