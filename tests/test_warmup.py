"""Warm-up (``serving.warmup``): the model's own examples where it has them, else invented
rows whose failure is logged and not fatal (issue 34: a free string column the server
filled with ``""`` stopped a model that serves every value it knows)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from prometheus_client import CollectorRegistry

from serving.errors import ModelLoadError
from serving.inputs.conform import conform
from serving.inputs.instances import Records
from serving.model.custom import python_handle
from serving.observe.metrics import ServingMetrics
from serving.runtime import ModelRuntime
from serving.settings import Settings
from serving.warmup import warm_up
from tests.models import FreePlan, FreePlanWithExamples
from tests.tabular import PLAN_ROWS, save_plan_with_mlflow, write_plan


def runtime_for(tmp_path: Path, **settings: Any) -> ModelRuntime:
    configured = Settings(workers=1, **settings)
    return ModelRuntime(configured.model_settings()[0], ServingMetrics(CollectorRegistry()))


def answers(runtime: ModelRuntime) -> list[float]:
    handle, _ = runtime.require_ready()
    batch = conform(Records(PLAN_ROWS), handle)
    return [float(p) for p in handle.predict_batch(batch)["predictions"]]


def test_warm_up_failure_on_invented_rows_of_a_free_string_logs_one_warning_and_serves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = write_plan(tmp_path)
    runtime = runtime_for(tmp_path, model_dir=tmp_path, model_class="tests.models:FreePlan")

    with caplog.at_level("WARNING", logger="serving.warmup"):
        runtime.load()

    assert runtime.state == "ready"
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "\n" not in warnings[0].getMessage()
    message = warnings[0].getMessage()
    assert "class tests.models:FreePlan" in message and "invented rows" in message
    assert "ValueError" in message and "unknown categories" in message
    np.testing.assert_allclose(answers(runtime), model.predict(pd.DataFrame(PLAN_ROWS)))


def test_warm_up_failure_on_invented_rows_of_a_joblib_pipeline_serves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = write_plan(tmp_path, schema=True)  # plan a string, no categories: "" invented
    runtime = runtime_for(tmp_path, model_path=tmp_path / "plan.joblib")

    with caplog.at_level("WARNING", logger="serving.warmup"):
        runtime.load()

    assert runtime.state == "ready"
    assert "joblib model 'plan'" in caplog.text and "unknown categories" in caplog.text
    np.testing.assert_allclose(answers(runtime), model.predict(pd.DataFrame(PLAN_ROWS)))


def test_warm_up_failure_on_invented_rows_keeps_the_outputs_the_model_names(
    tmp_path: Path,
) -> None:
    write_plan(tmp_path, schema=True)
    runtime = runtime_for(tmp_path, model_path=tmp_path / "plan.joblib")

    runtime.load()

    assert [spec.name for spec in runtime.outputs] == ["predictions"]


def test_warm_up_runs_the_classes_warmup_instances_repeated_to_each_size(
    tmp_path: Path,
) -> None:
    write_plan(tmp_path)
    model = FreePlanWithExamples()
    model.load(tmp_path)
    handle = python_handle(model, name="plan", version="1")

    outputs = warm_up(handle, (1, 3), "class FreePlanWithExamples")

    assert model.seen == [["pro"], ["pro", "team", "pro"], ["pro"]]  # sizes 1, 3; specs
    assert [spec.name for spec in outputs] == ["predictions"]


def test_warm_up_failure_on_the_models_own_examples_is_fatal(tmp_path: Path) -> None:
    write_plan(tmp_path)
    runtime = runtime_for(
        tmp_path, model_dir=tmp_path, model_class="tests.models:FreePlanWithBadExamples"
    )

    with pytest.raises(ModelLoadError) as info:
        runtime.load()

    message = str(info.value)
    assert "warm-up failed" in message and "its own examples (warmup_instances)" in message
    assert "class tests.models:FreePlanWithBadExamples" in message and "gold" in message
    assert runtime.state == "failed"


def test_warm_up_refuses_warmup_instances_that_do_not_fit_the_schema(tmp_path: Path) -> None:
    write_plan(tmp_path)
    model = FreePlan()
    model.load(tmp_path)
    model.warmup_instances = [{"plan": "pro"}]  # type: ignore[attr-defined]  # no seats
    handle = python_handle(model, name="plan", version="1")

    with pytest.raises(ModelLoadError, match=r"do not fit its input schema.*seats"):
        warm_up(handle, (1,), "class FreePlan")


@pytest.mark.parametrize("given", ["pro", [], [1, 2], {"plan": "pro"}])
def test_python_handle_refuses_warmup_instances_that_are_not_a_list_of_instances(
    given: Any,
) -> None:
    model = type("Given", (), {"predict": lambda self, rows: rows, "warmup_instances": given})()
    with pytest.raises(ModelLoadError, match="warmup_instances must be a non-empty list"):
        python_handle(model, name="m", version="1")


def test_warm_up_runs_mlflows_input_example_where_invented_rows_would_fail(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = write_plan(tmp_path, schema=True)  # the encoder refuses "", the plan invented
    saved = save_plan_with_mlflow(tmp_path / "plan", model, pd.DataFrame(PLAN_ROWS[:2]))
    runtime = runtime_for(tmp_path, model_path=saved)

    with caplog.at_level("WARNING", logger="serving.warmup"):
        runtime.load()

    assert runtime.state == "ready" and "invented rows" not in caplog.text
    assert runtime.handle is not None and runtime.handle.examples == tuple(PLAN_ROWS[:2])
    np.testing.assert_allclose(answers(runtime), model.predict(pd.DataFrame(PLAN_ROWS)))


def test_warm_up_failure_on_mlflows_input_example_is_fatal(tmp_path: Path) -> None:
    model = write_plan(tmp_path, schema=True)
    saved = save_plan_with_mlflow(tmp_path / "plan", model, pd.DataFrame(PLAN_ROWS[:1]))
    (saved.parent / "input_example.json").write_text(
        json.dumps({"columns": ["plan", "seats"], "data": [["gold", 1.0]]})
    )
    runtime = runtime_for(tmp_path, model_path=saved)

    with pytest.raises(ModelLoadError, match=r"called on its own examples \(MLflow's"):
        runtime.load()
