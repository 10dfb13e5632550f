"""Reading a model repository folder: Triton's and TF Serving's layout,

    <repository>/<model>/config.json        optional (``serving.repository.config``)
    <repository>/<model>/<version>/<one artifact, or an MLflow folder, or your class's files>

into the model versions to serve (``ModelSpec``, as ``SERVING_MODELS`` entries) and, for
each entry that cannot be served, a ``Refusal`` saying which and why. One bad entry never
keeps another from serving. Hidden entries (``.staging``) and plain files beside the
model folders are not models and are passed over.

A version is a folder named by a positive integer. Before the policy picks among them,
each must be servable: inside the repository once its links are followed, holding
exactly one model file (none for a class that reads the folder), and that file and every
folder on the way changeable only by root and the server's user (``trusted_path``, as
every model file; unless ``allow_world_writable``). The policy then picks among the
servable ones: a newest version that is broken leaves the one before it serving, and says
why (Triton would serve neither).
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError

from serving.model.artifacts import EXTENSIONS, UnsafePath, trusted_path
from serving.model.names import NAME_PATTERN, only_dots
from serving.model_settings import ModelSpec
from serving.repository.config import VERSION_DIGITS, ModelConfig

__all__ = [
    "OVER_LIMIT",
    "PASSED_OVER",
    "PINNED_FIELDS",
    "UNLOADED",
    "Loaded",
    "Refusal",
    "Scan",
    "config_of",
    "overridden",
    "read",
    "scan",
]

#: The reason of a model that explicit control has not loaded (Triton's word for it).
UNLOADED: Final = "unloaded"
#: How the reason of a servable version not served begins (it is no fault: not logged).
PASSED_OVER: Final = "passed over"
#: How the reason of a version past ``SERVING_MAX_MODELS`` begins.
OVER_LIMIT: Final = "over SERVING_MAX_MODELS"
#: ``config.json`` fields a load's ``parameters.config`` may not set: they name the code
#: to run and pin the files (set by whoever may write the repository, not by a caller).
PINNED_FIELDS: Final = ("class", "format", "sha256")


@dataclass(frozen=True)
class Loaded:
    """A model explicit control serves: the ``config.json`` fields its load gave in place
    of the file's (None: the file's alone), and its versions served (None: those its
    policy picks now; a load picks them, and they stay until the next load)."""

    config: Mapping[str, Any] | None = None
    versions: tuple[str, ...] | None = None


#: Longest reason kept (a pydantic message can quote a whole file's worth of input).
_REASON_CHARS = 300
#: Most bytes of a ``config.json`` read (one is a few hundred).
CONFIG_BYTES = 1 << 20


@dataclass(frozen=True)
class Refusal:
    """An entry of the repository not served: ``model`` (its folder's name), ``version``
    (``""`` for the model as a whole) and why, in one line."""

    model: str
    version: str
    reason: str


@dataclass(frozen=True)
class Scan:
    """What one read of the repository found: the versions to serve, models by name and
    each model's versions newest first (the first is the default model, and each model's
    first its default version), and the entries refused."""

    specs: tuple[ModelSpec, ...]
    refused: tuple[Refusal, ...]


def scan(
    root: Path,
    *,
    max_models: int = 8,
    allow_world_writable: bool = False,
    loaded: Mapping[str, Loaded] | None = None,
    excluded: Mapping[tuple[str, str], str] | None = None,
    kept: Mapping[str, Sequence[ModelSpec]] | None = None,
) -> Scan:
    """Read ``root`` (``SERVING_MODEL_REPOSITORY``). At most ``max_models`` versions in
    all are served (``SERVING_MAX_MODELS``): those past it, in order, are refused.
    ``loaded`` (explicit model control) names the models to serve, each with its load's
    config and versions (``Loaded``); the others are refused as ``UNLOADED``. None serves
    every model. ``excluded`` names versions ``(model, version)`` refused for a reason
    found elsewhere (a worker could not load it): the policy picks among the others.
    ``kept`` holds the versions each model serves now: a model whose ``config.json``
    cannot be taken (a typo, a file half written) serves those on, as Triton keeps a
    model whose reload fails, and its refusal says so.

    :raises OSError: when ``root`` itself cannot be listed.
    """
    real_root = root.resolve()
    specs: list[ModelSpec] = []
    refused: list[Refusal] = []
    for folder in sorted(root.iterdir(), key=lambda p: p.name):
        if folder.name.startswith(".") or not folder.is_dir():
            continue
        if loaded is not None and folder.name not in loaded and _safe(folder.name):
            refused.append(Refusal(folder.name, "", UNLOADED))
            continue
        chosen = loaded.get(folder.name, Loaded()) if loaded is not None else Loaded()
        found, problems = _model(
            folder, real_root, allow_world_writable, chosen, excluded or {},
            serving=(kept or {}).get(folder.name, ()),
        )  # fmt: skip
        refused.extend(problems)
        for spec in found:
            if len(specs) < max_models:
                specs.append(spec)
            else:
                reason = f"{OVER_LIMIT}={max_models} model versions"
                refused.append(Refusal(spec.name, spec.version, reason))
    return Scan(tuple(specs), tuple(refused))


def read(
    root: Path,
    *,
    max_models: int,
    allow_world_writable: bool,
    loaded: Mapping[str, Loaded] | None,
    excluded: Mapping[tuple[str, str], str] | None = None,
    kept: Mapping[str, Sequence[ModelSpec]] | None = None,
) -> Scan:
    """``scan`` as the settings read ``SERVING_MODEL_REPOSITORY``: any failure, or nothing
    to serve, is one ``ValueError`` naming the variable (out of the settings, it would stop
    the master at a reload).

    :raises ValueError: ``"SERVING_MODEL_REPOSITORY: ..."``.
    """
    try:
        found = scan(
            root, max_models=max_models, allow_world_writable=allow_world_writable,
            loaded=loaded, excluded=excluded, kept=kept,
        )  # fmt: skip
    except OSError as exc:
        raise ValueError(
            f"SERVING_MODEL_REPOSITORY: cannot list {root}: {exc.strerror or exc}"
        ) from None
    except Exception as exc:
        raise ValueError(
            f"SERVING_MODEL_REPOSITORY: reading {root} failed: "
            f"{type(exc).__name__}: {str(exc)[:200]}"
        ) from None
    if not found.specs:
        why = "; ".join(
            f"{r.model}/{r.version}: {r.reason}" if r.version else f"{r.model}: {r.reason}"
            for r in found.refused[:3]
        )
        raise ValueError(
            f"SERVING_MODEL_REPOSITORY: nothing to serve in {root} "
            f"({why or 'no <model>/<version>/ folder'})"
        )
    return found


def _model(
    folder: Path,
    real_root: Path,
    allow_world_writable: bool,
    chosen: Loaded,
    excluded: Mapping[tuple[str, str], str],
    *,
    serving: Sequence[ModelSpec] = (),
) -> tuple[list[ModelSpec], list[Refusal]]:
    name = folder.name
    if not _safe(name):
        reason = "not a safe model name (1-128 of A-Za-z0-9_.-, not only dots)"
        return [], [Refusal(name, "", reason)]
    if not _inside(folder, real_root):
        return [], [Refusal(name, "", "a link to outside the repository")]
    try:
        config = _config(folder, real_root)
        if chosen.config is not None:
            config = overridden(config, chosen.config)
    except ValueError as exc:
        return _served_on(folder, _cut(str(exc)), serving)
    servable, refused = _versions(folder, real_root, config, allow_world_writable)
    picked = _pick(name, servable, refused, config, chosen=chosen, excluded=excluded)
    policy = config.version_policy
    seen = {r.version for r in refused}
    for number in policy.specific.versions if policy.specific is not None else ():
        if number not in servable and str(number) not in seen:
            refused.append(Refusal(name, str(number), "named by version_policy, not found"))
    labels = {}
    for label, number in config.labels.items():
        if number in picked:
            labels[label] = str(number)
        else:
            reason = f"label {label!r} names version {number}, which is not served"
            refused.append(Refusal(name, "", reason))
    specs = []
    for number in picked:
        fields = {"class": config.class_, **config.batching()}
        try:
            spec = ModelSpec(
                name=name, version=str(number), path=servable[number], format=config.format,
                sha256=config.sha256.get(str(number)), labels=labels, **fields,
            )  # fmt: skip
        except ValidationError as exc:  # a format its file's extension contradicts
            message = exc.errors()[0]["msg"].removeprefix("Value error, ")
            refused.append(Refusal(name, str(number), _cut(message)))
            continue
        specs.append(spec)
        labels = {}  # the model's labels on its first entry
    return specs, refused


def _served_on(
    folder: Path, reason: str, serving: Sequence[ModelSpec]
) -> tuple[list[ModelSpec], list[Refusal]]:
    """A model whose ``config.json`` cannot be taken: the versions of ``serving`` whose
    files are still there serve on (none: the model is refused as a whole), and the
    refusal says so; then every other version folder waits for a config that can be read
    (a version published meanwhile, named in the index)."""
    name = folder.name
    specs = [spec for spec in serving if os.path.lexists(spec.path)]
    if specs:
        numbers = ", ".join(spec.version for spec in specs)
        reason = f"{reason}; the versions it served serve on ({numbers}) until it is fixed"
    kept = {spec.version for spec in specs}
    waiting = (
        sorted(
            (int(p.name) for p in _listed(folder) if p.name.isdigit() and p.name not in kept),
            reverse=True,
        )
        if specs
        else []
    )
    return specs, [
        Refusal(name, "", reason),
        *(Refusal(name, str(n), "waits for a config.json that can be read") for n in waiting),
    ]


def _pick(
    name: str,
    servable: dict[int, Path],
    refused: list[Refusal],
    config: ModelConfig,
    *,
    chosen: Loaded,
    excluded: Mapping[tuple[str, str], str],
) -> list[int]:
    """The versions to serve, newest first: of the servable ones (less those ``excluded``,
    each refused), those its load picked, or else those the policy picks; the others are
    refused as passed over (Triton lists them too)."""
    for number in [n for n in servable if (name, str(n)) in excluded]:
        del servable[number]
        refused.append(Refusal(name, str(number), excluded[name, str(number)]))
    if chosen.versions is not None:  # the versions its load picked, while servable
        picked = sorted((n for n in servable if str(n) in chosen.versions), reverse=True)
        passed = f"{PASSED_OVER}: not picked by its last load (a load picks again)"
    else:
        picked = config.version_policy.select(list(servable))
        passed = f"{PASSED_OVER}: not chosen by its version_policy"
    refused.extend(Refusal(name, str(n), passed) for n in sorted(servable) if n not in picked)
    return picked


def _versions(
    folder: Path, real_root: Path, config: ModelConfig, allow_world_writable: bool
) -> tuple[dict[int, Path], list[Refusal]]:
    """A model folder's servable versions (number -> the path to serve), and the others."""
    servable: dict[int, Path] = {}
    refused: list[Refusal] = []
    for entry in sorted(_listed(folder), key=lambda p: p.name):
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        if not re.fullmatch(VERSION_DIGITS, entry.name):
            reason = "a version folder's name must be a positive integer (1, 2, ...)"
            refused.append(Refusal(folder.name, entry.name, reason))
            continue
        problem, path = _version(entry, real_root, config, allow_world_writable)
        if problem:
            refused.append(Refusal(folder.name, entry.name, problem))
        else:
            servable[int(entry.name)] = path
    return servable, refused


