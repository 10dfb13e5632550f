"""A model's own example instances, for its warm-up (``serving.warmup``).

``mlflow_examples(folder)``: the input example MLflow saved with a model
(``save_model(..., input_example=frame)``): its ``MLmodel`` names the file under
``saved_input_example_info`` (``artifact_path``, ``input_example.json``), a pandas frame
as ``{"columns": [...], "data": [[...]]}`` (``pandas_orient: split``) or a list of records
(``records``). A custom class's ``warmup_instances`` are read in ``custom.py``.

Boundary: standard library and ``serving.errors``; PyYAML imported only to read an ``MLmodel`` file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from serving.errors import ModelLoadError

__all__ = ["EXAMPLE_FILE", "mlflow_examples", "saved_examples"]

#: What errors call examples read by ``saved_examples``.
EXAMPLE_FILE = "MLflow's input_example"


def saved_examples(source: Path) -> tuple[dict[str, Any], ...] | None:
    """``mlflow_examples`` of the folder ``source`` is (a directory) or is in (a file).

    :raises ModelLoadError: naming ``source``, when the example cannot be read.
    """
    try:
        return mlflow_examples(source if source.is_dir() else source.parent)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(source, str(exc)) from None


def mlflow_examples(folder: Path) -> tuple[dict[str, Any], ...] | None:
    """The instances of the input example MLflow saved in ``folder`` (one mapping of column
    to value each); None without an ``MLmodel``, without an example, or for an example
    that is not a pandas frame (a tensor's says nothing about columns).

    :raises ValueError: naming the file, when the ``MLmodel`` or the example cannot be
        read, or the example's path leaves ``folder``.
    """
    mlmodel = folder / "MLmodel"
    if not mlmodel.is_file():
        return None
    import yaml

    try:
        document = yaml.safe_load(mlmodel.read_text())
    except yaml.YAMLError:
        raise ValueError("MLmodel is not valid YAML") from None
    info = document.get("saved_input_example_info") if isinstance(document, dict) else None
    if not isinstance(info, dict) or info.get("type") != "dataframe":
        return None
    name = info.get("artifact_path")
    if not isinstance(name, str) or not (folder / name).resolve().is_relative_to(folder.resolve()):
        raise ValueError(f"MLmodel's input example {name!r} is not a file in the model's folder")
    try:
        frame = json.loads((folder / name).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"MLmodel's input example {name}: {type(exc).__name__}") from None
    return _records(frame, name)


def _records(frame: Any, name: str) -> tuple[dict[str, Any], ...]:
    """A split (``columns``, ``data``) or records frame as records.

    :raises ValueError: for anything else, or an empty frame.
    """
    if isinstance(frame, dict) and isinstance(frame.get("columns"), list):
        columns, data = frame["columns"], frame.get("data")
        if isinstance(data, list) and all(
            isinstance(row, list) and len(row) == len(columns) for row in data
        ):
            frame = [dict(zip(columns, row, strict=True)) for row in data]
    if isinstance(frame, list) and frame and all(isinstance(r, dict) for r in frame):
        return tuple(frame)
    raise ValueError(f"MLmodel's input example {name} is not a non-empty pandas frame")
