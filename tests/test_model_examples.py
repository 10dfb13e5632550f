"""A model's own examples (``serving.model.examples``): the input example MLflow saved."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from serving.errors import ModelLoadError
from serving.model.examples import mlflow_examples, saved_examples
from tests.tabular import PLAN_ROWS, save_plan_with_mlflow, write_plan

EXAMPLE_INFO = """saved_input_example_info:
  artifact_path: {name}
  pandas_orient: split
  type: {kind}
"""


def write_mlmodel(folder: Path, name: str = "input_example.json", kind: str = "dataframe") -> None:
    folder.mkdir(exist_ok=True)
    (folder / "MLmodel").write_text(EXAMPLE_INFO.format(name=name, kind=kind))


def test_mlflow_examples_reads_the_input_example_mlflow_saved(tmp_path: Path) -> None:
    model = write_plan(tmp_path)
    saved = save_plan_with_mlflow(tmp_path / "plan", model, pd.DataFrame(PLAN_ROWS[:2]))

    assert mlflow_examples(saved.parent) == tuple(PLAN_ROWS[:2])
    assert saved_examples(saved) == tuple(PLAN_ROWS[:2])  # a file: its folder's


def test_mlflow_examples_reads_records_too(tmp_path: Path) -> None:
    write_mlmodel(tmp_path)
    (tmp_path / "input_example.json").write_text(json.dumps(PLAN_ROWS))

    assert mlflow_examples(tmp_path) == tuple(PLAN_ROWS)


def test_mlflow_examples_is_none_without_an_mlmodel_an_example_or_a_frame(
    tmp_path: Path,
) -> None:
    assert mlflow_examples(tmp_path) is None
    (tmp_path / "MLmodel").write_text("flavors: {}\n")
    assert mlflow_examples(tmp_path) is None
    write_mlmodel(tmp_path, kind="ndarray")  # a tensor's example names no columns
    assert mlflow_examples(tmp_path) is None


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("../outside.json", "[]", "not a file in the model's folder"),
        ("input_example.json", "{not json", "JSONDecodeError"),
        ("input_example.json", '{"columns": ["plan"], "data": []}', "not a non-empty"),
        ("input_example.json", '{"columns": ["plan"], "data": [[1, 2]]}', "not a non-empty"),
    ],
)
def test_saved_examples_refuses_an_example_it_cannot_read_naming_the_model(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    folder = tmp_path / "model"
    write_mlmodel(folder, name=name)
    (folder / name).write_text(text)

    with pytest.raises(ModelLoadError, match=message) as info:
        saved_examples(folder / "model.pkl")
    assert "model.pkl" in str(info.value)
