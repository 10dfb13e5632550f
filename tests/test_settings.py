"""Settings from SERVING_* variables: defaults, parsing, one-line errors, README coverage."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from serving.errors import SettingsError
from serving.server.startup import unknown_variables
from serving.settings import (
    DEMO_MODEL_PATH,
    ModelSettings,
    ModelSpec,
    Settings,
    load_settings,
    settings_table,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(__import__("os").environ):
        if name.startswith("SERVING_"):
            monkeypatch.delenv(name)


def test_settings_defaults_serve_the_demo_with_the_issue_defaults() -> None:
    settings = load_settings()
    (model,) = settings.model_settings()
    assert (model.path, model.format, model.name) == (DEMO_MODEL_PATH, "joblib", "breast_cancer")
    assert (settings.max_batch_size, settings.max_batch_latency_ms) == (32, 10.0)
    assert settings.worker_threads == 64


def test_settings_read_environment_variables(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    model = tmp_path / "m.bin"
    model.write_bytes(b"x")
    monkeypatch.setenv("SERVING_MODEL_PATH", str(model))
    monkeypatch.setenv("SERVING_MODEL_FORMAT", "pickle")
    monkeypatch.setenv("SERVING_MAX_BATCH_SIZE", "64")
    monkeypatch.setenv("SERVING_MAX_BATCH_LATENCY_MS", "2.5")
    monkeypatch.setenv("SERVING_THREADS", "8")

    settings = load_settings()

    (served,) = settings.model_settings()
    assert (served.path, served.format, served.name) == (model, "pickle", "m")
    assert (settings.max_batch_size, settings.max_batch_latency_ms) == (64, 2.5)
    assert (served.max_batch_size, served.max_batch_latency_ms) == (64, 2.5)
    assert settings.worker_threads == 8


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("SERVING_MAX_BATCH_SIZE", "lots", "valid integer"),
        ("SERVING_MAX_BATCH_SIZE", "0", "greater than or equal to 1"),
        ("SERVING_MAX_BATCH_LATENCY_MS", "-1", "greater than or equal to 0"),
        ("SERVING_MODEL_FORMAT", "xml", "'pickle', 'joblib', 'skops', 'onnx' or 'python'"),
        ("SERVING_MODEL_PATH", "/no/such/model.joblib", "does not point to a file"),
        ("SERVING_LOG_LEVEL", "loud", "'debug', 'info', 'warning' or 'error'"),
        ("SERVING_MAX_BATCH_LATENCY_MS", "nan", "finite number"),
        ("SERVING_BIND", "garbage", "should match pattern"),
        ("SERVING_BIND", "127.0.0.1:99999", "port must be 1..65535"),
        ("SERVING_METRICS_DIR", "/etc/hostname", "exists and is not a directory"),
        ("SERVING_REQUEST_TIMEOUT_MS", "0", "greater than 0"),
        ("SERVING_ONNX_PROVIDERS", "cuda,gpu", "unknown execution provider 'gpu'"),
        ("SERVING_CUDA_DEVICE", "-1", "greater than or equal to 0"),
    ],
)
def test_bad_setting_names_the_variable_its_value_and_what_it_accepts(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, expected: str
) -> None:
    monkeypatch.setenv(variable, value)

    with pytest.raises(SettingsError) as info:
        load_settings()

    message = str(info.value)
    assert message.startswith(f"{variable}: got {value!r}")
    assert expected in message
    assert "\n" not in message


def test_unknown_model_extension_asks_for_a_format(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    model = tmp_path / "model.bin"
    model.write_bytes(b"x")
    monkeypatch.setenv("SERVING_MODEL_PATH", str(model))

    with pytest.raises(SettingsError, match=r"SERVING_MODEL_FORMAT.*set SERVING_MODEL_FORMAT"):
        load_settings()


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SERVING_MODEL_NAME", "churn model"),
        ("SERVING_MODEL_NAME", "churn+v2"),
        ("SERVING_MODEL_NAME", "a/b"),
        ("SERVING_MODEL_VERSION", "1 2"),
        ("SERVING_MODEL_VERSION", "v/2"),
        ("SERVING_MODEL_NAME", "."),
        ("SERVING_MODEL_NAME", ".."),
        ("SERVING_MODEL_VERSION", ".."),
        ("SERVING_MODEL_NAME", ""),
        ("SERVING_MODEL_VERSION", "a:predict"),
        ("SERVING_MODEL_VERSION", "2024:regress"),
    ],
)
def test_a_model_name_or_version_urls_cannot_carry_names_its_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    """Found by the hostile trials: these passed, and start-up failed later with a pydantic
    traceback and "Worker failed to boot"; ``.`` and ``..`` are path steps a client's URL
    library removes (``/predict/..`` is ``/``); a version ``a:predict`` made TF Serving's
    ``/versions/a:predict`` both that version's status and version ``a``'s predict."""
    monkeypatch.setenv(variable, value)

    with pytest.raises(SettingsError) as info:
        load_settings()

    message = str(info.value)
    assert message.startswith(f"{variable}: got {value!r}")
    says = "only dots" if value and not value.strip(".") else "A-Za-z0-9"
    says = "a TF Serving method" if ":" in value else says
    assert says in message and "\n" not in message


@pytest.mark.parametrize(("file", "stem"), [("churn+v2.joblib", "churn+v2"), ("...joblib", "..")])
def test_a_model_file_whose_stem_is_no_name_asks_for_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, file: str, stem: str
) -> None:
    model = tmp_path / file
    model.write_bytes(DEMO_MODEL_PATH.read_bytes())
    monkeypatch.setenv("SERVING_MODEL_PATH", str(model))

    with pytest.raises(SettingsError) as info:
        load_settings()

    message = str(info.value)
    assert message.startswith("SERVING_MODEL_NAME: ")
    assert repr(stem) in message and "set SERVING_MODEL_NAME" in message
    monkeypatch.setenv("SERVING_MODEL_NAME", "churn")
    assert load_settings().model_settings()[0].name == "churn"


def test_settings_are_frozen() -> None:
    with pytest.raises(Exception, match="frozen"):
        Settings().max_batch_size = 3  # type: ignore[misc]


def test_readme_documents_every_setting() -> None:
    readme = (ROOT / "docs" / "settings.md").read_text()
    table = set(re.findall(r"^\| `(SERVING_[A-Z0-9_]+)` \|", readme, re.MULTILINE))
    fields = {f"SERVING_{name.upper()}" for name in Settings.model_fields}
    assert table == fields


def test_readme_settings_table_is_the_one_generated_from_the_fields() -> None:
    readme = (ROOT / "docs" / "settings.md").read_text()
    generated = settings_table()
    assert generated.startswith("| Variable | Default | Meaning |\n|---|---|---|\n")
    assert generated in readme, (
        "docs/settings.md's table differs: paste `python -m serving.settings`"
    )
    row = next(line for line in generated.splitlines() if "SERVING_MAX_BATCH_SIZE" in line)
    assert row == (
        f"| `SERVING_MAX_BATCH_SIZE` | `32` | "
        f"{Settings.model_fields['max_batch_size'].description} |"
    )


def test_gunicorn_config_with_a_bad_setting_exits_with_one_line(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "SERVING_MAX_BATCH_SIZE": "many"}
    result = subprocess.run(
        [sys.executable, "-c", "import runpy; runpy.run_path('gunicorn.conf.py')"],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "serving: invalid setting SERVING_MAX_BATCH_SIZE: got 'many': Input should be a valid "
        "integer, unable to parse string as an integer (Most instances merged into one predict "
        "call)"
    ]


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Run the tests", 1)[1]
    command = section.split("```sh\n", 1)[1].split("\n```", 1)[0].strip()
    assert command in (ROOT / ".ci" / "run").read_text()


def test_log_level_is_case_insensitive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVING_LOG_LEVEL", "DEBUG")
    assert load_settings().log_level == "debug"


@pytest.mark.parametrize("bind", ["0.0.0.0:8000", "[::1]:8080", "unix:/run/serving.sock", "fd://3"])
def test_bind_accepts_what_gunicorn_accepts(monkeypatch: pytest.MonkeyPatch, bind: str) -> None:
    monkeypatch.setenv("SERVING_BIND", bind)
    assert load_settings().bind == bind


def test_unknown_variables_are_typos_but_not_kubernetes_service_variables() -> None:
    environ = {
        "SERVING_MAX_BATCH_SZE": "8",
        "SERVING_FOO": "1",
        "SERVING_MAX_BATCH_SIZE": "8",
        "SERVING_SERVICE_HOST": "10.0.0.1",
        "SERVING_SERVICE_PORT_HTTP": "80",
        "SERVING_PORT": "tcp://10.0.0.1:80",
        "SERVING_PORT_80_TCP_ADDR": "10.0.0.1",
        "HOME": "/root",
    }
    assert unknown_variables(environ) == ["SERVING_FOO", "SERVING_MAX_BATCH_SZE"]


def test_model_dir_serves_the_one_artifact_in_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """KServe's storage initializer fills /mnt/models; the file's name is the user's."""
    (tmp_path / "model.onnx").write_bytes(b"x")
    (tmp_path / ".hidden.joblib").write_bytes(b"x")
    (tmp_path / "README.txt").write_text("not a model")
    monkeypatch.setenv("SERVING_MODEL_DIR", str(tmp_path))
    monkeypatch.setenv("SERVING_MODEL_NAME", "demo")

    settings = load_settings()

    (model,) = settings.model_settings()
    assert (model.name, model.path, model.format) == ("demo", tmp_path / "model.onnx", "onnx")


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ((), "exactly one model file .*found none"),
        (("a.joblib", "b.onnx"), "found 'a.joblib', 'b.onnx'"),
    ],
)
def test_model_dir_without_exactly_one_artifact_stops_start_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, files: tuple[str, ...], expected: str
) -> None:
    for name in files:
        (tmp_path / name).write_bytes(b"x")
    monkeypatch.setenv("SERVING_MODEL_DIR", str(tmp_path))
    with pytest.raises(SettingsError, match=expected):
        load_settings()


