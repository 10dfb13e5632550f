"""Typed instances against real models: answers equal the in-process model's, bad values
are 422s naming the instance and feature, and a bad body costs no more than a good one."""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from serving.errors import InvalidInput
from serving.inputs.conform import conform
from serving.inputs.instances import Columns, Frame, Records, Tensors
from serving.model.handle import ModelHandle
from serving.model.loaders import load_model
from tests.onnx_graphs import int_identity_graph
from tests.tabular import churn_rows, frame_of, hgb_with_missing, write_churn


@pytest.fixture(scope="module")
def churn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ModelHandle, ModelHandle, Path]:
    model, joblib_path, onnx_path = write_churn(tmp_path_factory.mktemp("churn"))
    return model, load_model(joblib_path), load_model(onnx_path), onnx_path


def _refused(instances: Any, handle: ModelHandle) -> dict[str, Any]:
    with pytest.raises(InvalidInput) as caught:
        conform(instances, handle)
    assert len(caught.value.details) == 1
    detail: dict[str, Any] = caught.value.details[0]
    return detail


def test_conform_churn_records_answer_as_the_pipeline_on_a_dataframe(churn: Any) -> None:
    model, handle, _, _ = churn
    rows = churn_rows()

    outputs = handle.predict_batch(conform(Records(rows), handle))

    expected = model.predict_proba(frame_of(rows))
    np.testing.assert_array_equal(outputs["predictions"], model.predict(frame_of(rows)))
    np.testing.assert_allclose(outputs["probabilities"], expected, rtol=0, atol=1e-9)


def test_conform_frame_columns_and_tensors_give_the_same_batch(churn: Any) -> None:
    _, handle, _, _ = churn
    rows = churn_rows()[:5]
    names = ["usage_hours", "seats", "region", "plan"]  # not the model's order
    frame = Frame([[row[n] for n in names] for row in rows], names, "dataframe_split.data")
    columns = Columns({n: [row[n] for row in rows] for n in names}, len(rows))
    tensors = Tensors([(n, np.array([row[n] for row in rows], dtype=object)) for n in names])

    expected = conform(Records(rows), handle)
    for instances in (frame, columns, tensors):
        batch = conform(instances, handle)
        assert batch.dtype == expected.dtype
        assert repr(batch.tolist()) == repr(expected.tolist())  # NaN equal to NaN


def test_conform_onnx_string_inputs_answer_as_onnxruntime(churn: Any) -> None:
    _, _, handle, path = churn
    rows = churn_rows()

    outputs = handle.predict_batch(conform(Records(rows), handle))

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {
        name: np.array([[row[name]] for row in rows], dtype=object) for name in ("plan", "region")
    } | {
        name: np.array([[np.nan if row[name] is None else row[name]] for row in rows], "f4")
        for name in ("seats", "usage_hours")
    }
    labels, probabilities = session.run(None, feeds)
    np.testing.assert_array_equal(outputs["predictions"], labels)
    np.testing.assert_array_equal(outputs["probabilities"], probabilities)


@pytest.mark.parametrize(
    ("change", "loc", "kind", "words"),
    [
        ({"plan": "gold"}, "instances[0].plan", "unknown_category", "unknown category 'gold'"),
        ({"plan": None}, "instances[0].plan", "missing_value", "this feature may not be missing"),
        (
            {"plan": 3},
            "instances[0].plan",
            "string_type",
            "3 is not a string (the feature is categorical)",
        ),
        # from the new-user trial: a string column taking any value is not 'categorical'
        (
            {"region": 3},
            "instances[0].region",
            "string_type",
            "3 is not a string (the feature is a string column)",
        ),
        ({"usage_hours": "12"}, "instances[0].usage_hours", "float_type", "'12' is not a number"),
        ({"seats": 1e999}, "instances[0].seats", "finite_number", "Infinity is not a finite"),
        ({"plan": False}, "instances[0].plan", "string_type", "false is not a string"),
    ],
)
def test_conform_refuses_a_bad_value_naming_instance_and_feature(
    churn: Any, change: dict[str, Any], loc: str, kind: str, words: str
) -> None:
    _, handle, graph, _ = churn
    rows = [churn_rows()[0] | change]
    for model in (handle, graph):
        detail = _refused(Records(rows), model)
        assert (detail["loc"], detail["type"]) == (loc, kind)
        assert words in detail["msg"]


def test_conform_takes_true_as_one_only_where_the_number_type_was_guessed(churn: Any) -> None:
    # scikit-learn keeps no column types: a column it takes as numbers may have been a bool
    # column, and true/false are 1/0 to it; an ONNX graph's float input is typed.
    _, handle, graph, _ = churn
    rows = [churn_rows()[0] | {"usage_hours": True}]

    detail = _refused(Records(rows), graph)
    batch = conform(Records(rows), handle)

    assert (detail["loc"], detail["type"]) == ("instances[0].usage_hours", "float_type")
    assert "true is not a number" in detail["msg"]
    assert batch["usage_hours"][0] == 1.0 if batch.dtype.names else 1.0 in batch[0]


def test_conform_refuses_a_bad_tensor_value_naming_the_input(churn: Any) -> None:
    _, handle, graph, _ = churn
    rows = churn_rows()[:2]
    names = ["usage_hours", "seats", "plan", "region"]  # the request's own order
    values = {n: [row[n] for row in rows] for n in names} | {"plan": [rows[0]["plan"], "gold"]}
    tensors = Tensors([(n, np.array(values[n], dtype=object)) for n in names])
    for model in (handle, graph):
        with pytest.raises(InvalidInput) as caught:
            conform(tensors, model)
        assert caught.value.details[0]["loc"] == "inputs[2].data[1]"
        assert caught.value.message.startswith("inputs[2].data[1]: input 'plan': unknown category")


