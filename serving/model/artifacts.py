"""Model artifacts on disk, before any loader runs: which file a path or a directory
names, its format from its extension, whether anyone but root and the server's user can
replace it (``trusted_path``), and its bytes read once and checked (SHA-256); a
``SERVING_MODELS`` file, checked the same way (``read_model_list``).

Boundary: standard library and ``serving.model.schema`` (where a schema file lies);
nothing in an artifact runs here.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

from serving.errors import ModelLoadError
from serving.model.schema import schema_file

__all__ = [
    "EXTENSIONS",
    "UnsafePath",
    "artifact_of",
    "check_artifact",
    "check_format",
    "check_model_path",
    "file_identity",
    "find_artifact",
    "format_from_path",
    "model_name",
    "read_model_list",
    "tree_sha256",
    "trusted_path",
]

#: ``SERVING_ALLOW_WORLD_WRITABLE_MODEL``: how a refusal of a model's own files says to skip it.
_ALLOW_HINT = (
    ", or set SERVING_ALLOW_WORLD_WRITABLE_MODEL=true if every user who can write there is trusted"
)
_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH
_MAX_LINKS = 40  # Linux's MAXSYMLINKS


class UnsafePath(ValueError):
    """A file, or a directory or symlink on the way to it, that a user other than root and
    the server's own may replace: whoever can, chooses what the server reads.

    :param path: the file as configured. :param culprit: the entry at fault.
    :param problem: why, with its mode or owner. :param fix: a command that fixes it.
    """

    def __init__(self, path: Path, culprit: Path, problem: str, fix: str) -> None:
        self.path, self.culprit, self.problem, self.fix = path, culprit, problem, fix
        super().__init__(f"{problem}; fix: {fix}")


def trusted_path(path: Path) -> tuple[Path, os.stat_result]:
    """Resolve ``path`` as the kernel would, refusing it unless only root and this
    process's (effective) user can change what it names; its real path and ``lstat``.

    Every entry walked through (``/``, each directory, each symlink and its target's
    chain, the file) must be owned by root or this user; directories must not be group-
    or world-writable unless sticky (``/tmp``: there only an entry's owner may rename it,
    and the owner is checked), and the file not group- or world-writable. OpenSSH's
    ``StrictModes`` (``safe_path``) applies the same rule to ``authorized_keys``.

    :raises UnsafePath: naming the entry, its mode or owner, and the fix.
    :raises OSError: when an entry is missing, unreadable, or a symlink loops.
    """
    uids = (0, os.geteuid())
    current = Path("/")
    info = os.lstat(current)
    _check_entry(path, current, info, uids)
    todo = list(reversed(path.absolute().parts[1:]))  # a stack: the next name last
    links = 0
    while todo:
        name = todo.pop()
        if name == "..":
            current = current.parent  # ``current`` is real: its parents are checked
            info = os.lstat(current)
            continue
        entry = current / name
        info = os.lstat(entry)
        _check_entry(path, entry, info, uids)
        if stat.S_ISLNK(info.st_mode):
            links += 1
            if links > _MAX_LINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(path))
            target = Path(os.readlink(entry))
            if target.is_absolute():
                current, target = Path("/"), target.relative_to("/")
            todo.extend(reversed(target.parts))
            continue
        if todo and not stat.S_ISDIR(info.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(entry))
        current = entry
    return current, info


def _check_entry(path: Path, entry: Path, info: os.stat_result, uids: tuple[int, int]) -> None:
    mode = info.st_mode
    kind = "directory" if stat.S_ISDIR(mode) else "symlink" if stat.S_ISLNK(mode) else "file"
    shown = f"{kind} {entry}" + ("" if entry == path else f" (on the way to {path})")
    if info.st_uid not in uids:
        user = "root" if uids[1] == 0 else f"root or uid {uids[1]} (this server's user)"
        raise UnsafePath(
            path, entry, f"{shown} is owned by uid {info.st_uid}, who can replace it, not by "
            f"{user}", f"chown {uids[1]} {entry}",
        )  # fmt: skip
    if stat.S_ISLNK(mode) or not mode & _WRITABLE_BY_OTHERS:
        return
    if stat.S_ISDIR(mode) and mode & stat.S_ISVTX:
        return  # sticky: only an entry's owner may rename it, and owners are checked
    perms = f"mode {stat.S_IMODE(mode):04o}"
    if stat.S_ISDIR(mode):
        raise UnsafePath(
            path, entry, f"{shown} is group- or world-writable ({perms}) and not sticky, so "
            "other users can put their own file in place of what it holds",
            f"chmod go-w {entry} (or chmod +t {entry})",
        )  # fmt: skip
    raise UnsafePath(
        path, entry, f"{shown} is group- or world-writable ({perms})", f"chmod go-w {entry}"
    )


def check_model_path(path: Path, allow_world_writable: bool = False) -> None:
    """Refuse a model's file or directory (a python model's class reads it) that others
    may replace (``trusted_path``); nothing when ``allow_world_writable``.

    :raises ModelLoadError: naming the path, the entry at fault, why and the fix.
    """
    if allow_world_writable:
        return
    try:
        trusted_path(path)
    except UnsafePath as exc:
        raise ModelLoadError(path, f"{exc}{_ALLOW_HINT}") from None
    except OSError as exc:
        raise ModelLoadError(path, _os_reason(path, exc)) from None


def _os_reason(path: Path, exc: OSError) -> str:
    """``exc`` in words, naming the entry when it is not ``path`` itself."""
    reason = exc.strerror or str(exc)
    return reason if exc.filename in (None, str(path)) else f"{exc.filename}: {reason}"


def check_artifact(
    path: Path, sha256: str | None = None, allow_world_writable: bool = False
) -> bytes:
    """Read the artifact once and refuse it before anything in it runs; its bytes.

    Pickle and joblib files run code when loaded, so the file, every directory above it
    and any symlink on the way must be replaceable by root and this server's user only
    (``trusted_path``), and so must the schema file a loader reads beside it
    (``<stem>.schema.json`` or ``MLmodel``). ONNX files hold a graph, not code, but are
    checked the same way: whoever can replace one chooses the predictions. The checks
    and the load see the same bytes: the caller loads what this returns
    (``load_model(..., data=...)``), never the path again, and the file opened is the one
    checked (same device and inode).

    :param sha256: expected hex digest of the file (``SERVING_MODEL_SHA256``), or None.
    :param allow_world_writable: skip the owner and mode checks
        (``SERVING_ALLOW_WORLD_WRITABLE_MODEL``), for a directory only trusted users share.
    :raises ModelLoadError: when the file cannot be read, is not a regular file, others
        may replace it or its schema file (naming the entry, its mode or owner, and the
        fix), or its digest differs, naming the path and both digests.
    """
    checked: os.stat_result | None = None
    real = path
    try:
        if not allow_world_writable:
            real, checked = trusted_path(path)
            schema = schema_file(path)
            if schema is not None:
                trusted_path(schema)
        with real.open("rb") as file:
            opened = os.fstat(file.fileno())
            if not stat.S_ISREG(opened.st_mode):
                raise ModelLoadError(path, "not a regular file")
            if checked is not None and (opened.st_dev, opened.st_ino) != (
                checked.st_dev, checked.st_ino,
            ):  # fmt: skip
                raise ModelLoadError(path, "the file was replaced while it was checked")
            data = file.read()
    except UnsafePath as exc:
        raise ModelLoadError(path, f"{exc}{_ALLOW_HINT}") from None
    except OSError as exc:
        raise ModelLoadError(path, _os_reason(path, exc)) from None
    if sha256 is not None:
        digest = hashlib.sha256(data).hexdigest()
        if digest != sha256.lower():
            raise ModelLoadError(
                path,
                f"SHA-256 is {digest}, but {sha256.lower()} is expected "
                "(SERVING_MODEL_SHA256, or the sha256 of its SERVING_MODELS entry)",
            )
    return data


EXTENSIONS = {
    ".pkl": "pickle",
    ".pickle": "pickle",
    ".joblib": "joblib",
    ".skops": "skops",
    ".onnx": "onnx",
}


def file_identity(path: Path | None) -> tuple[int, ...] | None:
    """A model file's device, inode, size, mtime and ctime (a file renamed over it, or
    written in place, is another), or None when it has no path or cannot be looked at
    (then it is read again)."""
    if path is None:
        return None
    try:
        info = path.stat()
    except OSError:
        return None
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def tree_sha256(path: Path) -> str:
    """The SHA-256 of what a loader that reads ``path`` itself reads, hex: a file's bytes;
    a folder's manifest: a ``<sha256>  ./<path>`` line for each regular file under it
    (links not followed), sorted by path bytewise, as ``sha256sum`` writes them, so that
    ``find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum`` in the
    folder gives the same digest. Reads every file once (about 1 GB/s).

    :raises OSError: when a file cannot be read.
    """
    if not path.is_dir():
        return _file_sha256(path)
    lines = []
    for directory, _, names in os.walk(path):
        for name in names:
            file = Path(directory, name)
            if file.is_symlink() or not file.is_file():
                continue
            relative = "./" + file.relative_to(path).as_posix()
            lines.append((os.fsencode(relative), _file_sha256(file)))
    manifest = b"".join(f"{digest}  ".encode() + name + b"\n" for name, digest in sorted(lines))
    return hashlib.sha256(manifest).hexdigest()


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def format_from_path(path: Path) -> str:
    """The format implied by ``path``'s extension: ``.pkl``/``.pickle``, ``.joblib``,
    ``.skops``, ``.onnx``.

    :raises ValueError: when the extension is none of these.
    """
    try:
        return EXTENSIONS[path.suffix.lower()]
    except KeyError:
        known = ", ".join(sorted(EXTENSIONS))
        raise ValueError(
            f"cannot tell the format of {path.name!r} from its extension (known: {known}); "
            "set SERVING_MODEL_FORMAT to pickle, joblib, skops or onnx"
        ) from None


def find_artifact(directory: Path) -> Path:
    """The one model artifact in ``directory`` (KServe's ``/mnt/models``, where its storage
    initializer puts ``storageUri``): the only file, not counting hidden ones, with an
    extension ``format_from_path`` knows; subdirectories are not searched.

    :raises ValueError: when there is none or more than one, naming what was found.
    """
    files = sorted(
        path
        for path in directory.iterdir()
        if path.suffix.lower() in EXTENSIONS and not path.name.startswith(".") and path.is_file()
    )
    if len(files) == 1:
        return files[0]
    known = ", ".join(sorted(EXTENSIONS))
    found = ", ".join(repr(path.name) for path in files) or "none"
    raise ValueError(
        f"{directory} must hold exactly one model file ({known}); found {found}. Name the "
        "file with SERVING_MODEL_PATH instead, or set SERVING_MODEL_CLASS for a directory "
        "your own class reads"
    )


def model_name(path: Path) -> str:
    """The name a model is served under when none is given: the folder's name for a model
    saved by MLflow (an ``MLmodel`` file beside it: MLflow names the file ``model.*``),
    else the file's stem (``breast_cancer`` for the demo)."""
    if (path.parent / "MLmodel").is_file() and path.parent.name:
        return path.parent.name
    return path.stem


