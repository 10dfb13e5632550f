"""deploy/k8s/: every manifest validates against the Kubernetes schema (kubernetes-validate
bundles the schemas: no cluster, no network), and the manifests agree with each other and
with the service: probes, drain timing, sizing, selectors, the HPA's metric and the
prometheus-adapter rule that produces it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from prometheus_client import CollectorRegistry

from serving.observe.metrics import ServingMetrics
from tests.deploy.tools import check_promql
from tests.e2e.server import ROOT

K8S = ROOT / "deploy" / "k8s"
#: The oldest Kubernetes still commonly run, and the newest the bundled schemas know.
VERSIONS = ("1.29.0", kubernetes_validate.utils.latest_version())
MIB = {"Mi": 1, "Gi": 1024}


def load(name: str) -> dict[str, Any]:
    (document,) = yaml.safe_load_all((K8S / name).read_text())
    assert isinstance(document, dict)
    return document


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    assert isinstance(only, dict)
    return only


def env(deployment: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(deployment)["env"]}


def mebibytes(quantity: str) -> int:
    match = re.fullmatch(r"(\d+)(Mi|Gi)", quantity)
    assert match, f"memory {quantity!r}: write it in Mi or Gi"
    return int(match[1]) * MIB[match[2]]


def adapter_rules() -> list[dict[str, Any]]:
    rules: list[dict[str, Any]] = yaml.safe_load(
        load("prometheus-adapter-config.yaml")["data"]["config.yaml"]
    )["rules"]
    return rules


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", sorted(K8S.glob("*.yaml")), ids=lambda p: p.name)
def test_manifest_validates_against_the_kubernetes_schema(path: Path, version: str) -> None:
    documents = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert documents
    for document in documents:
        kubernetes_validate.validate(document, version, strict=True)


def test_validation_catches_a_misspelt_field() -> None:
    """The check above can fail: strict validation refuses unknown fields."""
    deployment = load("deployment.yaml")
    probe = container(deployment).pop("readinessProbe")
    container(deployment)["readinesProbe"] = probe
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(deployment, VERSIONS[0], strict=True)


def test_probes_cover_model_load_readiness_and_liveness() -> None:
    serving = container(load("deployment.yaml"))
    assert serving["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert serving["livenessProbe"]["httpGet"]["path"] == "/livez"
    startup = serving["startupProbe"]
    assert startup["httpGet"]["path"] == "/healthz"
    load_timeout_s = float(env(load("deployment.yaml"))["SERVING_LOAD_TIMEOUT_S"])
    assert startup["periodSeconds"] * startup["failureThreshold"] > load_timeout_s


def test_grace_period_outlasts_pre_stop_and_drain() -> None:
    deployment = load("deployment.yaml")
    settings = env(deployment)
    command = container(deployment)["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop_s = int(command[1])
    drain_s = int(settings["SERVING_GRACEFUL_TIMEOUT_S"])
    assert drain_s > float(settings["SERVING_REQUEST_TIMEOUT_MS"]) / 1000
    grace_s = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace_s > pre_stop_s + drain_s


def test_resources_follow_the_sizing_rule() -> None:
    """Guaranteed QoS; one CPU per worker thread of BLAS; memory at least the master plus
    each worker's measured footprint (deployment.yaml explains the numbers)."""
    deployment = load("deployment.yaml")
    settings = env(deployment)
    resources = container(deployment)["resources"]
    assert resources["requests"] == resources["limits"]
    workers = int(settings["SERVING_WORKERS"])
    assert int(resources["requests"]["cpu"]) == workers * int(settings["SERVING_BLAS_THREADS"])
    assert mebibytes(resources["requests"]["memory"]) >= 50 + workers * (135 + 30)


def test_canary_is_the_stable_pod_with_another_model() -> None:
    stable, canary = load("deployment.yaml"), load("deployment-canary.yaml")
    assert stable["spec"]["template"]["metadata"]["labels"] == {"app": "serving", "track": "stable"}
    assert canary["spec"]["template"]["metadata"]["labels"] == {"app": "serving", "track": "canary"}
    stable_env, canary_env = env(stable), env(canary)
    assert canary_env["SERVING_MODEL_PATH"] != stable_env["SERVING_MODEL_PATH"]
    assert canary_env["SERVING_MODEL_VERSION"] != stable_env["SERVING_MODEL_VERSION"]
    assert container(canary)["image"] == container(stable)["image"]
    for key in ("SERVING_MODEL_PATH", "SERVING_MODEL_VERSION"):
        del stable_env[key], canary_env[key]
    assert canary_env == stable_env
    # Everything else in the pod is the same (the labels aside).
    stable_pod, canary_pod = stable["spec"]["template"]["spec"], canary["spec"]["template"]["spec"]
    for pod in (stable_pod, canary_pod):
        pod["containers"][0].pop("env")
        pod.pop("topologySpreadConstraints")
    assert canary_pod == stable_pod


def test_service_and_budget_select_the_right_pods() -> None:
    service, budget = load("service.yaml"), load("pdb.yaml")
    for name in ("deployment.yaml", "deployment-canary.yaml"):
        labels = load(name)["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items(), name
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] in {p["name"] for p in container(load("deployment.yaml"))["ports"]}
    stable_selector = load("deployment.yaml")["spec"]["selector"]["matchLabels"]
    assert budget["spec"]["selector"]["matchLabels"] == stable_selector


def test_hpa_metric_is_the_adapter_rules_output(tmp_path: Path) -> None:
    """The HPA's Pods metric is the name the adapter rule gives a gauge the service
    exports; the rule maps it to pods by the labels Prometheus attaches; its query parses."""
    hpa = load("hpa.yaml")
    assert hpa["spec"]["scaleTargetRef"]["name"] == load("deployment.yaml")["metadata"]["name"]
    (pods_metric,) = [m["pods"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    (rule,) = adapter_rules()

    series = re.match(r"[a-z_:]+", rule["seriesQuery"])
    assert series is not None
    exported = {
        metric.name: metric.type
        for metric in ServingMetrics(CollectorRegistry()).registry.collect()
    }
    assert exported[series[0]] == "gauge"
    as_name = re.sub(r"\$\{(\d+)\}", r"\\\1", rule["name"]["as"])
    output = re.sub(rule["name"]["matches"], as_name, series[0])
    assert pods_metric["metric"]["name"] == output

    assert rule["resources"]["overrides"] == {
        "namespace": {"resource": "namespace"},
        "pod": {"resource": "pod"},
    }
    scrape = (ROOT / "deploy" / "prometheus" / "prometheus-k8s.yml").read_text()
    assert "target_label: namespace" in scrape and "target_label: pod" in scrape

    query = (
        rule["metricsQuery"]
        .replace("<<.Series>>", series[0])
        .replace(
            "<<.LabelMatchers>>", 'namespace="default",pod=~"serving-stable-a|serving-stable-b"'
        )
        .replace("<<.GroupBy>>", "pod")
    )
    assert "<<" not in query
    check_promql([query], tmp_path)
