"""deploy/docker-compose.yml and the Dockerfiles, read (Docker is not run here): the compose
file parses and names the services and images, and its parts agree with each other, with
the nginx template, the Prometheus config and the service's settings."""

from __future__ import annotations

import json
import re
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.nginx import VARIABLES
from tests.e2e.server import ROOT

DEPLOY = ROOT / "deploy"
GUNICORN_CMD = ["gunicorn", "wsgi:app", "-c", "gunicorn.conf.py"]


def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    return document


def resolved(value: Any) -> str:
    """A compose value with ``${NAME:-default}`` replaced by its default."""
    text = str(value)
    assert re.search(r"\$\{[A-Z_]+\}", text) is None, f"{text}: give every variable a default"
    return re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", text)


def environment(service: dict[str, Any]) -> dict[str, str]:
    return {name: resolved(value) for name, value in service["environment"].items()}


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (DEPLOY / dockerfile).read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


def test_compose_names_the_services_and_images() -> None:
    services = compose()["services"]
    assert set(services) == {"nginx", "serving-stable", "serving-canary", "prometheus"}
    stable, canary = services["serving-stable"], services["serving-canary"]
    assert stable["image"] == canary["image"] == "serving:latest"
    assert (
        stable["build"] == canary["build"] == {"context": "..", "dockerfile": "deploy/Dockerfile"}
    )
    assert services["nginx"]["image"].startswith("nginx:")
    assert services["prometheus"]["image"].startswith("prom/prometheus:")


def test_stable_and_canary_differ_only_in_model_path_and_version() -> None:
    services = compose()["services"]
    stable, canary = (
        environment(services["serving-stable"]),
        environment(services["serving-canary"]),
    )
    model_keys = ("SERVING_MODEL_PATH", "SERVING_MODEL_VERSION")
    for key in model_keys:
        assert stable[key] != canary[key]
    assert {k: v for k, v in stable.items() if k not in model_keys} == {
        k: v for k, v in canary.items() if k not in model_keys
    }
    # The defaults serve the demo model the image carries (the Dockerfile copies serving/
    # to /app/serving).
    for env in (stable, canary):
        path = env["SERVING_MODEL_PATH"]
        assert path.startswith("/app/serving/demo/")
        assert (ROOT / path.removeprefix("/app/")).is_file(), path
    assert ("WORKDIR", "/app") in instructions("Dockerfile")
    assert ("COPY", "serving/ serving/") in instructions("Dockerfile")


def test_nginx_gets_every_template_variable_matching_the_replicas() -> None:
    services = compose()["services"]
    nginx = services["nginx"]
    env = environment(nginx)
    assert set(env) == set(VARIABLES)
    assert (
        "./nginx/serving.conf.template:/etc/nginx/templates/default.conf.template:ro"
        in (nginx["volumes"])
    )
    stable, canary = (
        environment(services["serving-stable"]),
        environment(services["serving-canary"]),
    )
    assert env["STABLE_UPSTREAM"] == "serving-stable:8000"
    assert env["CANARY_UPSTREAM"] == "serving-canary:8000"
    assert stable["SERVING_BIND"] == "0.0.0.0:8000"
    assert env["STABLE_VERSION"] == stable["SERVING_MODEL_VERSION"]
    assert env["CANARY_VERSION"] == canary["SERVING_MODEL_VERSION"]
    assert env["MAX_BODY_BYTES"] == stable["SERVING_MAX_BODY_BYTES"] == "2097152"
    assert env["CANARY_PERCENT"] == "10"
    assert nginx["ports"] == [f"{env['LISTEN_PORT']}:{env['LISTEN_PORT']}"]


def test_prometheus_gets_the_shipped_config_and_scrapes_both_tracks() -> None:
    prometheus = compose()["services"]["prometheus"]
    for name in ("prometheus.yml", "alerts.yml"):
        assert f"./prometheus/{name}:/etc/prometheus/{name}:ro" in prometheus["volumes"]
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    (job,) = config["scrape_configs"]
    names = {name for sd in job["dns_sd_configs"] for name in sd["names"]}
    assert names == {"serving-stable", "serving-canary"}


def test_every_mounted_file_exists_and_stop_outlasts_the_drain() -> None:
    services = compose()["services"]
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            assert (DEPLOY / source).exists(), f"{name}: {source}"
    for name in ("serving-stable", "serving-canary"):
        drain_s = int(environment(services[name])["SERVING_GRACEFUL_TIMEOUT_S"])
        assert int(services[name]["stop_grace_period"].removesuffix("s")) > drain_s


def test_dockerfiles_run_gunicorn_as_a_user_with_a_liveness_healthcheck() -> None:
    for dockerfile in ("Dockerfile", "Dockerfile.gpu"):
        steps = instructions(dockerfile)
        kinds = [kind for kind, _ in steps]
        assert json.loads(dict(steps)["CMD"]) == GUNICORN_CMD, dockerfile
        assert "/livez" in dict(steps)["HEALTHCHECK"]
        (user,) = [args for kind, args in steps if kind == "USER"]
        assert user not in {"root", "0"}
        # Code is copied and installed before the user switch; nothing runs as root after.
        assert kinds.index("USER") > max(i for i, k in enumerate(kinds) if k == "RUN")
        for kind, args in steps:
            if kind == "COPY":
                for source in args.split()[:-1]:
                    assert (ROOT / source).exists(), f"{dockerfile}: COPY {source}"
    assert instructions("Dockerfile")[0][1].startswith("python:3.11-slim")


def test_gpu_image_is_cuda_with_onnxruntime_gpu_and_one_worker() -> None:
    steps = instructions("Dockerfile.gpu")

    def all_of(kind: str) -> str:
        return " ".join(args for k, args in steps if k == kind)

    image = re.fullmatch(
        r"CUDA_IMAGE=nvidia/cuda:(\d+)\.\d+\.\d+-cudnn-runtime-ubuntu[\d.]+", steps[0][1]
    )
    assert image is not None and steps[0][0] == "ARG"
    assert steps[1] == ("FROM", "${CUDA_IMAGE}")
    assert "SERVING_WORKERS=1" in all_of("ENV")
    assert "SERVING_ONNX_PROVIDERS=cuda,cpu" in all_of("ENV")  # no silent CPU fallback
    assert 'onnxruntime-gpu==${ONNXRUNTIME_GPU_VERSION}"' in all_of("RUN")
    # When the pinned onnxruntime-gpu is the one installed here, its CUDA major (from its
    # "cuda" extra) is the base image's.
    pinned = re.search(r"ONNXRUNTIME_GPU_VERSION=(\S+)", all_of("ARG"))
    assert pinned is not None
    if metadata.version("onnxruntime-gpu") == pinned[1]:
        runtime = [r for r in metadata.requires("onnxruntime-gpu") or [] if "cuda-runtime" in r]
        assert runtime, "onnxruntime-gpu names no CUDA runtime"
        assert re.search(rf"~={image[1]}\.", runtime[0]), (runtime, image[0])


def test_models_directory_is_mounted_but_not_committed() -> None:
    ignore = (DEPLOY / "models" / ".gitignore").read_text().split()
    assert ignore[0] == "*"
    assert Path(DEPLOY / "models" / "README.md").is_file()