def check_format(
    path: Path | None, fmt: str | None, class_path: str | None, sha256: str | None = None
) -> None:
    """Refuse a model whose format cannot be known or contradicts its class.

    :raises ValueError: naming the problem: no class for format python, a class with another
        format, no single artifact in a directory, an unknown extension, or a SHA-256 for a
        directory a class reads (a digest pins one file).
    """
    if sha256 is not None and class_path is not None and path is not None and path.is_dir():
        raise ValueError("a SHA-256 pins one file; a class reading a directory has none")
    if class_path is not None and fmt not in (None, "python"):
        raise ValueError(f"a model class is set, so the format is python, not {fmt}")
    if fmt == "python" and class_path is None:
        raise ValueError("format python needs SERVING_MODEL_CLASS (or class in SERVING_MODELS)")
    if path is None or fmt == "python" or class_path is not None:
        return
    artifact = find_artifact(path) if path.is_dir() else path  # ValueError naming the files
    if fmt is None:
        format_from_path(artifact)  # raises ValueError naming the extension


def artifact_of(path: Path, model_class: str | None) -> Path:
    """The artifact a configured ``path`` serves: itself, or for a directory the one
    artifact in it, unless a python model's class reads the directory itself.

    :raises ValueError: naming what a directory holds when it is not exactly one artifact.
    """
    if path.is_dir() and model_class is None:
        return find_artifact(path)
    return path


#: JSON's literal names: as ``SERVING_MODELS``, no list of models (not a file name).
_JSON_WORDS = ("null", "true", "false")


def read_model_list(value: str) -> Any:
    """``SERVING_MODELS`` as JSON: the value itself (a list), or the file it names,
    checked as a model file is (``trusted_path``: it names the pickles to run).

    :raises ValueError: for ``null`` (no list of models), a file that is unsafe or cannot
        be read, or text that is not JSON.
    """
    if value.strip() in _JSON_WORDS:
        raise ValueError(f"{value.strip()} is no list of models: unset it for one model")
    try:
        if value.lstrip().startswith(("[", "{")):
            return json.loads(value)
        real, _ = trusted_path(Path(value))
        return json.loads(real.read_text())
    except UnsafePath as exc:
        raise ValueError(f"the file {value}: {exc}") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"neither a JSON list nor a readable JSON file: {exc}") from None
