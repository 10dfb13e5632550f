"""The shipped nginx configuration, run by a real nginx in front of two real Gunicorn replicas:
the canary share, pinning (409 and X-Model-Version), request ids, size limits, routes kept
off the public listener, and retries when a replica is SIGKILLed during a burst."""

from __future__ import annotations

import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import requests

from tests.deploy.conftest import CANARY_VERSION, STABLE_VERSION, Deployment
from tests.deploy.nginx import TEMPLATE, VARIABLES, NginxServer, template_variables

N_SHARE_REQUESTS = 2000
N_CALLERS = 8


@pytest.fixture(scope="module")
def row(breast_cancer: tuple[np.ndarray, np.ndarray]) -> list[float]:
    """One real instance of the demo model's 30 features."""
    return [float(x) for x in breast_cancer[0][0]]


def send_many(
    n: int, send: Callable[[requests.Session, int], Any], timeout_s: float = 90.0
) -> list[Any]:
    """``send(session, i)`` for i in 0..n-1 from N_CALLERS keep-alive sessions; every
    outcome (or the exception raised), in order of i. Stops taking new work at the deadline."""
    deadline = time.monotonic() + timeout_s
    outcomes: list[Any] = [None] * n
    next_index = iter(range(n))
    lock = threading.Lock()

    def caller() -> None:
        session = requests.Session()
        while time.monotonic() < deadline:
            with lock:
                i = next(next_index, None)
            if i is None:
                return
            try:
                outcomes[i] = send(session, i)
            except requests.RequestException as exc:
                outcomes[i] = exc

    with ThreadPoolExecutor(N_CALLERS) as pool:
        for future in [pool.submit(caller) for _ in range(N_CALLERS)]:
            future.result(timeout_s + 35)
    assert None not in outcomes, f"not all {n} requests were sent within {timeout_s}s"
    return outcomes


def test_template_variables_are_the_documented_ones() -> None:
    text = TEMPLATE.read_text()
    assert template_variables(text) == set(VARIABLES)
    for name in VARIABLES:
        assert f"#   {name} " in text, f"{name} is not documented in the template's header"


def test_nginx_accepts_the_rendered_config_for_edge_values(deployment: Deployment) -> None:
    """Both pools on one version (after a promotion) and the extreme canary shares."""
    for share in ("0.01", "100"):
        proxy = NginxServer(
            deployment.proxy.directory.parent / f"nginx-check-{share}",
            stable="127.0.0.1:1",
            canary="127.0.0.1:2",
            stable_version="7",
            canary_version="7",
            canary_percent=share,
        )
        assert "test is successful" in proxy.check()


def test_canary_share_is_the_configured_one(deployment: Deployment, row: list[float]) -> None:
    """Half the requests carry a client X-Request-ID (passed through and echoed), half
    none (nginx makes one up); either way it is the split key and reaches the replica."""
    rng = random.Random(7)
    client_ids = [f"share-{rng.getrandbits(64):016x}" for _ in range(N_SHARE_REQUESTS)]

    def send(session: requests.Session, i: int) -> tuple[int, str, str]:
        headers = {"X-Request-ID": client_ids[i]} if i % 2 == 0 else {}
        response = session.post(
            f"{deployment.proxy.url}/predict",
            json={"instances": [row]},
            headers=headers,
            timeout=30,
        )
        version = response.json().get("model_version", "") if response.status_code == 200 else ""
        return response.status_code, version, response.headers.get("X-Request-ID", "")

    outcomes = send_many(N_SHARE_REQUESTS, send)

    assert [o for o in outcomes if not isinstance(o, tuple) or o[0] != 200] == []
    versions = Counter(version for _, version, _ in outcomes)
    assert set(versions) == {STABLE_VERSION, CANARY_VERSION}
    share = versions[CANARY_VERSION] / N_SHARE_REQUESTS
    print(f"canary share {share:.4f} over {N_SHARE_REQUESTS} requests (configured 0.10)")
    assert abs(share - 0.10) <= 0.03
    for i, (_, _, echoed) in enumerate(outcomes):
        if i % 2 == 0:
            assert echoed == client_ids[i]
        else:
            assert re.fullmatch(r"[0-9a-f]{32}", echoed), echoed
    # The id nginx logged is the one the replica answered with, and the pool it logged is
    # the one whose version answered.
    logged = deployment.proxy.wait_for_entries(N_SHARE_REQUESTS)
    pools = {e["request_id"]: e["pool"] for e in logged}
    expected_pool = {STABLE_VERSION: "serving_stable", CANARY_VERSION: "serving_canary"}
    for _, version, echoed in outcomes:
        assert pools[echoed] == expected_pool[version]
    # The generated ids reached the replicas: they are in the replicas' own access logs.
    replica_logs = deployment.stable.output() + deployment.canary.output()
    generated = [echoed for i, (_, _, echoed) in enumerate(outcomes) if i % 2 == 1]
    assert all(f'"request_id":"{rid}"' in replica_logs for rid in generated[:50])