def test_model_class_implies_python_and_keeps_the_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "weights.joblib").write_bytes(b"x")
    (tmp_path / "vocabulary.json").write_text("{}")
    monkeypatch.setenv("SERVING_MODEL_DIR", str(tmp_path))
    monkeypatch.setenv("SERVING_MODEL_CLASS", "custom_model:ShapeRatioModel")

    settings = load_settings()

    (model,) = settings.model_settings()
    assert (model.format, model.path) == ("python", tmp_path)
    assert model.model_class == "custom_model:ShapeRatioModel"


@pytest.mark.parametrize(
    ("variables", "expected"),
    [
        ({"SERVING_MODEL_FORMAT": "python"}, "format python needs SERVING_MODEL_CLASS"),
        (
            {"SERVING_MODEL_FORMAT": "onnx", "SERVING_MODEL_CLASS": "m:C"},
            "the format is python, not onnx",
        ),
        ({"SERVING_MODEL_CLASS": "not a class"}, "SERVING_MODEL_CLASS"),
        ({"SERVING_MODEL_PATH": str(DEMO_MODEL_PATH), "SERVING_MODEL_DIR": "."}, "not both"),
        (
            {
                "SERVING_MODEL_CLASS": "m:C",
                "SERVING_MODEL_DIR": ".",
                "SERVING_MODEL_SHA256": "a" * 64,
            },
            "a SHA-256 pins one file",
        ),
    ],
)
def test_python_format_settings_are_checked_at_start_up(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], expected: str
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError, match=expected):
        load_settings()


