"""serving.repository: a Triton / TF Serving model repository folder read into the model
versions to serve and, for each entry that cannot be served, why; and the settings that
name it."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from serving.errors import SettingsError
from serving.repository import Loaded, Refusal, scan
from serving.repository.poll import Poller
from serving.settings import DEMO_MODEL_PATH, Settings, load_settings


def version(root: Path, model: str, number: str, name: str = "model.joblib") -> Path:
    folder = root / model / number
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(DEMO_MODEL_PATH, folder / name)
    return folder / name


def config(root: Path, model: str, body: object) -> None:
    (root / model).mkdir(parents=True, exist_ok=True)
    (root / model / "config.json").write_text(json.dumps(body))


def served(root: Path) -> list[tuple[str, str]]:
    return [(spec.name, spec.version) for spec in scan(root).specs]


def reasons(root: Path) -> dict[tuple[str, str], str]:
    return {(r.model, r.version): r.reason for r in scan(root).refused}


@pytest.mark.unit
def test_repository_serves_each_models_latest_version_by_default(tmp_path: Path) -> None:
    for number in ("1", "2", "10"):
        version(tmp_path, "churn", number)
    version(tmp_path, "cancer", "3")

    result = scan(tmp_path)

    # models by name; 10 is newer than 2 (numbers, not strings)
    assert served(tmp_path) == [("cancer", "3"), ("churn", "10")]
    # the versions passed over are listed, as Triton lists them (found by the trial)
    passed = "passed over: not chosen by its version_policy"
    assert result.refused == (Refusal("churn", "1", passed), Refusal("churn", "2", passed))
    assert result.specs[1].path == tmp_path / "churn" / "10" / "model.joblib"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ({"latest": {"num_versions": 2}}, ["3", "2"]),
        ({"all": {}}, ["3", "2", "1"]),
        ({"specific": {"versions": [1, 3]}}, ["3", "1"]),
    ],
)
def test_repository_version_policy_in_tritons_json(
    tmp_path: Path, policy: dict[str, object], expected: list[str]
) -> None:
    for number in ("1", "2", "3"):
        version(tmp_path, "churn", number)
    config(tmp_path, "churn", {"version_policy": policy})

    assert [v for _, v in served(tmp_path)] == expected


@pytest.mark.unit
def test_repository_config_sets_labels_batching_compile_and_digests(tmp_path: Path) -> None:
    version(tmp_path, "churn", "1")
    version(tmp_path, "churn", "2")
    digest = hashlib.sha256(DEMO_MODEL_PATH.read_bytes()).hexdigest()
    config(tmp_path, "churn", {
        "version_policy": {"all": {}}, "labels": {"stable": 1, "canary": 2},
        "max_batch_size": 8, "sha256": {"2": digest}, "compile": "off",
    })  # fmt: skip

    specs = {spec.version: spec for spec in scan(tmp_path).specs}
    models = Settings(model_repository=tmp_path, workers=1).model_settings()

    assert specs["2"].sha256 == digest and specs["1"].sha256 is None
    assert specs["1"].max_batch_size == specs["2"].max_batch_size == 8
    assert [m.compile for m in models] == ["off", "off"]
    labels = {label: v for spec in specs.values() for label, v in spec.labels.items()}
    assert labels == {"stable": "1", "canary": "2"}


@pytest.mark.unit
def test_repository_a_broken_newest_version_leaves_the_one_before_it_serving(
    tmp_path: Path,
) -> None:
    version(tmp_path, "churn", "1")
    version(tmp_path, "churn", "2")
    version(tmp_path, "churn", "2", "other.joblib")  # two artifacts: which one?

    assert served(tmp_path) == [("churn", "1")]
    reason = reasons(tmp_path)[("churn", "2")]
    assert "one model file" in reason and "model.joblib" in reason and "other.joblib" in reason


@pytest.mark.unit
def test_repository_refuses_bad_entries_by_name_and_serves_the_rest(tmp_path: Path) -> None:
    version(tmp_path, "good", "1")
    version(tmp_path, "bad name", "1")  # no URL can carry it
    version(tmp_path, "good", "v2")  # not a positive integer
    version(tmp_path, "good", "0")
    (tmp_path / "good" / "3").mkdir()  # no artifact
    version(tmp_path, "typo", "1")
    config(tmp_path, "typo", {"version_polcy": {"all": {}}})
    version(tmp_path, "broken", "1")
    (tmp_path / "broken" / "config.json").write_text("{not json")
    version(tmp_path, "labelled", "1")
    config(tmp_path, "labelled", {"labels": {"stable": 4}})
    (tmp_path / ".staging").mkdir()  # hidden: a copy being prepared
    (tmp_path / "README.md").write_text("notes")  # a file: not a model

    found = reasons(tmp_path)

    assert served(tmp_path) == [("good", "1"), ("labelled", "1")]
    assert "not a safe model name" in found[("bad name", "")]
    assert "positive integer" in found[("good", "v2")]
    assert "positive integer" in found[("good", "0")]
    assert "no model file" in found[("good", "3")]
    assert "version_polcy" in found[("typo", "")]
    assert "config.json" in found[("broken", "")] and "JSON" in found[("broken", "")]
    assert "label 'stable'" in found[("labelled", "")] and "4" in found[("labelled", "")]
    assert not any(model.startswith(".") or model == "README.md" for model, _ in found)


@pytest.mark.unit
def test_repository_refuses_a_version_linked_outside_it(tmp_path: Path) -> None:
    root, outside = tmp_path / "repo", tmp_path / "outside"
    version(root, "churn", "1")
    version(outside, "churn", "7")
    os.symlink(outside / "churn" / "7", root / "churn" / "7")

    assert served(root) == [("churn", "1")]
    assert "outside the repository" in reasons(root)[("churn", "7")]


@pytest.mark.unit
def test_repository_refuses_a_version_others_could_replace(tmp_path: Path) -> None:
    version(tmp_path, "churn", "1")
    risky = version(tmp_path, "churn", "2")
    risky.parent.chmod(0o777)  # any user may swap the pickle

    assert served(tmp_path) == [("churn", "1")]
    assert "writable" in reasons(tmp_path)[("churn", "2")]
    assert served_allowing(tmp_path) == [("churn", "2")]


def served_allowing(root: Path) -> list[tuple[str, str]]:
    return [(spec.name, spec.version) for spec in scan(root, allow_world_writable=True).specs]


@pytest.mark.unit
def test_repository_names_models_past_the_limit(tmp_path: Path) -> None:
    for model in ("a", "b", "c"):
        version(tmp_path, model, "1")

    result = scan(tmp_path, max_models=2)

    assert [spec.name for spec in result.specs] == ["a", "b"]
    assert result.refused == (Refusal("c", "1", "over SERVING_MAX_MODELS=2 model versions"),)


@pytest.mark.unit
def test_repository_settings_serve_it_and_refuse_another_model_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    version(tmp_path, "churn", "4")
    monkeypatch.setenv("SERVING_MODEL_REPOSITORY", str(tmp_path))

    models = load_settings().model_settings()

    assert [(m.name, m.version, m.format) for m in models] == [("churn", "4", "joblib")]
    monkeypatch.setenv("SERVING_MODEL_PATH", str(DEMO_MODEL_PATH))
    with pytest.raises(SettingsError) as refused:
        load_settings()
    assert refused.value.variable == "SERVING_MODEL_REPOSITORY"
    assert "SERVING_MODEL_PATH" in str(refused.value)


@pytest.mark.unit
def test_repository_settings_refuse_a_repository_with_nothing_to_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "churn" / "1").mkdir(parents=True)  # no artifact
    monkeypatch.setenv("SERVING_MODEL_REPOSITORY", str(tmp_path))

    with pytest.raises(SettingsError) as refused:
        load_settings()

    assert refused.value.variable == "SERVING_MODEL_REPOSITORY"
    assert "nothing to serve" in str(refused.value) and "churn/1" in str(refused.value)


@pytest.mark.unit
def test_repository_settings_scan_once_per_settings_object(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    version(tmp_path, "churn", "1")
    settings = Settings(model_repository=tmp_path)
    version(tmp_path, "churn", "2")  # after the settings were read: seen at the next read

    assert [m.version for m in settings.model_settings()] == ["1"]
    assert [m.version for m in Settings(model_repository=tmp_path).model_settings()] == ["2"]


class Looks:
    """A ``Poller`` on ``root`` whose reloads and lines are kept."""

    def __init__(self, root: Path) -> None:
        self.reloads = 0
        self.lines: list[str] = []
        self.poller = Poller(root, 1.0, on_change=self.reload, say=self.lines.append)

    def reload(self) -> None:
        self.reloads += 1

    def look(self, times: int = 1) -> int:
        for _ in range(times):
            self.poller.look()
        return self.reloads


@pytest.mark.unit
def test_repository_poll_reloads_once_a_change_has_stood_still_for_one_look(
    tmp_path: Path,
) -> None:
    version(tmp_path, "churn", "1")
    looks = Looks(tmp_path)
    assert looks.look(3) == 0  # nothing changed since start

    partial = tmp_path / "churn" / "2" / "model.joblib"
    partial.parent.mkdir()
    partial.write_bytes(b"x" * 10)  # a copy in progress: it grows between looks
    assert looks.look() == 0
    with partial.open("ab") as more:
        more.write(b"x" * 10)
    assert looks.look() == 0
    assert looks.look() == 1  # the same at two looks in a row: read it
    assert looks.look(3) == 1  # and once only


@pytest.mark.unit
def test_repository_poll_compares_with_what_the_last_reload_read_not_what_it_asked(
    tmp_path: Path,
) -> None:
    """Found with the attack's script: the poller asked for a reload of churn/2 gone;
    another reload (the quarantine's) read churn/2 published again; when churn/2 went
    once more, the repository was as the poller had last asked, and it asked nothing:
    the server served churn/2 for good."""
    version(tmp_path, "churn", "1")
    looks = Looks(tmp_path)
    version(tmp_path, "churn", "2")
    assert looks.look(2) == 1  # asked: churn/2 served
    shutil.rmtree(tmp_path / "churn" / "2")
    assert looks.look(2) == 2  # asked: churn/2 gone
    version(tmp_path, "churn", "2")
    looks.poller.reading()  # a reload someone else asked for reads churn/2 back
    assert looks.look(2) == 2  # as that reload read it: nothing to ask
    shutil.rmtree(tmp_path / "churn" / "2")
    assert looks.look(2) == 3  # gone again: asked


@pytest.mark.unit
def test_repository_poll_unloads_nothing_on_a_glitch(tmp_path: Path) -> None:
    root = tmp_path / "models"
    version(root, "churn", "1")
    version(root, "fraud", "1")
    looks = Looks(root)

    shutil.move(root / "fraud", tmp_path / "fraud")  # gone for one look, then back
    assert looks.look() == 0
    shutil.move(tmp_path / "fraud", root / "fraud")
    assert looks.look(2) == 0

    root.rename(tmp_path / "away")  # the whole repository unreachable, for long
    assert looks.look(5) == 0
    (tmp_path / "away").rename(root)
    assert looks.look(2) == 0

    for model in ("churn", "fraud"):  # emptied, as a sync tool does first
        shutil.move(root / model, tmp_path / model)
    assert looks.look(5) == 0
    said = [line for line in looks.lines if "nothing unloaded" in line]
    assert len(said) == 2, looks.lines  # each glitch said once while it lasts
    assert "cannot list" in said[0] and "holds no model folder" in said[1]

    shutil.move(tmp_path / "churn", root / "churn")  # fraud gone for good
    assert looks.look() == 0
    assert looks.look() == 1


@pytest.mark.unit
def test_repository_poll_sees_a_config_change(tmp_path: Path) -> None:
    version(tmp_path, "churn", "1")
    version(tmp_path, "churn", "2")
    looks = Looks(tmp_path)

    config(tmp_path, "churn", {"labels": {"stable": 1}})

    assert looks.look(2) == 1


@pytest.mark.unit
def test_repository_a_config_json_broken_after_it_served_keeps_what_it_served(
    tmp_path: Path,
) -> None:
    """Found by the new-user trial: a typo in a serving model's config.json (``"lables"``)
    took the model offline at the next poll (404), and a bare /predict silently answered
    from another model. As Triton keeps a model whose reload fails: the versions it served
    serve on, and the index says why its config.json is not taken."""
    for number in ("1", "2"):
        version(tmp_path, "churn", number)
    version(tmp_path, "cancer", "1")
    config(tmp_path, "churn", {"version_policy": {"all": {}}})
    before = scan(tmp_path)
    (tmp_path / "churn" / "config.json").write_text('{"lables": {"stable": 2}}')
    shutil.rmtree(tmp_path / "churn" / "1")  # a version gone since is not kept

    version(tmp_path, "churn", "3")  # published meanwhile: waits for the config
    kept = {"churn": [s for s in before.specs if s.name == "churn"]}
    result = scan(tmp_path, kept=kept)

    assert [(s.name, s.version) for s in result.specs] == [("cancer", "1"), ("churn", "2")]
    assert result.specs[1] == before.specs[1]  # as it served
    why = {(r.model, r.version): r.reason for r in result.refused}[("churn", "")]
    assert why.startswith("config.json: lables: unknown field")
    assert why.endswith("; the versions it served serve on (2) until it is fixed")
    assert Refusal("churn", "3", "waits for a config.json that can be read") in result.refused
    assert served(tmp_path) == [("cancer", "1")]  # first read (nothing served): refused


@pytest.mark.unit
def test_repository_a_hostile_config_json_refuses_its_model_only(tmp_path: Path) -> None:
    """Found by the attack: a deeply nested config.json raised RecursionError out of the
    scan (the master died at a reload), a FIFO hung the master in open(), /dev/zero ran it
    out of memory, and a link to outside the repository was read."""
    root, outside = tmp_path / "repo", tmp_path / "outside"
    for model in ("deep", "fifo", "zero", "linked", "huge", "good"):
        version(root, model, "1")
    (root / "deep" / "config.json").write_text("[" * 100_000)
    os.mkfifo(root / "fifo" / "config.json")
    os.symlink("/dev/zero", root / "zero" / "config.json")
    outside.mkdir()
    (outside / "cfg.json").write_text(json.dumps({"labels": {"evil": 1}}))
    os.symlink(outside / "cfg.json", root / "linked" / "config.json")
    (root / "huge" / "config.json").write_text(json.dumps({"labels": {}, "x": "y" * 2_000_000}))

    found = reasons(root)

    assert served(root) == [("good", "1")]
    assert "not JSON" in found[("deep", "")]
    assert "not a regular file" in found[("fifo", "")]
    assert "outside the repository" in found[("zero", "")]
    assert "outside the repository" in found[("linked", "")]
    assert "more than" in found[("huge", "")]


@pytest.mark.unit
def test_repository_a_folder_gone_during_the_scan_is_as_if_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the attack: a version folder removed while the scan read it made the scan
    raise, and the settings refused the whole repository ("cannot list")."""
    version(tmp_path, "churn", "1")
    version(tmp_path, "churn", "2")
    listing = Path.iterdir

    def vanishing(self: Path) -> object:
        if self.name == "2":
            raise FileNotFoundError(2, "No such file or directory", str(self))
        return listing(self)

    monkeypatch.setattr(Path, "iterdir", vanishing)

    assert served(tmp_path) == [("churn", "1")]


@pytest.mark.unit
def test_repository_poll_sees_a_permission_change(tmp_path: Path) -> None:
    """Found by the attack: a version refused as writable by others stayed refused after
    its mode was fixed: the looks compared names, sizes and times only."""
    version(tmp_path, "churn", "1")
    looks = Looks(tmp_path)

    (tmp_path / "churn" / "1").chmod(0o700)

    assert looks.look(2) == 1


@pytest.mark.unit
def test_repository_settings_name_any_failure_of_the_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever the read of the repository raises is one settings error naming it: at a
    reload, an exception out of the settings stopped the master (found by the attack)."""
    import sys

    version(tmp_path, "churn", "1")
    monkeypatch.setenv("SERVING_MODEL_REPOSITORY", str(tmp_path))

    def broken(*args: object, **kwargs: object) -> None:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(sys.modules["serving.repository.scan"], "scan", broken)
    with pytest.raises(SettingsError) as refused:
        load_settings()

    assert refused.value.variable == "SERVING_MODEL_REPOSITORY"
    assert "RecursionError" in str(refused.value)


@pytest.mark.unit
def test_repository_explicit_control_serves_the_models_loaded_with_their_config(
    tmp_path: Path,
) -> None:
    """Under explicit control only the models loaded are served, each with the
    config.json fields its load gave in place of its file's; the others are listed as
    Triton lists them: unloaded."""
    for number in ("1", "2"):
        version(tmp_path, "cancer", number)
    version(tmp_path, "churn", "1")
    version(tmp_path, "fraud", "1")
    config(tmp_path, "cancer", {"version_policy": {"all": {}}})

    loaded = {"cancer": Loaded({"labels": {"stable": 2}}), "churn": Loaded()}
    result = scan(tmp_path, loaded=loaded)

    # the file's policy ("all") and the load's labels
    assert [(s.name, s.version) for s in result.specs] == [
        ("cancer", "2"), ("cancer", "1"), ("churn", "1")
    ]  # fmt: skip
    assert result.specs[0].labels == {"stable": "2"}
    assert result.refused == (Refusal("fraud", "", "unloaded"),)


@pytest.mark.unit
def test_repository_explicit_control_serves_the_versions_its_load_picked(
    tmp_path: Path,
) -> None:
    """A version added after a model's load is not served until the next load names it
    (a broken new version of one model cannot fail the calls about another)."""
    version(tmp_path, "churn", "1")
    version(tmp_path, "churn", "2")  # added since the load picked 1

    result = scan(tmp_path, loaded={"churn": Loaded(None, ("1",))})

    assert [(s.name, s.version) for s in result.specs] == [("churn", "1")]


@pytest.mark.unit
@pytest.mark.parametrize("field", ["sha256", "class", "format"])
def test_repository_a_loads_config_may_not_set_what_pins_the_files_or_names_code(
    tmp_path: Path, field: str
) -> None:
    """Found by the attack: a load's parameters.config replaced config.json whole, so
    ``{}`` dropped its SHA-256 pins and ``{"class": "this:s"}`` imported any module."""
    value = {"sha256": {}, "class": "this:s", "format": "pickle"}[field]
    digest = hashlib.sha256(version(tmp_path, "churn", "1").read_bytes()).hexdigest()
    config(tmp_path, "churn", {"sha256": {"1": digest.replace(digest[0], "0")}})

    refused = scan(tmp_path, loaded={"churn": Loaded({field: value})}).refused
    pinned = scan(tmp_path, loaded={"churn": Loaded({"max_batch_size": 4})}).specs

    assert [(r.model, r.version) for r in refused] == [("churn", "")]
    assert refused[0].reason.startswith(f"parameters.config: {field}: set in the model's")
    assert pinned[0].sha256 == digest.replace(digest[0], "0")  # the file's pin kept


@pytest.mark.unit
def test_repository_explicit_control_refuses_a_bad_config_of_a_load_naming_the_field(
    tmp_path: Path,
) -> None:
    version(tmp_path, "churn", "1")

    result = scan(tmp_path, loaded={"churn": Loaded({"version_policy": {"newest": {}}})})

    assert result.specs == ()
    assert [(r.model, r.version) for r in result.refused] == [("churn", "")]
    assert result.refused[0].reason.startswith("parameters.config: version_policy.newest:")


@pytest.mark.unit
def test_repository_settings_selecting_rereads_it_serving_only_those_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    version(tmp_path, "cancer", "1")
    version(tmp_path, "churn", "1")
    monkeypatch.setenv("SERVING_MODEL_REPOSITORY", str(tmp_path))
    monkeypatch.setenv("SERVING_MODEL_CONTROL", "explicit")
    settings = load_settings()

    chosen = settings.selecting({"churn": Loaded()})

    assert [s.name for s in settings.entries() or ()] == ["cancer", "churn"]
    assert [s.name for s in chosen.entries() or ()] == ["churn"]
    assert chosen.controls_explicitly() and not chosen.polls_repository()
    with pytest.raises(ValueError, match="SERVING_MODEL_REPOSITORY: nothing to serve"):
        settings.selecting({})


@pytest.mark.unit
def test_repository_a_version_excluded_leaves_the_one_before_it_serving(tmp_path: Path) -> None:
    version(tmp_path, "churn", "1")
    version(tmp_path, "churn", "2")

    result = scan(tmp_path, excluded={("churn", "2"): "a worker could not load it: EOF"})

    assert [(s.name, s.version) for s in result.specs] == [("churn", "1")]
    assert result.refused == (Refusal("churn", "2", "a worker could not load it: EOF"),)


@pytest.mark.unit
def test_repository_a_config_json_field_it_does_not_know_is_named_unknown(tmp_path: Path) -> None:
    """From the new-user trial: a typo read as pydantic's 'Extra inputs are not permitted'."""
    version(tmp_path, "churn", "1")
    version(tmp_path, "cancer", "1")
    config(tmp_path, "churn", {"version_polcy": {"all": {}}})

    assert reasons(tmp_path) == {("churn", ""): "config.json: version_polcy: unknown field"}


@pytest.mark.unit
def test_repository_explicit_control_names_an_unsafe_folder_as_such_not_unloaded(
    tmp_path: Path,
) -> None:
    """Found by the second attack: under explicit control a folder no URL can carry was
    listed as merely unloaded."""
    version(tmp_path, "churn", "1")
    version(tmp_path, "bad name", "1")

    result = scan(tmp_path, loaded={"churn": Loaded()})

    assert [(r.model, r.reason.split(" (")[0]) for r in result.refused] == [
        ("bad name", "not a safe model name")
    ]


def test_repository_a_version_asked_for_but_passed_over_is_refused_with_why(
    tmp_path: Path,
) -> None:
    """Found by the new-user trial: asking for a version the policy passed over got
    "this replica serves '2'", and not that version 1 is there but not chosen."""
    from prometheus_client import CollectorRegistry

    from serving.app import create_app
    from serving.observe.metrics import ServingMetrics

    root = tmp_path / "models"
    version(root, "churn", "1")
    version(root, "churn", "2")
    settings = Settings(model_repository=root)
    app = create_app(settings, metrics=ServingMetrics(CollectorRegistry()))
    app.extensions["serving"].get_models().start_loading().join(60)
    try:
        client = app.test_client()
        answer = client.post(
            "/predict/churn", json={"instances": [[0.0] * 30], "model_version": "1"}
        )
        v2 = client.post("/v2/models/churn/versions/1/infer", json={"inputs": [
            {"name": "input-0", "shape": [1, 30], "datatype": "FP64", "data": [0.0] * 30}
        ]})  # fmt: skip
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    for response in (answer, v2):
        assert response.status_code == 409
        error = response.get_json()["error"]
        message = error["message"] if isinstance(error, dict) else error  # /predict's, V2's
        assert "this replica serves '2'" in message
        assert "version '1' is not served: passed over: not chosen by its version_policy" in (
            message
        )
