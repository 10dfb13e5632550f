"""serving/inputs/rules.py: a client's extra columns and numbers sent as strings, per protocol:
refused by default on /predict, V2 and TF Serving (SERVING_EXTRA_COLUMNS=ignore takes
them as scikit-learn does), MLflow's scoring server's rules on /invocations. Every answer
is compared with the churn pipeline called in-process on the same rows."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient
from prometheus_client import CollectorRegistry

from serving.app import create_app
from serving.inputs.rules import Rules, check_names
from serving.model.loaders import load_model
from serving.observe.metrics import ServingMetrics
from serving.settings import Settings
from tests.tabular import churn_rows, frame_of, write_churn

COLUMNS = ["plan", "region", "seats", "usage_hours"]


@pytest.fixture(scope="module")
def churn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    model, path, _ = write_churn(tmp_path_factory.mktemp("churn"))
    return model, path


def served(settings: Settings, path: Path, **overrides: Any) -> Iterator[FlaskClient]:
    configured = Settings(**{
        **settings.model_dump(), "max_body_bytes": 65536, "max_instances_per_request": 64,
        **overrides,
    })  # fmt: skip
    app = create_app(
        configured, models=[load_model(path)], metrics=ServingMetrics(CollectorRegistry())
    )
    try:
        yield app.test_client()
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)


@pytest.fixture
def strict(settings: Settings, churn: tuple[Any, Path]) -> Iterator[FlaskClient]:
    yield from served(settings, churn[1])


@pytest.fixture
def lenient(settings: Settings, churn: tuple[Any, Path]) -> Iterator[FlaskClient]:
    yield from served(settings, churn[1], extra_columns="ignore")


def with_extra(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"customer_id": 1000 + i, **row} for i, row in enumerate(rows)]


def test_rules_extra_key_is_refused_by_default_naming_it(strict: FlaskClient) -> None:
    answer = strict.post("/predict", json={"instances": with_extra(churn_rows())})

    assert answer.status_code == 422
    assert "instances[0].customer_id" in answer.get_json()["error"]["message"]


def test_rules_extra_columns_ignored_answer_as_the_pipeline_on_predict_tf_and_v2(
    lenient: FlaskClient, churn: tuple[Any, Path], caplog: pytest.LogCaptureFixture
) -> None:
    model, _ = churn
    rows = churn_rows()
    labels = model.predict(frame_of(rows)).tolist()
    extra = with_extra(rows)

    def tensor(name: str, datatype: str, data: list[Any]) -> dict[str, Any]:
        return {"name": name, "shape": [len(data)], "datatype": datatype, "data": data}

    v2 = {
        "inputs": [
            *(tensor(c, "BYTES", [r[c] for r in rows]) for c in ("plan", "region")),
            *(tensor(c, "FP64", [r[c] for r in rows]) for c in ("seats", "usage_hours")),
            tensor("customer_id", "INT64", list(range(len(rows)))),
        ]
    }
    columns = {c: [r[c] for r in extra] for c in ["customer_id", *COLUMNS]}

    with caplog.at_level(logging.INFO, logger="serving.dataplane"):
        answers = {
            "predict": lenient.post("/predict", json={"instances": extra}),
            "predict again": lenient.post("/predict", json={"instances": extra}),
            "tf rows": lenient.post("/v1/models/churn:predict", json={"instances": extra}),
            "tf columns": lenient.post("/v1/models/churn:predict", json={"inputs": columns}),
            "v2": lenient.post("/v2/models/churn/infer", json=v2),
        }

    for name, answer in answers.items():
        assert answer.status_code == 200, (name, answer.get_data(as_text=True))
    assert answers["predict"].get_json()["predictions"] == labels
    assert [p["predictions"] for p in answers["tf rows"].get_json()["predictions"]] == labels
    assert answers["tf columns"].get_json()["outputs"]["predictions"] == labels
    assert answers["v2"].get_json()["outputs"][0]["data"] == labels
    said = [r.getMessage() for r in caplog.records if "ignoring 'customer_id'" in r.getMessage()]
    assert len(said) == 1  # once per model and name, not per request


def test_rules_invocations_follow_mlflow_extra_columns_and_numbers_as_strings(
    strict: FlaskClient, churn: tuple[Any, Path]
) -> None:
    """MLflow's scoring server drops columns its signature does not name and converts by
    it: an extra customer_id and "12" for seats are answered, as in-process."""
    model, _ = churn
    rows = churn_rows()
    labels = model.predict(frame_of(rows)).tolist()
    texts = [{**row, "seats": None if row["seats"] is None else str(row["seats"])} for row in rows]
    split = {
        "columns": ["customer_id", *COLUMNS],
        "data": [[i, *(r[c] for c in COLUMNS)] for i, r in enumerate(texts)],
    }

    records = strict.post("/invocations", json={"dataframe_records": with_extra(texts)})
    frame = strict.post("/invocations", json={"dataframe_split": split})
    columnar = strict.post(
        "/invocations", json={"inputs": {c: [r[c] for r in with_extra(texts)] for c in
                                         ["customer_id", *COLUMNS]}}
    )  # fmt: skip
    bad = strict.post("/invocations", json={"dataframe_records": [{**texts[0], "seats": "1e999"}]})

    for answer in (records, frame, columnar):
        assert answer.status_code == 200, answer.get_data(as_text=True)
        assert answer.get_json()["predictions"] == labels
    assert bad.status_code == 422
    assert "seats" in bad.get_json()["message"]


def test_rules_an_extra_column_after_the_models_in_order_is_dropped_too(
    strict: FlaskClient, churn: tuple[Any, Path]
) -> None:
    """Found by the new-user trial: an extra column after the model's own, which came in
    the model's order, reached the model (422 'has 5 features; the model expects 4') on
    dataframe_split and CSV, while the same column first or in the middle was dropped."""
    model, _ = churn
    rows = [row for row in churn_rows() if None not in row.values()]
    labels = model.predict(frame_of(rows)).tolist()
    split = {
        "columns": [*COLUMNS, "customer_id"],
        "data": [[*(r[c] for c in COLUMNS), 1000 + i] for i, r in enumerate(rows)],
    }
    csv = (
        ",".join(split["columns"])
        + "\n"
        + "\n".join(",".join(str(v) for v in line) for line in split["data"])
    )

    frame = strict.post("/invocations", json={"dataframe_split": split})
    text = strict.post("/invocations", data=csv, headers={"Content-Type": "text/csv"})

    for answer in (frame, text):
        assert answer.status_code == 200, answer.get_data(as_text=True)
        assert answer.get_json()["predictions"] == labels


def test_rules_missing_feature_names_what_was_given_instead() -> None:
    """From the new-user trial: a misspelt column said only 'missing feature'."""
    with pytest.raises(Exception, match=r"missing feature 'seats'; given but unknown: 'seets'"):
        check_names(["plan", "seets"], ["plan", "seats"], "dataframe_split.columns", "feature")
    ignored: list[str] = []
    kept = check_names(
        ["plan", "x", "seats"], ["plan", "seats"], "loc", "feature",
        Rules(extra="ignore", on_ignored=ignored.append),
    )  # fmt: skip
    assert kept == ["plan", "seats"] and ignored == ["x"]


def test_rules_several_missing_features_are_named_up_to_five_with_a_count() -> None:
    """From the new-user trial: 'missing feature 'make' (and 5 more); given but unknown:
    'vehicle_type', 'state', 'driver_age'' hid the other missing names, and cut the
    unknown ones with no count."""
    names = ["make", "model", "year", "mileage_km", "fuel", "doors", "color"]
    given = ["vehicle_type", "state", "driver_age", "a", "b", "c", "d"]
    with pytest.raises(Exception) as caught:
        check_names(given, names, "instances[0]", "feature")
    assert str(caught.value) == (
        "instances[0]: missing features 'make', 'model', 'year', 'mileage_km', 'fuel' "
        "(and 2 more); given but unknown: 'vehicle_type', 'state', 'driver_age', 'a', 'b' "
        "(and 2 more)"
    )
    with pytest.raises(Exception, match=r"missing features 'make', 'model'; given but"):
        check_names(["plan"], ["make", "model"], "loc", "feature")


def test_rules_a_huge_unknown_name_is_cut_in_the_error(strict: FlaskClient) -> None:
    """Found by the attack: a 2 MB key came back in full, four times: an 8 MB 422."""
    row = {**churn_rows()[0], "x" * 50_000: 1}  # the body limit here is 64 KiB
    answer = strict.post("/predict", json={"instances": [row]})

    assert answer.status_code == 422
    assert len(answer.get_data()) < 2000
    assert "unknown feature 'xxxx" in answer.get_json()["error"]["message"]