def test_models_entries_take_a_class(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    entry = f'{{"name": "ratios", "path": "{tmp_path}", "class": "custom_model:ShapeRatioModel"}}'
    monkeypatch.setenv("SERVING_MODELS", f"[{entry}]")

    (model,) = load_settings().model_settings()

    assert (model.model_class, model.format, model.path) == (
        "custom_model:ShapeRatioModel", "python", tmp_path,
    )  # fmt: skip


def test_model_labels_must_name_a_listed_version_and_one_version_each() -> None:
    path = str(DEMO_MODEL_PATH)
    ok = Settings(
        models=[
            {"name": "m", "version": "1", "path": path, "labels": {"stable": "1"}},
            {"name": "m", "version": "2", "path": path, "labels": {"canary": "2"}},
        ]
    )
    assert ok.version_labels("m") == {"stable": "1", "canary": "2"}
    assert ok.version_labels("other") == {}
    with pytest.raises(ValidationError, match="label 'beta' names version '3'"):
        Settings(models=[{"name": "m", "path": path, "labels": {"beta": "3"}}])
    with pytest.raises(ValidationError, match="label 'stable' names two versions"):
        Settings(
            models=[
                {"name": "m", "version": "1", "path": path, "labels": {"stable": "1"}},
                {"name": "m", "version": "2", "path": path, "labels": {"stable": "2"}},
            ]
        )


def test_settings_workers_default_to_the_cpus_this_process_may_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os

    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no affinity mask on this OS")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})  # as under taskset -c 3
    monkeypatch.setattr(os, "cpu_count", lambda: 64)

    assert Settings().workers == 1


@pytest.mark.parametrize("field", ["name", "version"])
def test_a_models_entry_named_only_with_dots_is_refused(field: str) -> None:
    entry = {"name": "m", "version": "1", "path": DEMO_MODEL_PATH, field: ".."}

    with pytest.raises(ValidationError, match="only dots"):
        ModelSpec(**entry)


def test_a_models_entry_whose_version_ends_in_a_tf_serving_method_is_refused() -> None:
    entry = {"name": "m", "version": "a:classify", "path": DEMO_MODEL_PATH}

    with pytest.raises(ValidationError, match="a TF Serving method"):
        ModelSpec(**entry)
    assert ModelSpec(**entry | {"version": "2024:06"}).version == "2024:06"


@pytest.mark.parametrize(
    ("models", "says"),
    [
        (
            '[{"name": "a", "path": "/nope/m.joblib"}]',
            "[0].path: Value error, '/nope/m.joblib' does not exist",
        ),
        ('[{"name": "a", "path": ""}]', "[0].path: Value error, is empty"),
        ("null", "got 'null': Value error, null is no list of models"),
    ],
)
def test_a_models_list_names_the_path_that_is_missing_or_empty_and_refuses_null(
    monkeypatch: pytest.MonkeyPatch, models: str, says: str
) -> None:
    """Found by the attack: a missing path printed pydantic's union internals
    (``function-after[validate_file(), lax-or-strict[...``) without the path, an empty one
    meant the current directory, and ``null`` was looked for as a file."""
    monkeypatch.setenv("SERVING_MODELS", models)

    with pytest.raises(SettingsError) as info:
        load_settings()

    assert str(info.value).startswith(f"SERVING_MODELS: {says}")
    assert "function-after" not in str(info.value)


def test_a_models_own_settings_default_to_the_servers_defaults() -> None:
    """``ModelSettings`` built without the server (``serving.load_model``) takes the
    defaults the server gives each model: they repeated the literals, and
    ``inference_timeout_ms`` had drifted (30 s in one, 60 s in the other)."""
    fields = {"name": "m", "version": "1", "format": "joblib"}

    alone = ModelSettings(**fields)
    served = Settings().model_defaults(**fields)

    assert alone == served