def _config(folder: Path, real_root: Path) -> ModelConfig:
    """The model's ``config.json``, or the defaults when it has none: a regular file in
    the repository, of at most ``CONFIG_BYTES``.

    :raises ValueError: naming the file and, for a field, the field; no file content.
    """
    path = folder / "config.json"
    if not os.path.lexists(path):
        return ModelConfig()
    if not _inside(path, real_root):
        raise ValueError("config.json: a link to outside the repository")
    try:
        with open(path, "rb", opener=_no_block) as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise ValueError("config.json: not a regular file")
            text = file.read(CONFIG_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"config.json: {exc.strerror or exc}") from None
    if len(text) > CONFIG_BYTES:
        raise ValueError(f"config.json: more than {CONFIG_BYTES} bytes")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
        raise ValueError("config.json: not JSON") from None
    return config_of(data, "config.json")


def overridden(config: ModelConfig, override: Mapping[str, Any]) -> ModelConfig:
    """``config`` (a model's ``config.json``) with each field ``override`` (a load's
    ``parameters.config``) sets in place of its own.

    :raises ValueError: naming the field: one of ``PINNED_FIELDS``, or not valid.
    """
    if not isinstance(override, Mapping):
        raise ValueError("parameters.config: the whole: must be a JSON object")
    for name in PINNED_FIELDS:
        if name in override:
            raise ValueError(
                f"parameters.config: {name}: set in the model's config.json only (it names "
                "the code to run or pins the files)"
            )
    base = config.model_dump(by_alias=True, exclude_unset=True)
    return config_of(base | dict(override), "parameters.config")


