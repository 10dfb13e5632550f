"""Who may replace a model: the file, its schema file, the directories above them and the
symlinks on the way must be root's or the server's (``serving.model.artifacts``).

The tests run as root; another user is simulated by ``os.chown`` to uid 65534 (nobody).
``tmp_path`` is 0700 under the sticky /tmp: safe.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from serving.errors import ModelLoadError, SettingsError
from serving.model.artifacts import UnsafePath, check_artifact, check_model_path, trusted_path
from serving.observe.metrics import ServingMetrics
from serving.runtime import ModelRuntime
from serving.settings import DEMO_MODEL_PATH, Settings, load_settings
from tests.models import RowEcho

OTHER_UID = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


class _Evil:
    """Unpickling it creates ``marker``: shows whether another user's pickle ever ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


def _model(directory: Path, name: str = "m.pkl") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_bytes(pickle.dumps(RowEcho(n_features=1)))
    path.chmod(0o644)
    return path


def test_a_model_in_a_world_writable_directory_is_refused_before_another_users_pickle_runs(
    settings: Settings, tmp_path: Path
) -> None:
    """The issue's case: a 0777 directory without the sticky bit, a root-owned 0644 model;
    another user renamed their pickle over it and the server ran it."""
    shared = tmp_path / "shared"
    path = _model(shared)
    shared.chmod(0o777)
    marker = tmp_path / "evil-ran"
    planted = shared / ".planted"
    planted.write_bytes(pickle.dumps(_Evil(marker)))
    os.chown(planted, OTHER_UID, OTHER_UID)
    os.replace(planted, path)  # what the other user could do: the directory lets them
    os.chown(path, 0, 0)  # even made to look like root's, the directory gives it away

    with pytest.raises(ModelLoadError) as refused:
        check_artifact(path)
    message = str(refused.value)
    assert f"directory {shared} (on the way to {path})" in message
    assert "mode 0777" in message and "not sticky" in message
    assert f"chmod go-w {shared}" in message
    assert "SERVING_ALLOW_WORLD_WRITABLE_MODEL=true" in message

    runtime = ModelRuntime(
        Settings(**{**settings.model_dump(), "model_path": path}).model_settings()[0],
        ServingMetrics(CollectorRegistry()),
    )
    with pytest.raises(ModelLoadError, match="not sticky"):
        runtime.load()
    assert not marker.exists(), "another user's pickle ran"