def test_conform_refuses_objects_with_too_few_keys_for_a_model_without_names() -> None:
    # Found by the schemathesis fuzz: MLflow's "instances" as objects, keys taken in
    # order for a model that knows no feature names, 5 keys for 30 features was a 500.
    handle = load_model(Path("serving/demo/breast_cancer.joblib"))
    records = Records([{"a": None, "b": 1.0, "c": 2.0, "d": 3.0, "e": 4.0}], unnamed="key_order")

    detail = _refused(records, handle)

    assert (detail["loc"], detail["type"]) == ("instances[0]", "feature_count")
    assert detail["msg"] == "expected 30 features, got 5"


def test_conform_missing_values_reach_a_model_built_for_them() -> None:
    from serving.model.loaders import estimator_handle

    model, _ = hgb_with_missing()

    handle = estimator_handle(model, name="hgb", version="1", format="joblib")
    rows = [{"tenure": None, "spend": 10.0}, {"tenure": 30.5, "spend": None}]

    outputs = handle.predict_batch(conform(Records(rows), handle))

    expected = model.predict_proba(frame_of_numbers(rows))
    np.testing.assert_allclose(outputs["probabilities"], expected, rtol=0, atol=1e-12)


def frame_of_numbers(rows: list[dict[str, Any]]) -> Any:
    import pandas as pd

    return pd.DataFrame(rows, dtype=float)


@pytest.mark.parametrize("value", [2**53 + 1, 2**63 - 1, -(2**63)])
def test_conform_int64_values_reach_the_graph_exactly(tmp_path: Path, value: int) -> None:
    handle = load_model(int_identity_graph(tmp_path / "int.onnx"))
    for instances in (Frame([[value]]), Records([{"x": value}]), Columns({"x": [value]}, 1)):
        batch = conform(instances, handle)
        assert batch.dtype == np.int64
        assert handle.predict_batch(batch)["predictions"].tolist() == [value]


@pytest.mark.parametrize("value", [2**63, 2.5, 1e19, True])
def test_conform_int64_refuses_what_the_input_cannot_hold(tmp_path: Path, value: Any) -> None:
    handle = load_model(int_identity_graph(tmp_path / "int.onnx"))
    detail = _refused(Frame([[1], [value]]), handle)
    assert detail["loc"] == "instances[1][0]"
    assert detail["type"] in ("out_of_range", "integer_type")


def test_conform_a_body_of_bad_values_reports_one_and_costs_no_more_than_a_good_one(
    churn: Any,
) -> None:
    _, handle, _, _ = churn
    good = [{"plan": "pro", "region": "emea", "seats": 3, "usage_hours": 1.5}] * 25_000
    bad = [
        {"plan": 1, "region": 2, "seats": "x", "usage_hours": "y"}
    ] * 25_000  # 100,000 bad values

    def peak(instances: Records) -> int:
        tracemalloc.start()
        try:
            conform(instances, handle)
        except InvalidInput as exc:
            assert len(exc.details) == 1
        finally:
            _, top = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        return top

    assert peak(Records(bad)) <= peak(Records(good))


@pytest.mark.parametrize(
    ("instances", "loc"),
    [
        (Frame([[1.0] * 30, [1e39] + [1.0] * 29]), "instances[1][0]"),
        (Frame([[1.0] * 30, [1e39] + [1.0] * 29], field="inputs"), "inputs[1][0]"),
        (Tensors([("X", np.array([[1.0] * 30, [1e39] + [1.0] * 29]))]), "inputs[0].data[1][0]"),
    ],
)
def test_conform_refuses_a_value_outside_a_float32_graphs_range(instances: Any, loc: str) -> None:
    from serving.settings import DEMO_MODEL_PATH

    handle = load_model(DEMO_MODEL_PATH.with_suffix(".onnx"))
    detail = _refused(instances, handle)
    assert (detail["loc"], detail["type"]) == (loc, "out_of_range")
    assert detail["msg"].startswith("1e+39 is outside the model's float32 range")


@pytest.mark.parametrize("instances", [Records([{}], unnamed="key_order"), Frame([[]])])
def test_conform_an_empty_instance_is_422_for_a_model_of_unknown_width(instances: Any) -> None:
    handle = ModelHandle.from_callable(lambda X: X[:, 0], name="any", version="1")
    detail = _refused(instances, handle)
    assert (detail["loc"], detail["type"]) == ("instances[0]", "too_short")


def test_conform_a_positional_row_names_the_feature_of_a_bad_value_and_the_columns_it_lacks(
    churn: Any,
) -> None:
    """Found by the new-user trial: a positional row (``instances: [[...]]``) of the wrong
    type named its position only, and one of the wrong length did not say the columns."""
    _, handle, _, _ = churn
    names = handle.feature_names
    row = [churn_rows()[0][name] for name in names]
    bad = list(row)
    bad[names.index("seats")] = "many"

    detail = _refused(Frame([bad], None, "instances"), handle)
    short = _refused(Frame([row[:-1]], None, "instances"), handle)

    assert detail["loc"] == f"instances[0][{names.index('seats')}] (feature 'seats')"
    assert short["loc"] == "instances[0]"
    with pytest.raises(InvalidInput) as caught:
        conform(Frame([row[:-1]], None, "instances"), handle)
    assert f"the model expects {len(names)}: {', '.join(names)}" in str(caught.value)
