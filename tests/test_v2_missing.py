"""Missing values through KServe V2 as tritonclient sends them (issue 34): a ``BYTES``
element named by ``parameters.null_value`` and NaN in a float tensor are missing values,
answered as the pipeline answers None/NaN in-process; NaN is a missing value on every
protocol (refused where the feature may not be missing); a parameter not taken is a 400
naming it. Bodies are built by tritonclient itself (``generate_request_body``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import joblib
import numpy as np
import pytest
import tritonclient.http as triton
from flask.testing import FlaskClient
from prometheus_client import CollectorRegistry

from serving.app import create_app
from serving.model.loaders import load_model
from serving.observe.metrics import ServingMetrics
from serving.settings import DEMO_MODEL_PATH, Settings
from tests.tabular import MISSING_ROWS, churn_with_missing_plans, frame_with_none, triton_inputs

INFER = "/v2/models/churn/infer"


@pytest.fixture(scope="module")
def churn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    model = churn_with_missing_plans()
    path = tmp_path_factory.mktemp("churn") / "churn.joblib"
    joblib.dump(model, path)
    return model, path


@pytest.fixture
def churn_client(settings: Settings, churn: tuple[Any, Path]) -> Iterator[FlaskClient]:
    configured = Settings(**{**settings.model_dump(), "max_body_bytes": 65536})
    handles = [load_model(churn[1]), load_model(DEMO_MODEL_PATH)]
    app = create_app(configured, models=handles, metrics=ServingMetrics(CollectorRegistry()))
    yield app.test_client()
    app.extensions["serving"].get_models().stop(timeout_s=10)


def post_triton(client: FlaskClient, inputs: list[Any], **parameters: Any) -> Any:
    """``client.infer("churn", inputs, parameters=...)`` as tritonclient sends it; the
    answer parsed by tritonclient (or the error response)."""
    body, length = triton.InferenceServerClient.generate_request_body(
        inputs, parameters=parameters or None
    )
    headers = {} if length is None else {"Inference-Header-Content-Length": str(length)}
    response = client.post(INFER, data=body, headers=headers)
    if response.status_code != 200:
        return response
    header = response.headers.get("Inference-Header-Content-Length")
    return triton.InferenceServerClient.parse_response_body(
        response.get_data(), header_length=None if header is None else int(header)
    )


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_v2_null_value_parameter_makes_tritonclient_strings_missing(
    churn_client: FlaskClient, churn: tuple[Any, Path], binary: bool
) -> None:
    refused = post_triton(churn_client, triton_inputs(MISSING_ROWS, binary))
    result = post_triton(churn_client, triton_inputs(MISSING_ROWS, binary), null_value="None")

    model = churn[0]
    assert refused.status_code == 400
    assert "unknown category 'None'" in refused.get_json()["error"]
    frame = frame_with_none(MISSING_ROWS)
    np.testing.assert_array_equal(result.as_numpy("predictions"), model.predict(frame))
    np.testing.assert_allclose(
        result.as_numpy("probabilities"), model.predict_proba(frame), rtol=1e-12
    )


def test_v2_null_value_of_an_input_overrides_the_requests(
    churn_client: FlaskClient, churn: tuple[Any, Path]
) -> None:
    def body(plans: list[str]) -> dict[str, Any]:
        plan = {"name": "plan", "shape": [3], "datatype": "BYTES", "data": plans}
        plan["parameters"] = {"null_value": "-"}
        inputs = [
            plan,
            {"name": "region", "shape": [3], "datatype": "BYTES", "data": ["nan", "apac", "emea"]},
            {"name": "seats", "shape": [3], "datatype": "FP64", "data": [12, None, 3]},
            {"name": "usage_hours", "shape": [3], "datatype": "FP64", "data": [3.5, 40, None]},
        ]
        return {"parameters": {"null_value": "nan"}, "inputs": inputs}

    answer = churn_client.post(INFER, json=body(["-", "pro", "basic"]))
    refused = churn_client.post(INFER, json=body(["nan", "pro", "basic"]))

    rows = [dict(row) for row in MISSING_ROWS]
    rows[0]["region"] = None  # "nan": the request's token, for region
    expected = churn[0].predict_proba(frame_with_none(rows))
    assert answer.status_code == 200, answer.get_json()
    np.testing.assert_allclose(answer.get_json()["outputs"][1]["data"], expected.reshape(-1))
    assert refused.status_code == 400  # "nan" is not plan's token: an unknown category
    assert "inputs[0].data[0]: input 'plan': unknown category 'nan'" in refused.get_json()["error"]


@pytest.mark.parametrize(
    ("parameters", "where"),
    [
        ({"nul_value": "None"}, "parameters.nul_value: unknown request parameter 'nul_value'"),
        ({"null_value": 0}, "parameters.null_value"),
        (
            {"input": {"null_value": 3}},
            "inputs[1].parameters.null_value",
        ),
        (
            {"input": {"null": "None"}},
            "inputs[1].parameters.null: input 'region': unknown parameter 'null'",
        ),
        (
            {"seats": {"null_value": "NaN"}},
            "inputs[2].parameters.null_value: input 'seats': null_value applies to BYTES",
        ),
    ],
)
def test_v2_parameters_not_taken_are_400_naming_the_input(
    churn_client: FlaskClient, parameters: dict[str, Any], where: str
) -> None:
    body = json.loads(
        triton.InferenceServerClient.generate_request_body(triton_inputs(MISSING_ROWS, False))[0]
    )
    if "input" in parameters:
        body["inputs"][1]["parameters"] = parameters["input"]
    elif "seats" in parameters:
        body["inputs"][2]["parameters"] = parameters["seats"]
    else:
        body["parameters"] = parameters

    response = churn_client.post(INFER, json=body)

    assert response.status_code == 400
    assert response.get_json()["code"] == "invalid_input"
    assert where in response.get_json()["error"]


def nan_bodies(rows: list[dict[str, Any]], model: str) -> dict[str, tuple[str, bytes, str]]:
    """Per protocol, ``(url, body, content type)`` of ``rows`` with NaN for each missing
    number, as Python's ``json.dumps`` writes it (``NaN``); strings missing as null."""
    nan = [{k: (np.nan if v is None and k in ("seats", "usage_hours") else v)
            for k, v in row.items()} for row in rows]  # fmt: skip
    names = list(rows[0])
    columns = {name: [row[name] for row in nan] for name in names}
    v2_json = triton.InferenceServerClient.generate_request_body(
        triton_inputs(rows, False), outputs=[triton.InferRequestedOutput("predictions", False)]
    )[0]
    csv = (
        ",".join(names)
        + "\n"
        + "".join(",".join("" if v is None else str(v) for v in row.values()) + "\n" for row in nan)
    )
    as_json = "application/json"
    return {
        "predict": (f"/predict/{model}", json.dumps({"instances": nan}).encode(), as_json),
        "v2 json": (f"/v2/models/{model}/infer", v2_json, as_json),
        "tfserving rows": (
            f"/v1/models/{model}:predict",
            json.dumps({"instances": nan}).encode(),
            as_json,
        ),
        "tfserving columns": (
            f"/v1/models/{model}:predict",
            json.dumps({"inputs": columns}).encode(),
            as_json,
        ),
        "invocations json": (
            "/invocations",
            json.dumps({"dataframe_records": nan}).encode(),
            as_json,
        ),
        "invocations csv": ("/invocations", csv.encode(), "text/csv"),
    }


