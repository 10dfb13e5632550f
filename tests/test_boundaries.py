"""Written boundaries, checked: every module under ``serving/`` keeps the import rule of its
folder (each package's README states it), and every prediction route goes through
``DataPlane.infer``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from flask import Flask

from serving.app import PROTOCOLS, create_app
from serving.model.handle import ModelHandle
from serving.observe.metrics import ServingMetrics
from serving.protocols.dispatch import prediction_map
from serving.settings import DEMO_MODEL_PATH, ModelSpec, Settings

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "serving"
WEB = ("flask", "werkzeug", "gunicorn")
CORE = (*WEB, "pydantic", "prometheus_client")


@dataclass(frozen=True)
class Rule:
    """What the modules of one folder may not import: third-party packages in
    ``forbidden``; of ``serving``, only modules under one of ``serving`` prefixes (or any,
    when ``serving`` is None)."""

    forbidden: tuple[str, ...]
    serving: tuple[str, ...] | None = None


# Folder -> rule; a new folder under serving/ must be given one (test below).
RULES = {
    "batching": Rule((*CORE, "pandas"), serving=("serving.errors", "serving.batching")),
    "model": Rule(CORE, serving=("serving.errors", "serving.model")),
    "observe": Rule(WEB),
    "server": Rule(("flask", "werkzeug")),
    # The wire protocols: the dispatcher's handlers and Flask's views, under any server.
    "protocols": Rule(("gunicorn",)),
    "demo": Rule(()),
    # Checking instances against a model: per value, no settings, metrics or web.
    "inputs": Rule(CORE, serving=("serving.errors", "serving.model", "serving.inputs")),
    # Measuring a model in-process for its batching settings: a command, no web.
    "tune": Rule(WEB),
    # A model repository folder read into model entries: files in, entries out.
    "repository": Rule(WEB),
}
# Top level: the data plane and everything it calls import no web framework; the app
# wires Flask. The request checks run per instance and take no settings or metrics.
TOP = Rule(WEB)
TOP_WEB = {"app"}
TOP_CORE = {"errors", "context"}


def modules() -> list[str]:
    """Every module of the package, found on disk (``serving.x.y``)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def rule_for(module: str) -> Rule:
    parts = module.split(".")[1:]
    if len(parts) > 1 or (parts and (PACKAGE / parts[0]).is_dir()):
        return RULES[parts[0]]
    name = parts[0] if parts else ""
    if name in TOP_WEB:
        return Rule(())
    return Rule(CORE) if name in TOP_CORE else TOP


#: The fork servers: the packages none of their modules may import, and what each server
#: imports before forking a child per module: only packages none of them forbids (the
#: server checks that it holds none of the forbidden ones), so a child's ``sys.modules``
#: holds a forbidden package only when its module's imports put it there, as in a fresh
#: interpreter.
SERVERS = {
    "core": ((*CORE, "pandas"), ("numpy",)),
    "web": (WEB, ("numpy", "pandas", "pydantic", "pydantic_settings", "prometheus_client")),
}


FORK_SERVER = """
import importlib, json, os, sys
forbidden, preload, third, modules = json.loads(sys.argv[1])
for name in preload:
    importlib.import_module(name)
held = [m for m in forbidden if m in sys.modules]
assert not held, f"the fork server holds {held}"
found = {}
for module in modules:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(module)
            out = {"third": [m for m in third if m in sys.modules],
                   "serving": sorted(m for m in sys.modules if m.startswith("serving."))}
        except BaseException as exc:
            out = {"error": f"{type(exc).__name__}: {exc}"}
        os.write(write, json.dumps(out).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        found[module] = json.loads(pipe.read())
    os.waitpid(pid, 0)
print(json.dumps(found))
"""