def test_the_escape_setting_loads_from_a_shared_directory(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    path = _model(shared)
    shared.chmod(0o777)

    assert check_artifact(path, allow_world_writable=True) == path.read_bytes()


def test_a_sticky_directory_is_safe_for_a_file_owned_by_root_but_not_by_another_user(
    tmp_path: Path,
) -> None:
    sticky = tmp_path / "sticky"
    path = _model(sticky)
    sticky.chmod(0o1777)

    assert check_artifact(path) == path.read_bytes()
    os.chown(path, OTHER_UID, OTHER_UID)
    with pytest.raises(ModelLoadError, match=f"file {path} is owned by uid {OTHER_UID}"):
        check_artifact(path)


@pytest.mark.parametrize("mode", [0o775, 0o757])
def test_a_group_or_world_writable_directory_anywhere_above_is_refused(
    tmp_path: Path, mode: int
) -> None:
    upper = tmp_path / "upper"
    upper.mkdir()
    path = _model(upper / "lower")
    upper.chmod(mode)

    with pytest.raises(ModelLoadError, match=f"directory {upper} .*mode 0{mode:o}"):
        check_artifact(path)


def test_a_directory_of_another_user_is_refused_naming_its_owner(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    path = _model(theirs)
    os.chown(theirs, OTHER_UID, OTHER_UID)

    with pytest.raises(ModelLoadError) as refused:
        check_artifact(path)
    message = str(refused.value)
    assert f"directory {theirs} (on the way to {path}) is owned by uid {OTHER_UID}" in message
    assert f"chown 0 {theirs}" in message


@pytest.mark.parametrize("mode", [0o664, 0o646])
def test_a_group_or_world_writable_file_is_refused(tmp_path: Path, mode: int) -> None:
    path = _model(tmp_path / "models")
    path.chmod(mode)

    with pytest.raises(ModelLoadError, match=f"world-writable \\(mode 0{mode:o}\\).*chmod go-w"):
        check_artifact(path)


def test_a_symlink_to_a_model_in_an_unsafe_directory_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    target = _model(shared)
    shared.chmod(0o777)
    link = tmp_path / "safe" / "m.pkl"
    link.parent.mkdir()
    link.symlink_to(target)

    with pytest.raises(ModelLoadError, match=f"directory {shared} \\(on the way to {link}\\)"):
        check_artifact(link)


def test_a_symlink_that_sits_in_an_unsafe_directory_is_refused(tmp_path: Path) -> None:
    target = _model(tmp_path / "safe")
    shared = tmp_path / "shared"
    shared.mkdir()
    link = shared / "m.pkl"
    link.symlink_to(target)
    shared.chmod(0o777)  # anyone may point the link elsewhere

    with pytest.raises(ModelLoadError, match=f"directory {shared} .*mode 0777"):
        check_artifact(link)


def test_a_symlink_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    target = _model(tmp_path / "safe")
    link = tmp_path / "link.pkl"
    link.symlink_to(target)
    os.lchown(link, OTHER_UID, OTHER_UID)

    with pytest.raises(ModelLoadError, match=f"symlink {link} is owned by uid {OTHER_UID}"):
        check_artifact(link)


def test_safe_symlinks_relative_and_through_dotdot_resolve_to_the_model(tmp_path: Path) -> None:
    target = _model(tmp_path / "a" / "versions")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "current").symlink_to("../a/versions")  # a relative directory link
    link = tmp_path / "b" / "model.pkl"
    link.symlink_to("current/../versions/m.pkl")  # current/.. is a/, not b/

    assert trusted_path(link)[0] == target
    assert check_artifact(link) == target.read_bytes()


def test_a_symlink_loop_is_refused_not_followed_forever(tmp_path: Path) -> None:
    (tmp_path / "x.pkl").symlink_to("y.pkl")
    (tmp_path / "y.pkl").symlink_to("x.pkl")

    with pytest.raises(ModelLoadError, match="symbolic links"):
        check_artifact(tmp_path / "x.pkl")


@pytest.mark.parametrize("name", ["m.schema.json", "MLmodel"])
def test_a_schema_file_others_may_replace_is_refused(tmp_path: Path, name: str) -> None:
    path = _model(tmp_path / "models")
    schema = path.with_name(name)
    schema.write_text('{"inputs": [{"name": "x", "type": "double"}]}')
    os.chown(schema, OTHER_UID, OTHER_UID)

    with pytest.raises(ModelLoadError, match=f"file {schema} is owned by uid {OTHER_UID}"):
        check_artifact(path)
    schema.chmod(0o666)
    os.chown(schema, 0, 0)
    with pytest.raises(ModelLoadError, match=f"file {schema} is group- or world-writable"):
        check_artifact(path)


def test_a_python_models_directory_is_checked_too(tmp_path: Path) -> None:
    directory = tmp_path / "model"
    directory.mkdir()
    check_model_path(directory)
    directory.chmod(0o777)

    with pytest.raises(ModelLoadError, match=f"directory {directory} is group- or world"):
        check_model_path(directory)
    check_model_path(directory, allow_world_writable=True)


def test_the_demo_models_and_tmp_path_models_still_load(tmp_path: Path) -> None:
    for path in (DEMO_MODEL_PATH, DEMO_MODEL_PATH.with_suffix(".onnx")):
        assert check_artifact(path) == path.read_bytes()
    path = _model(tmp_path)
    assert check_artifact(path) == path.read_bytes()


def test_unsafe_path_names_the_path_the_culprit_and_the_fix(tmp_path: Path) -> None:
    path = _model(tmp_path / "models")
    path.chmod(0o666)

    with pytest.raises(UnsafePath) as refused:
        trusted_path(path)
    assert (refused.value.path, refused.value.culprit) == (path, path)
    assert refused.value.fix == f"chmod go-w {path}"


def test_a_models_file_others_may_replace_is_refused_at_start_up(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``SERVING_MODELS`` may name a JSON file: it says which pickles run."""
    for name in list(os.environ):
        if name.startswith("SERVING_"):
            monkeypatch.delenv(name)
    shared = tmp_path / "shared"
    shared.mkdir()
    listed = shared / "models.json"
    listed.write_text(f'[{{"name": "m", "path": "{DEMO_MODEL_PATH}"}}]')
    monkeypatch.setenv("SERVING_MODELS", str(listed))
    assert load_settings().model_settings()[0].path == DEMO_MODEL_PATH

    shared.chmod(0o777)
    with pytest.raises(SettingsError, match=f"SERVING_MODELS: .*directory {shared} .*mode 0777"):
        load_settings()


def test_the_public_load_model_checks_as_the_server_does(tmp_path: Path) -> None:
    """``serving.load_model``, the one public way to load, makes the server's checks: a
    wrong SHA-256 and a file others may replace are refused, naming the cause."""
    import serving

    path = tmp_path / "demo.joblib"
    path.write_bytes(DEMO_MODEL_PATH.read_bytes())
    assert serving.load_model(path).name == "demo"
    with pytest.raises(ModelLoadError, match="SHA-256"):
        serving.load_model(path, sha256="0" * 64)
    tmp_path.chmod(0o777)
    try:
        with pytest.raises(ModelLoadError, match="SERVING_ALLOW_WORLD_WRITABLE_MODEL"):
            serving.load_model(path)
        assert serving.load_model(path, allow_world_writable=True).name == "demo"
    finally:
        tmp_path.chmod(0o755)