def predictions_of(protocol: str, answer: dict[str, Any]) -> list[Any]:
    if protocol == "v2 json":
        return list(answer["outputs"][0]["data"])
    if protocol == "tfserving rows":
        return [row["predictions"] for row in answer["predictions"]]
    if protocol == "tfserving columns":
        return list(answer["outputs"]["predictions"])
    return list(answer["predictions"])


def test_nan_is_a_missing_value_on_every_protocol(
    settings: Settings, churn: tuple[Any, Path]
) -> None:
    """NaN (JSON ``NaN`` as ``json.dumps`` writes it, a CSV ``NaN`` cell, a binary float)
    is a missing value as null is, on every route: the answers are the pipeline's own on
    the same rows with NaN there."""
    configured = Settings(**{**settings.model_dump(), "max_body_bytes": 65536})
    app = create_app(
        configured, models=[load_model(churn[1])], metrics=ServingMetrics(CollectorRegistry())
    )
    client = app.test_client()
    # strings all given: CSV's missing cell is pandas' (empty, NaN), read as NaN for a string
    rows = [dict(row, plan=row["plan"] or "basic") for row in MISSING_ROWS]
    try:
        answers = {
            protocol: client.post(url, data=body, headers={"Content-Type": kind})
            for protocol, (url, body, kind) in nan_bodies(rows, "churn").items()
        }
        binary = post_triton(client, triton_inputs(rows, True))
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    expected = churn[0].predict(frame_with_none(rows)).tolist()
    assert "NaN" in nan_bodies(rows, "churn")["predict"][1].decode()
    for protocol, answer in answers.items():
        assert answer.status_code == 200, (protocol, answer.get_data(as_text=True))
        assert predictions_of(protocol, answer.get_json()) == expected, protocol
    assert binary.as_numpy("predictions").tolist() == expected


