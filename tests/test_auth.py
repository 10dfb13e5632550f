"""API keys on prediction routes; probes and (by default) metrics stay open."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from serving.app import create_app
from serving.errors import SettingsError
from serving.model.loaders import ModelHandle
from serving.observe.metrics import ServingMetrics
from serving.settings import Settings

KEY = "k" * 20
OTHER = "o" * 24
ROW = {"instances": [[1.0, 2.0, 3.0]]}


def make_client(settings: Settings, model_handle: ModelHandle, **overrides: object):  # type: ignore[no-untyped-def]
    configured = Settings(**{**settings.model_dump(), **overrides})
    app = create_app(configured, models=[model_handle], metrics=ServingMetrics(CollectorRegistry()))
    return app, app.test_client()


@pytest.fixture
def secured(settings: Settings, model_handle: ModelHandle):  # type: ignore[no-untyped-def]
    app, client = make_client(settings, model_handle, api_keys=f"{KEY}, {OTHER}")
    yield client
    app.extensions["serving"].get_models().stop(timeout_s=10)


def test_prediction_needs_a_key(secured) -> None:  # type: ignore[no-untyped-def]
    response = secured.post("/predict", json=ROW)
    assert response.status_code == 401
    assert response.get_json()["error"]["code"] == "unauthorized"
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="serving"'


@pytest.mark.parametrize(
    "headers",
    [{"Authorization": f"Bearer {KEY}"}, {"Authorization": f"bearer {OTHER}"}, {"X-API-Key": KEY}],
)
def test_a_configured_key_is_accepted_either_way(secured, headers: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    assert secured.post("/predict", json=ROW, headers=headers).status_code == 200


@pytest.mark.parametrize(
    "headers",
    [{"Authorization": "Bearer " + "x" * 20}, {"X-API-Key": KEY[:-1]}, {"Authorization": KEY}],
)
def test_a_wrong_key_is_refused_and_never_echoed(secured, headers: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    response = secured.post("/predict", json=ROW, headers=headers)
    assert response.status_code == 401
    assert KEY not in response.get_data(as_text=True)
    assert "x" * 20 not in response.get_data(as_text=True)


def test_probes_and_metrics_stay_open(secured) -> None:  # type: ignore[no-untyped-def]
    assert secured.get("/livez").status_code == 200
    assert secured.get("/healthz").status_code == 200
    assert secured.get("/metrics").status_code == 200


@pytest.mark.parametrize("headers", [{}, {"X-API-Key": "w" * 20}, {"Authorization": "Bearer"}])
def test_healthz_without_a_valid_key_says_only_ready_and_counts(  # type: ignore[no-untyped-def]
    secured, headers: dict[str, str]
) -> None:
    """Model names, versions and providers are metadata (a key on the metadata routes);
    under Gunicorn the detail adds each failed worker's load error (a path, a corrupt
    file's bytes). A probe without a key gets the status, never a 401."""
    response = secured.get("/healthz", headers=headers)

    assert response.status_code == 200
    assert response.get_json() == {"status": "ready"}


