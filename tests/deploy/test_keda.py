"""deploy/keda/: the ScaledObjects validate against models generated from KEDA's CRDs
(cloudcoil-models-keda, pinned in setup.cfg), scale the Deployment of deploy/k8s on the
gauge the service exports with queries promtool parses, and agree with hpa.yaml."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from cloudcoil.models.keda.v1alpha1 import ScaledObject
from prometheus_client import CollectorRegistry

from serving.observe.metrics import ServingMetrics
from tests.deploy.tools import check_promql
from tests.e2e.server import ROOT

KEDA = ROOT / "deploy" / "keda"
K8S = ROOT / "deploy" / "k8s"
KSERVE_RAW = ROOT / "deploy" / "kserve" / "inferenceservice-raw.yaml"


def load(path: Path) -> dict[str, Any]:
    (document,) = yaml.safe_load_all(path.read_text())
    assert isinstance(document, dict)
    return document


def dropped_fields(given: Any, kept: Any, path: str = "") -> list[str]:
    """Paths of ``given`` that the validated model did not keep: fields it does not know."""
    if isinstance(given, dict) and isinstance(kept, dict):
        return [
            problem
            for key, value in given.items()
            for problem in (
                dropped_fields(value, kept[key], f"{path}.{key}")
                if key in kept
                else [f"{path}.{key}".lstrip(".")]
            )
        ]
    if isinstance(given, list) and isinstance(kept, list) and len(given) == len(kept):
        return [
            problem
            for index, (value, kept_value) in enumerate(zip(given, kept, strict=True))
            for problem in dropped_fields(value, kept_value, f"{path}[{index}]")
        ]
    return []


def keda_problems(document: dict[str, Any]) -> list[str]:
    """Validate against the generated ScaledObject model; fields it would drop are errors
    (its models ignore unknown fields rather than refuse them)."""
    assert (document["apiVersion"], document["kind"]) == ("keda.sh/v1alpha1", "ScaledObject")
    kept = ScaledObject.model_validate(document).model_dump(
        by_alias=True, exclude_unset=True, mode="json"
    )
    return [f"{path}: unknown field" for path in dropped_fields(document, kept)]


def scaled_objects() -> list[Path]:
    paths = sorted(KEDA.glob("*.yaml"))
    assert [p.name for p in paths] == ["scaledobject-scale-to-zero.yaml", "scaledobject.yaml"]
    return paths


def prometheus_triggers(document: dict[str, Any]) -> dict[str, dict[str, str]]:
    return {
        t["name"]: t["metadata"] for t in document["spec"]["triggers"] if t["type"] == "prometheus"
    }


@pytest.mark.parametrize("path", scaled_objects(), ids=lambda p: p.name)
def test_scaled_object_validates_against_the_keda_crd_models(path: Path) -> None:
    assert keda_problems(load(path)) == []


def test_keda_validation_catches_misspelt_fields_and_wrong_types() -> None:
    """The check above can fail: a typo at the top of spec and deep in a trigger, and a
    wrong type, are each refused."""
    document = load(KEDA / "scaledobject.yaml")
    document["spec"]["pollingIntervall"] = document["spec"].pop("pollingInterval")
    document["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behaviour"] = document["spec"][
        "advanced"
    ]["horizontalPodAutoscalerConfig"].pop("behavior")
    assert keda_problems(document) == [
        "spec.advanced.horizontalPodAutoscalerConfig.behaviour: unknown field",
        "spec.pollingIntervall: unknown field",
    ]
    wrong = load(KEDA / "scaledobject.yaml")
    wrong["spec"]["minReplicaCount"] = "three"
    with pytest.raises(ValueError, match="minReplicaCount"):
        keda_problems(wrong)


@pytest.mark.parametrize("path", scaled_objects(), ids=lambda p: p.name)
def test_scaled_object_targets_the_stable_deployment(path: Path) -> None:
    target = load(path)["spec"]["scaleTargetRef"]
    deployment = load(K8S / "deployment.yaml")
    assert (target["apiVersion"], target["kind"], target["name"]) == (
        deployment["apiVersion"],
        deployment["kind"],
        deployment["metadata"]["name"],
    )


def test_queue_trigger_uses_the_exported_gauge_and_the_hpas_target() -> None:
    """Same signal and numbers as hpa.yaml, without prometheus-adapter."""
    document, hpa = load(KEDA / "scaledobject.yaml"), load(K8S / "hpa.yaml")
    queue = prometheus_triggers(document)["queue-depth"]
    exported = {
        metric.name: metric.type
        for metric in ServingMetrics(CollectorRegistry()).registry.collect()
    }
    assert exported["inference_queue_depth"] == "gauge"
    assert "inference_queue_depth{" in queue["query"] and 'track="stable"' in queue["query"]
    (pods,) = [m["pods"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    assert queue["threshold"] == pods["target"]["averageValue"]
    assert float(queue["activationThreshold"]) >= 0
    spec = document["spec"]
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (
        hpa["spec"]["minReplicas"],
        hpa["spec"]["maxReplicas"],
    )
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == hpa["spec"]["behavior"]
    scrape = (ROOT / "deploy" / "prometheus" / "prometheus-k8s.yml").read_text()
    assert "target_label: track" in scrape and "target_label: namespace" in scrape


def test_scale_to_zero_wakes_on_a_signal_that_exists_without_pods() -> None:
    """At zero pods no pod exports inference_queue_depth: a trigger on it alone would never
    activate again. The activating trigger counts requests where they arrive."""
    document = load(KEDA / "scaledobject-scale-to-zero.yaml")
    assert document["spec"]["minReplicaCount"] == 0
    triggers = prometheus_triggers(document)
    waking = [t for t in triggers.values() if not re.search(r"\binference_", t["query"])]
    assert waking and all("activationThreshold" in t for t in waking)
    assert document["spec"]["cooldownPeriod"] >= 300


def test_every_prometheus_query_parses(tmp_path: Path) -> None:
    queries = [
        trigger["query"]
        for path in scaled_objects()
        for trigger in prometheus_triggers(load(path)).values()
    ]
    (raw_metric,) = load(KSERVE_RAW)["spec"]["predictor"]["autoScaling"]["metrics"]
    queries.append(raw_metric["external"]["metric"]["query"])
    check_promql(queries, tmp_path)