def test_nan_is_refused_on_every_protocol_where_the_feature_may_not_be_missing(
    settings: Settings,
) -> None:
    """The demo pipeline (no imputer) takes no missing value: NaN is refused as null is,
    naming the value, on every route."""
    row = dict(enumerate([1.0] * 30))
    row[3] = np.nan
    values = list(row.values())
    tensor = triton.InferInput("input-0", [1, 30], "FP64")
    tensor.set_data_from_numpy(np.array([values]), binary_data=True)
    v2_json = triton.InferInput("input-0", [1, 30], "FP64")
    v2_json.set_data_from_numpy(np.array([values]), binary_data=False)
    bodies = {
        "predict": ("/predict", {"instances": [values]}),
        "tfserving": ("/v1/models/breast_cancer:predict", {"instances": [values]}),
        "invocations": ("/invocations", {"dataframe_split": {"data": [values]}}),
    }
    app = create_app(
        settings, models=[load_model(DEMO_MODEL_PATH)], metrics=ServingMetrics(CollectorRegistry())
    )
    client = app.test_client()
    try:
        answers = {
            protocol: client.post(url, data=json.dumps(body), content_type="application/json")
            for protocol, (url, body) in bodies.items()
        }
        answers["csv"] = client.post(
            "/invocations", data=",".join(map(str, range(30))) + "\n" +
            ",".join(map(str, values)) + "\n", content_type="text/csv",
        )  # fmt: skip
        for name, inputs in (("v2 binary", [tensor]), ("v2 json", [v2_json])):
            body, length = triton.InferenceServerClient.generate_request_body(inputs)
            headers = {} if length is None else {"Inference-Header-Content-Length": str(length)}
            answers[name] = client.post(
                "/v2/models/breast_cancer/infer", data=body, headers=headers
            )
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    for protocol, answer in answers.items():
        assert answer.status_code in (400, 422), (protocol, answer.get_data(as_text=True))
        text = answer.get_data(as_text=True)
        assert '"invalid_input"' in text and "may not be missing" in text, protocol


def test_v2_fp64_nan_is_a_missing_value_of_an_integer_feature(settings: Settings) -> None:
    """tritonclient's INT64 cannot hold a missing value: a nullable integer column goes as
    FP64 with NaN (as pandas holds it), and arrives as JSON null in INT64 does."""
    from tests.models import credit_handle

    seen: list[Any] = []
    handle = credit_handle(seen, keep="dependents")
    app = create_app(settings, models=[handle], metrics=ServingMetrics(CollectorRegistry()))
    dependents = triton.InferInput("dependents", [3], "FP64")
    dependents.set_data_from_numpy(np.array([2.0, np.nan, 0.0]))
    income = triton.InferInput("income", [3], "FP64")
    income.set_data_from_numpy(np.array([10.0, 20.0, 30.0]))
    body, length = triton.InferenceServerClient.generate_request_body([dependents, income])
    null = {"name": "dependents", "shape": [3], "datatype": "INT64", "data": [2, None, 0]}
    income_json = {"name": "income", "shape": [3], "datatype": "FP64", "data": [10, 20, 30]}
    try:
        client = app.test_client()
        binary = client.post(
            "/v2/models/credit/infer",
            data=body,
            headers={"Inference-Header-Content-Length": str(length)},
        )
        json_null = client.post("/v2/models/credit/infer", json={"inputs": [null, income_json]})
    finally:
        app.extensions["serving"].get_models().stop(timeout_s=10)

    assert binary.status_code == 200, binary.get_data(as_text=True)
    header = binary.get_data()[: int(binary.headers["Inference-Header-Content-Length"])]
    raw = binary.get_data()[len(header) :]
    assert np.frombuffer(raw, dtype="<f8").tolist() == [12.0, 19.0, 30.0]
    assert json_null.get_json()["outputs"][0]["data"] == [12.0, 19.0, 30.0]
    np.testing.assert_array_equal(seen[-2], [2.0, np.nan, 0.0])  # after the warm-up call
    np.testing.assert_array_equal(seen[-2], seen[-1])