def routed_id(deployment: Deployment, row: list[float], version: str) -> str:
    """An X-Request-ID that nginx's split sends to the pool serving ``version``."""
    for i in range(500):
        rid = f"route-{i}"
        response = requests.post(
            f"{deployment.proxy.url}/predict",
            json={"instances": [row]},
            headers={"X-Request-ID": rid},
            timeout=30,
        )
        assert response.status_code == 200, response.text
        if response.json()["model_version"] == version:
            return rid
    raise AssertionError(f"no request id out of 500 was routed to {version}")


@pytest.mark.parametrize(
    ("routed_to", "pinned"), [(STABLE_VERSION, CANARY_VERSION), (CANARY_VERSION, STABLE_VERSION)]
)
def test_request_pinned_to_the_other_version_gets_409_through_nginx(
    deployment: Deployment, row: list[float], routed_to: str, pinned: str
) -> None:
    rid = routed_id(deployment, row, routed_to)
    url = f"{deployment.proxy.url}/predict"
    body: dict[str, Any] = {"instances": [row], "model_version": pinned}

    response = requests.post(url, json=body, headers={"X-Request-ID": rid}, timeout=30)

    assert response.status_code == 409, response.text
    assert response.json()["error"]["code"] == "version_conflict"
    assert response.headers["X-Request-ID"] == rid
    entry = deployment.proxy.wait_for_entry(rid, count=2)  # the routing probe, then this one
    assert entry["upstream_status"] == "409", "a 409 must not be retried elsewhere"

    # The same request with the version in X-Model-Version is routed to the pool serving it.
    response = requests.post(
        url, json=body, headers={"X-Request-ID": rid, "X-Model-Version": pinned}, timeout=30
    )
    assert response.status_code == 200, response.text
    assert response.json()["model_version"] == pinned


def test_every_prediction_protocol_is_on_the_public_listener(
    deployment: Deployment, row: list[float]
) -> None:
    url = deployment.proxy.url
    answers = [
        requests.post(f"{url}/predict", json={"instances": [row]}, timeout=30),
        requests.post(f"{url}/invocations", json={"instances": [row]}, timeout=30),
        requests.post(f"{url}/v1/models/breast_cancer:predict", json={"instances": [row]},
                      timeout=30),
        requests.post(f"{url}/v2/models/breast_cancer/infer", timeout=30, json={
            "inputs": [{"name": "input-0", "shape": [1, len(row)], "datatype": "FP64",
                        "data": row}]}),
        requests.get(f"{url}/v1/models/breast_cancer/metadata", timeout=30),
        requests.get(f"{url}/v2/models/breast_cancer", timeout=30),
        requests.get(f"{url}/openapi.json", timeout=30),
    ]  # fmt: skip
    for response in answers:
        assert response.status_code == 200, (response.url, response.text)
        assert "X-Request-ID" in response.headers


