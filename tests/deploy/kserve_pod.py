"""What KServe does with deploy/kserve/ before a pod runs, as plain functions for the tests:
validate a manifest with the KServe SDK (in its own venv), and render the predictor's
``kserve-container`` from the ServingRuntime and the InferenceService the way the KServe
controller does (``MergeRuntimeContainers``, ``ReplacePlaceholders``, the storage
initializer's ``/mnt/models`` mount).
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.server import ROOT

__all__ = [
    "MODEL_MOUNT",
    "kserve_problems",
    "kserve_sdk_python",
    "process_env",
    "render_predictor_container",
]

#: Where KServe's storage initializer puts storageUri, in the kserve-container.
MODEL_MOUNT = "/mnt/models"
#: The separate venv holding setup.cfg's kserve-schema extra (.ci/run builds it).
KSERVE_VENV = ROOT / ".venv-kserve"


def kserve_sdk_python() -> str:
    """The Python of ``.venv-kserve``; skips the test when it is missing and ``CI`` is
    unset, fails it in CI (``.ci/run`` builds it).

    :raises pytest.fail.Exception: when the venv is missing in CI.
    """
    python = KSERVE_VENV / "bin" / "python"
    if python.exists():
        return str(python)
    hint = (
        f"{python} not found (python3 -m venv .venv-kserve && .venv-kserve/bin/pip install "
        "'kserve==0.21.0', the kserve-schema extra of setup.cfg)"
    )
    if os.environ.get("CI"):
        pytest.fail(f"{hint}; .ci/run builds it", pytrace=False)
    pytest.skip(f"{hint}; CI fails here instead of skipping")


def kserve_problems(documents: list[dict[str, Any]]) -> list[list[str]]:
    """The problems the KServe SDK's models find in each document (``[]`` when valid).

    :raises AssertionError: when the checker itself fails, with its output.
    """
    done = subprocess.run(
        [kserve_sdk_python(), "-I", "-W", "error", str(Path(__file__).with_name("kserve_sdk.py"))],
        input=json.dumps(documents),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"kserve_sdk.py exited {done.returncode}:\n{done.stderr}"
    problems: list[list[str]] = json.loads(done.stdout)
    return problems


def _merge_env(base: list[dict[str, Any]], over: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Strategic merge of two env lists: merge key ``name``, ``over`` wins, order kept."""
    merged = {entry["name"]: entry for entry in base}
    for entry in over:
        merged[entry["name"]] = entry
    return list(merged.values())


def render_predictor_container(runtime: dict[str, Any], service: dict[str, Any]) -> dict[str, Any]:
    """The predictor pod's ``kserve-container`` as the KServe controller builds it.

    1. ``MergeRuntimeContainers``: the InferenceService's ``predictor.model`` container
       fields are strategically merged over the runtime's container (env by name, maps
       key by key, other fields replaced), and ``args`` are concatenated, runtime's first.
    2. ``ReplacePlaceholders``: the container, as JSON, is a Go template executed with the
       InferenceService's ObjectMeta: ``{{.Name}}``, ``{{.Namespace}}``.
    3. The storage initializer's volume is mounted read-only at ``/mnt/models``.

    :raises AssertionError: when the runtime has no ``kserve-container`` or the container
        uses a placeholder other than ``.Name``/``.Namespace``.
    """
    (container,) = [c for c in runtime["spec"]["containers"] if c["name"] == "kserve-container"]
    merged = copy.deepcopy(container)
    model = service["spec"]["predictor"]["model"]
    not_container = {"modelFormat", "runtime", "protocolVersion", "storageUri", "storage"}
    for key, value in model.items():
        if key in not_container:
            continue
        if key == "env":
            merged["env"] = _merge_env(merged.get("env", []), value)
        elif key == "args":
            merged["args"] = merged.get("args", []) + value
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value

    meta = service["metadata"]
    fields = {"Name": meta["name"], "Namespace": meta.get("namespace", "default")}

    def substitute(match: re.Match[str]) -> str:
        assert match[1] in fields, f"placeholder {match[0]} is not one KServe fills"
        return str(fields[match[1]])

    text = re.sub(r"\{\{\s*\.(\w+)\s*\}\}", substitute, json.dumps(merged))
    rendered: dict[str, Any] = json.loads(text)
    rendered.setdefault("volumeMounts", []).append(
        {"name": "kserve-provision-location", "mountPath": MODEL_MOUNT, "readOnly": True}
    )
    return rendered


def process_env(container: dict[str, Any], mounts: dict[str, Path]) -> dict[str, str]:
    """The environment the kubelet gives the container's process, with each mount path in
    ``mounts`` replaced by the directory standing in for it here.

    :raises AssertionError: for a ``valueFrom`` entry (none is expected: Knative refuses
        field references by default).
    """
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        assert "value" in entry, f"{entry['name']}: only literal values"
        value = str(entry["value"])
        for mount, directory in mounts.items():
            value = value.replace(mount, str(directory))
        env[entry["name"]] = value
    return env
