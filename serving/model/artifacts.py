"""Model artifacts on disk, before any loader runs: which file a path or a directory
names, its format from its extension, and its bytes read once and checked (mode, SHA-256).

Boundary: standard library only; nothing in an artifact runs here.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from serving.errors import ModelLoadError

__all__ = ["EXTENSIONS", "check_artifact", "find_artifact", "format_from_path", "model_name"]


def check_artifact(
    path: Path, sha256: str | None = None, allow_world_writable: bool = False
) -> bytes:
    """Read the artifact once and refuse it before anything in it runs; its bytes.

    The checks and the load see the same bytes: the caller loads what this returns
    (``load_model(..., data=...)``), never the path again, so a file swapped after the
    check is not what gets unpickled.

    :param sha256: expected hex digest of the file (``SERVING_MODEL_SHA256``), or None.
    :param allow_world_writable: load a file any local user may rewrite (pickle and joblib
        run code on load, so by default such a file is refused; checked on the open file).
    :raises ModelLoadError: when the file cannot be read, is world-writable (and not
        allowed) or its digest differs, naming the path and both digests.
    """
    try:
        with path.open("rb") as file:
            mode = os.fstat(file.fileno()).st_mode
            if not allow_world_writable and mode & stat.S_IWOTH:
                raise ModelLoadError(
                    path, "the file is world-writable; fix its mode or set "
                    "SERVING_ALLOW_WORLD_WRITABLE_MODEL=true",
                )  # fmt: skip
            data = file.read()
    except OSError as exc:
        raise ModelLoadError(path, exc.strerror or str(exc)) from None
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