def test_probe_and_metrics_routes_are_not_on_the_public_listener(deployment: Deployment) -> None:
    for path in ("/healthz", "/livez", "/metrics", "/ping", "/v2/health/ready", "/"):
        response = requests.get(f"{deployment.proxy.url}{path}", timeout=10)
        assert response.status_code == 404, path
        assert response.json()["error"] == {
            "code": "not_found",
            "message": "not a public route",
            "details": [],
        }
    # ...while the replicas themselves answer them.
    assert requests.get(f"{deployment.stable.url}/healthz", timeout=10).status_code == 200
    assert requests.get(f"{deployment.stable.url}/metrics", timeout=10).status_code == 200


def test_body_limit_is_the_services_limit(deployment: Deployment, row: list[float]) -> None:
    """A body of exactly SERVING_MAX_BODY_BYTES is served; one byte more is refused by
    nginx, in the service's JSON error shape, before any replica sees it."""
    limit = 2 * 1024 * 1024
    body = f'{{"instances": [{row}]}}'.encode()
    at_limit = body + b" " * (limit - len(body))
    headers = {"Content-Type": "application/json", "X-Request-ID": "body-at-limit"}
    url = f"{deployment.proxy.url}/predict"

    response = requests.post(url, data=at_limit, headers=headers, timeout=30)
    assert response.status_code == 200, response.text

    headers["X-Request-ID"] = "body-over-limit"
    response = requests.post(url, data=at_limit + b" ", headers=headers, timeout=30)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"
    assert response.headers["X-Request-ID"] == "body-over-limit"
    entry = deployment.proxy.wait_for_entry("body-over-limit")
    assert entry["upstream_addr"] == "", "the oversized body reached a replica"


@pytest.mark.parametrize("victim", ["stable", "canary"])
def test_sigkill_of_a_replica_during_a_burst_gives_no_client_error(
    fresh_deployment: Deployment, row: list[float], victim: str
) -> None:
    """proxy_next_upstream: requests in flight on the killed replica, and those routed to
    it afterwards, are retried on the other one."""
    n_requests, kill_after = 1200, 300
    dead = getattr(fresh_deployment, victim)
    survivor_version = CANARY_VERSION if victim == "stable" else STABLE_VERSION
    done = threading.Semaphore(0)
    killed_at = threading.Event()
    answered_after_kill: list[str] = []

    def send(session: requests.Session, i: int) -> tuple[int, str]:
        response = session.post(
            f"{fresh_deployment.proxy.url}/predict", json={"instances": [row]}, timeout=30
        )
        version = response.json().get("model_version", "") if response.status_code == 200 else ""
        if killed_at.is_set():
            answered_after_kill.append(version)
        done.release()
        return response.status_code, version

    def kill_when_started() -> None:
        for _ in range(kill_after):
            assert done.acquire(timeout=60)
        dead.kill()  # SIGKILL to the whole process group: master and workers
        killed_at.set()

    with ThreadPoolExecutor(1) as killer:
        kill = killer.submit(kill_when_started)
        outcomes = send_many(n_requests, send)
        kill.result(60)

    errors = [o for o in outcomes if not isinstance(o, tuple) or o[0] != 200]
    entries = fresh_deployment.proxy.wait_for_entries(n_requests)
    retried = [e for e in entries if "," in e["upstream_addr"]]
    print(
        f"{victim} SIGKILLed after {kill_after} of {n_requests} requests: "
        f"{len(errors)} client-visible errors, {len(retried)} requests retried"
    )
    assert errors == []
    assert len(entries) == n_requests
    assert retried, "nothing was retried: the replica died with no request routed to it"
    assert all(e["status"] == 200 for e in retried)
    late = answered_after_kill[len(answered_after_kill) // 2 :]
    assert late and set(late) == {survivor_version}