@cache
def imported_by_all() -> dict[str, dict[str, list[str]]]:
    """For every module, what importing it alone puts in ``sys.modules``: the
    forbidden-candidate packages and the ``serving`` modules. Each module is imported in a
    child forked from a server that imported only packages its rule allows (``SERVERS``:
    a fresh interpreter per module spent 13 CPU-seconds importing pydantic and pandas
    again 57 times); the two servers run in parallel."""
    third = sorted(
        {name for rule in [*RULES.values(), TOP] for name in rule.forbidden} | {"pandas"}
    )
    groups: dict[str, list[str]] = {}
    for module in modules():
        rule = rule_for(module)
        if rule != Rule(()):
            server = "web" if set(rule.forbidden) <= set(WEB) else "core"
            assert set(rule.forbidden) <= set(SERVERS[server][0]), module
            groups.setdefault(server, []).append(module)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    runs = []
    for server, group in groups.items():
        plan = json.dumps([*SERVERS[server], third, group])
        command = [sys.executable, "-c", FORK_SERVER, plan]
        runs.append(subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env))
    found: dict[str, dict[str, list[str]]] = {}
    for run in runs:
        out, _ = run.communicate(timeout=120)
        assert run.returncode == 0, "a fork server failed"
        found.update(json.loads(out))
    for module, imported in found.items():
        assert "error" not in imported, f"importing {module} failed: {imported['error']}"
    return found


def fresh_python(code: str) -> str:
    """Run ``code`` in a new interpreter (nothing imported yet) and return what it printed."""
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
        check=True,
    )  # fmt: skip
    return result.stdout.strip()


def test_boundaries_every_folder_has_a_rule_and_a_readme_stating_it() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(RULES)
    for name, rule in RULES.items():
        if name == "demo":
            continue
        readme = (PACKAGE / name / "README.md").read_text()
        assert "**Boundary.**" in readme, name
        missing = [module for module in rule.forbidden if module not in readme]
        assert not missing, f"serving/{name}/README.md does not name {missing}"


@pytest.mark.parametrize("module", [m for m in modules() if rule_for(m) != Rule(())])
def test_boundaries_module_keeps_its_folders_rule(module: str) -> None:
    rule = rule_for(module)
    imported = imported_by_all()[module]
    assert [m for m in imported["third"] if m in rule.forbidden] == []
    if rule.serving is not None:
        allowed = (*rule.serving, module.rsplit(".", 1)[0])
        outside = [
            m
            for m in imported["serving"]
            if not any(m == a or m.startswith(a + ".") for a in allowed)
        ]
        assert outside == []


def test_boundaries_rules_catch_a_violation() -> None:
    """The check above can fail, on either fork server: on the request checks' server the
    data plane shows pydantic and prometheus_client, which their rule forbids, and
    modules beyond what the batcher's allows; on the web-free server the app shows flask;
    and a server that holds a package it should look for refuses to run."""
    third = ["flask", "pandas", "prometheus_client", "pydantic"]

    def run(server: str, module: str, preload: tuple[str, ...] | None = None) -> Any:
        forbidden, preloaded = SERVERS[server]
        plan = json.dumps([forbidden, preload or preloaded, third, [module]])
        result = subprocess.run(
            [sys.executable, "-c", FORK_SERVER, plan], cwd=ROOT, capture_output=True,
            text=True, timeout=120, check=False,
        )  # fmt: skip
        return json.loads(result.stdout)[module] if result.returncode == 0 else result.stderr

    dataplane = run("core", "serving.dataplane")
    assert {"pydantic", "prometheus_client"} <= set(dataplane["third"])
    assert "serving.settings" in dataplane["serving"]
    assert rule_for("serving.inputs.conform").forbidden == CORE
    assert "flask" in run("web", "serving.app")["third"]
    assert "the fork server holds ['flask'" in run("web", "serving.errors", ("flask",))