def test_healthz_without_a_key_shows_worker_counts_but_no_stage_or_error(  # type: ignore[no-untyped-def]
    secured, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under Gunicorn the workers' summary holds each loading worker's stage and each
    failed one's error, which name models and files: a probe gets the counts only."""
    from serving.protocols import probes

    fleet = {
        "ready": 1, "total": 2, "loading": 1, "failed": 1, "rollout": "failed",
        "stages": [{"pid": 7, "stage": "model 'secret_model': loading"}],
        "errors": [{"pid": 8, "error": "cannot load model /srv/secret/m.pkl: truncated"}],
    }  # fmt: skip
    monkeypatch.setattr(probes, "readiness", lambda state: (False, fleet))

    probe = secured.get("/healthz")
    detail = secured.get("/healthz", headers={"X-API-Key": KEY})

    assert probe.status_code == detail.status_code == 503
    assert probe.get_json() == {
        "status": "loading",  # this worker is ready, another is not yet
        "workers": {"ready": 1, "total": 2, "loading": 1, "failed": 1, "rollout": "failed"},
    }
    assert "secret" not in probe.get_data(as_text=True)
    assert detail.get_json()["workers"] == fleet


@pytest.mark.parametrize("headers", [{"X-API-Key": KEY}, {"Authorization": f"Bearer {OTHER}"}])
def test_healthz_with_a_key_shows_the_detail(secured, headers: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    body = secured.get("/healthz", headers=headers).get_json()

    assert body["status"] == "ready"
    assert body["model_name"] and body["models"][0]["status"] == "ready"


def test_healthz_shows_the_detail_when_no_keys_are_configured(
    settings: Settings, model_handle: ModelHandle
) -> None:
    app, client = make_client(settings, model_handle)
    try:
        assert client.get("/healthz").get_json()["models"][0]["status"] == "ready"
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)


def test_metrics_can_require_the_key(settings: Settings, model_handle: ModelHandle) -> None:
    app, client = make_client(settings, model_handle, api_keys=KEY, metrics_require_auth=True)
    try:
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers={"X-API-Key": KEY}).status_code == 200
        assert client.get("/healthz").status_code == 200
        document = client.get("/openapi.json").get_json()
        assert "security" in document["paths"]["/metrics"]["get"]
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)


def test_open_metrics_are_documented_open(settings: Settings, model_handle: ModelHandle) -> None:
    """Found by the attack: /openapi.json said /metrics needs a key while it answered
    without one (SERVING_METRICS_REQUIRE_AUTH off, the default)."""
    app, client = make_client(settings, model_handle, api_keys=KEY)
    try:
        assert client.get("/metrics").status_code == 200
        document = client.get("/openapi.json").get_json()
        assert "security" not in document["paths"]["/metrics"]["get"]
        assert "security" in document["paths"]["/predict"]["post"]
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)


def test_keys_file_is_read_and_comments_skipped(
    settings: Settings, model_handle: ModelHandle, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"# team a\n{KEY}\n\n")
    app, client = make_client(settings, model_handle, api_keys_file=keys)
    try:
        assert client.post("/predict", json=ROW, headers={"X-API-Key": KEY}).status_code == 200
        assert (
            client.post("/predict", json=ROW, headers={"X-API-Key": "# team a"}).status_code == 401
        )
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)


@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="chown needs root")
def test_a_keys_file_others_may_replace_is_refused_at_start_up(
    settings: Settings, model_handle: ModelHandle, tmp_path: Path
) -> None:
    """Whoever may rewrite the keys file may add their own key: as a model file, its
    directories and itself must be root's or the server's and not writable by others."""
    import os

    shared = tmp_path / "shared"
    shared.mkdir()
    keys = shared / "keys"
    keys.write_text(f"{KEY}\n")
    shared.chmod(0o777)
    with pytest.raises(SettingsError) as refused:
        make_client(settings, model_handle, api_keys_file=keys)
    message = str(refused.value)
    assert message.startswith(f"SERVING_API_KEYS_FILE: directory {shared} (on the way to {keys})")
    assert "mode 0777" in message and f"chmod go-w {shared}" in message

    shared.chmod(0o755)
    os.chown(keys, 65534, 65534)
    with pytest.raises(SettingsError, match=f"file {keys} is owned by uid 65534"):
        make_client(settings, model_handle, api_keys_file=keys)


def test_short_keys_are_refused_at_start_up(settings: Settings, model_handle: ModelHandle) -> None:
    with pytest.raises(SettingsError, match="SERVING_API_KEYS: every key must be at least 16"):
        make_client(settings, model_handle, api_keys="short")


def test_keys_do_not_appear_in_the_settings_repr(settings: Settings) -> None:
    configured = Settings(**{**settings.model_dump(), "api_keys": KEY})
    assert KEY not in repr(configured) and KEY not in str(configured.model_dump())