def config_of(data: object, source: str = "config") -> ModelConfig:
    """``data`` (a parsed ``config.json``, or a load's ``parameters.config``) checked.

    :raises ValueError: naming ``source`` and the field; no value quoted.
    """
    try:
        return ModelConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "the whole"
        problem = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        raise ValueError(f"{source}: {where}: {problem}") from None


def _no_block(path: str, flags: int) -> int:
    """``open``'s opener that never waits for a writer (a FIFO opens at once, and is then
    refused as not a regular file)."""
    return os.open(path, flags | os.O_NONBLOCK)


def _version(
    folder: Path, real_root: Path, config: ModelConfig, allow_world_writable: bool
) -> tuple[str, Path]:
    """``("", the path to serve)`` for a servable version folder, else ``(why, folder)``."""
    if not _inside(folder, real_root):
        return "a link to outside the repository", folder
    path = folder
    if config.class_ is None:
        files = sorted(
            p.name
            for p in _listed(folder)
            if p.suffix.lower() in EXTENSIONS and not p.name.startswith(".") and p.is_file()
        )
        if len(files) != 1:
            found = ", ".join(repr(f) for f in files) if files else "no model file"
            known = ", ".join(sorted(EXTENSIONS))
            return f"must hold exactly one model file ({known}); found {found}", folder
        path = folder / files[0]
        if not _inside(path, real_root):
            return "its model file is a link to outside the repository", folder
    if not allow_world_writable:
        try:
            trusted_path(path)
        except UnsafePath as exc:
            return _cut(str(exc)), folder
        except OSError as exc:
            return _cut(exc.strerror or str(exc)), folder
    return "", path


def _listed(folder: Path) -> list[Path]:
    """``folder``'s entries; none when it went away (or cannot be listed) meanwhile: as if
    gone, not a failure of the whole read."""
    try:
        return list(folder.iterdir())
    except OSError:
        return []


def _safe(name: str) -> bool:
    """Whether ``name`` is a model name URLs can carry."""
    return bool(re.fullmatch(NAME_PATTERN, name)) and not only_dots(name)


def _inside(path: Path, real_root: Path) -> bool:
    try:
        return path.resolve().is_relative_to(real_root)
    except (OSError, RuntimeError):  # a loop of links
        return False


def _cut(reason: str) -> str:
    line = " ".join(reason.split())
    return line if len(line) <= _REASON_CHARS else line[: _REASON_CHARS - 3] + "..."