def infer_calls(plane: Any, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """The positional arguments of every ``plane.infer`` call from now on (it still runs)."""
    calls: list[tuple[Any, ...]] = []
    infer = plane.infer

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return infer(*args, **kwargs)

    monkeypatch.setattr(plane, "infer", spy)
    return calls


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/predict", {"json": {"instances": [[1, 2, 3]]}}),
        ("post", "/predict/echo", {"json": {"instances": [[1, 2, 3]]}}),
        ("post", "/v2/models/echo/infer", {"json": {"inputs": [
            {"name": "input-0", "shape": [1, 3], "datatype": "FP64", "data": [1, 2, 3]}
        ]}}),
        ("post", "/v2/models/echo/versions/7/infer", {"json": {"inputs": [
            {"name": "input-0", "shape": [1, 3], "datatype": "FP64", "data": [1, 2, 3]}
        ]}}),
        ("post", "/v1/models/echo:predict", {"json": {"instances": [[1, 2, 3]]}}),
        ("post", "/v1/models/echo/versions/7:predict", {"json": {"inputs": [[1, 2, 3]]}}),
        ("post", "/v1/models/echo:classify", {"json": {"examples": [{"input-0": [1, 2, 3]}]}}),
        ("post", "/invocations", {"json": {"dataframe_split": {"data": [[1, 2, 3]]}}}),
        ("post", "/invocations", {"data": "a,b,c\n1,2,3\n", "content_type": "text/csv"}),
    ],
)  # fmt: skip
def test_every_prediction_route_goes_through_the_data_plane_once(
    app: Flask, monkeypatch: pytest.MonkeyPatch, method: str, path: str, body: dict[str, Any]
) -> None:
    plane = app.extensions["serving"]
    calls = infer_calls(plane, monkeypatch)
    response = getattr(app.test_client(), method)(path, **body)

    assert response.status_code == 200, response.get_data(as_text=True)
    assert len(calls) == 1


def test_the_tf_label_route_goes_through_the_data_plane_once(
    settings: Settings,
    model_handle: ModelHandle,
    metrics: ServingMetrics,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entry = {"name": "echo", "version": "7", "path": DEMO_MODEL_PATH, "labels": {"stable": "7"}}
    labelled = settings.model_copy(update={"models": [ModelSpec(**entry)]})
    app = create_app(labelled, models=[model_handle], metrics=metrics)
    plane = app.extensions["serving"]
    calls = infer_calls(plane, monkeypatch)
    try:
        response = app.test_client().post(
            "/v1/models/echo/labels/stable:predict", json={"inputs": [[1, 2, 3]]}
        )
    finally:
        plane.get_models().stop(timeout_s=10)

    assert response.status_code == 200, response.get_data(as_text=True)
    assert [args[1:3] for args in calls] == [("echo", "7")]


def test_every_post_route_is_a_prediction_route_checked_above(app: Flask) -> None:
    """A new POST route must be added to the data-plane check above (V2's repository
    index, load and unload are the POSTs that predict nothing)."""
    rules = [*app.url_map.iter_rules(), *prediction_map(PROTOCOLS).iter_rules()]
    posts = {rule.rule for rule in rules if "POST" in (rule.methods or ())}
    posts -= {
        "/v2/repository/index",
        "/v2/repository/models/<model_name>/load",
        "/v2/repository/models/<model_name>/unload",
    }
    assert posts == {
        "/predict",
        "/predict/<model_name>",
        "/v2/models/<model_name>/infer",
        "/v2/models/<model_name>/versions/<model_version>/infer",
        "/v1/models/<tf_model:model_name>:predict",
        "/v1/models/<tf_model:model_name>/versions/<model_version>:predict",
        "/v1/models/<tf_model:model_name>/labels/<tf_model:label>:predict",
        *(
            f"/v1/models/<tf_model:model_name>{at}:{method}"
            for at in ("", "/versions/<model_version>", "/labels/<tf_model:label>")
            for method in ("classify", "regress")
        ),
        "/invocations",
    }


def test_gunicorn_config_does_not_import_prometheus_in_the_master() -> None:
    code = (
        "import runpy, sys\n"
        "runpy.run_path('gunicorn.conf.py')\n"
        "print('prometheus_client' in sys.modules, 'flask' in sys.modules)"
    )
    assert fresh_python(code) == "False False"
