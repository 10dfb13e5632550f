"""deploy/prometheus/ checked by promtool, and against a live /metrics scrape of a real
Gunicorn: the scrape configs, the alert rules (valid, in order of urgency, each firing on
the series it is meant for), the Grafana dashboard's queries, and the exposition itself."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.deploy.tools import check_promql, require, run
from tests.e2e.server import ROOT, GunicornServer

PROMETHEUS = ROOT / "deploy" / "prometheus"
ALERTS = PROMETHEUS / "alerts.yml"
DASHBOARD = PROMETHEUS / "grafana-dashboard.json"
OPERATIONS = ROOT / "docs" / "operations.md"
#: The guide's order of urgency: errors, latency over the SLA, queue growth.
URGENCY = [
    "ServingReplicaDown",
    "ServingHighErrorRate",
    "ServingLatencyP99OverSLA",
    "ServingQueueDepthGrowing",
]


def metric_names(promql: str) -> set[str]:
    """The service's metric names (and ``up``) that a PromQL expression reads."""
    return set(re.findall(r"\b(?:http_[a-z_]+|inference_[a-z_]+|up)(?=\s*[{\[)])", promql))


def dashboard_exprs() -> list[str]:
    """Every query of the dashboard, with Grafana's interval variable made concrete."""
    panels: list[dict[str, Any]] = json.loads(DASHBOARD.read_text())["panels"]
    exprs = [t["expr"] for panel in panels for t in panel["targets"]]
    return [expr.replace("$__rate_interval", "1m") for expr in exprs]


def alert_rules() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


@pytest.fixture(scope="module")
def scrape(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A /metrics scrape of a real Gunicorn (2 workers) after successes and errors."""
    server = GunicornServer(tmp_path_factory.mktemp("scrape")).start()
    try:
        server.wait_ready()
        for _ in range(10):
            assert server.predict([[0.0] * 30]).status_code == 200
        assert server.predict([[0.0] * 3]).status_code == 422
        yield requests.get(f"{server.url}/metrics", timeout=10).text
    finally:
        server.kill()


def test_compose_scrape_config_is_valid() -> None:
    output = run([require("promtool"), "check", "config", str(PROMETHEUS / "prometheus.yml")])
    assert "SUCCESS: 1 rule files found" in output


def test_kubernetes_scrape_config_is_valid(tmp_path: Path) -> None:
    """Debian's Prometheus is built without the Kubernetes service discovery; there, the
    config is checked with file_sd_configs in its place (relabelling checked all the same)."""
    promtool = require("promtool")
    config = PROMETHEUS / "prometheus-k8s.yml"
    args = [promtool, "check", "config"]
    done = run([*args, str(config)], check=False)
    if "field kubernetes_sd_configs not found" in done:
        text = config.read_text()
        assert text.count("kubernetes_sd_configs:\n      - role: pod\n") == 1
        text = text.replace(
            "kubernetes_sd_configs:\n      - role: pod\n",
            "file_sd_configs:\n      - files: [targets.json]\n",
        )
        (tmp_path / "alerts.yml").write_text(ALERTS.read_text())
        (tmp_path / "prometheus-k8s.yml").write_text(text)
        done = run([*args, str(tmp_path / "prometheus-k8s.yml")])
    assert "is valid prometheus config file syntax" in done, done


def test_alert_rules_are_valid_and_in_order_of_urgency() -> None:
    output = run([require("promtool"), "check", "rules", str(ALERTS)])
    assert f"SUCCESS: {len(URGENCY)} rules found" in output
    rules = alert_rules()
    assert [rule["alert"] for rule in rules] == URGENCY
    headings = {
        re.sub(r"[^a-z0-9-]", "", line.lstrip("#").strip().lower().replace(" ", "-"))
        for line in OPERATIONS.read_text().splitlines()
        if line.startswith("#")
    }
    for rule in rules:
        anchor = rule["annotations"]["runbook"].split("#", 1)[1]
        assert anchor in headings, f"{rule['alert']}: no heading #{anchor} in docs/operations.md"


def test_alert_rules_fire_on_the_series_they_are_meant_for() -> None:
    """promtool's rule unit tests (tests/deploy/alerts_test.yml)."""
    test_file = Path(__file__).parent / "alerts_test.yml"
    assert "SUCCESS" in run([require("promtool"), "test", "rules", str(test_file)])


def test_live_scrape_passes_promtool_check_metrics(scrape: str) -> None:
    assert run([require("promtool"), "check", "metrics"], stdin=scrape) == ""


def test_alerts_and_dashboard_read_metrics_the_service_exposes(scrape: str) -> None:
    exposed = {line.split("{")[0].split()[0] for line in scrape.splitlines() if line[:1].isalpha()}
    exposed.add("up")  # Prometheus's own, per target
    read = set().union(*(metric_names(rule["expr"]) for rule in alert_rules()))
    read |= set().union(*(metric_names(expr) for expr in dashboard_exprs()))
    assert read - exposed == set()
    for name in ("http_request_duration_seconds_bucket", "inference_queue_depth", "up"):
        assert name in read


def test_dashboard_has_the_panels_and_its_queries_parse(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    titles = " | ".join(panel["title"] for panel in dashboard["panels"]).lower()
    for topic in ("request rate", "error rate", "p50 / p95 / p99", "batch size", "queue depth"):
        assert topic in titles
    exprs = dashboard_exprs()
    assert any("histogram_quantile(0.99, " in expr for expr in exprs)
    check_promql(exprs, tmp_path)
