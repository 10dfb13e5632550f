"""The models tabular teams ship, under the real Gunicorn on every protocol: a DataFrame
pipeline with string columns and missing values (joblib, and its skl2onnx export with
string inputs) and an int64 graph, each answer compared with the same model in-process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import requests
import tritonclient.http as triton

from tests.e2e.server import GunicornServer
from tests.onnx_graphs import int_identity_graph
from tests.tabular import churn_rows, frame_of, write_churn

COLUMNS = ["plan", "region", "seats", "usage_hours"]
BIG = [2**53 + 1, 2**63 - 1, -(2**63)]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GunicornServer, Any, Path]]:
    """One worker serving churn (joblib, the default), churn_onnx and ints."""
    tmp_path = tmp_path_factory.mktemp("tabular")
    model, joblib_path, onnx_path = write_churn(tmp_path)
    models = [
        {"name": "churn", "path": str(joblib_path)},
        {"name": "churn_onnx", "path": str(onnx_path)},
        {"name": "ints", "path": str(int_identity_graph(tmp_path / "ints.onnx"))},
    ]
    server = GunicornServer(tmp_path, workers=1, models=json.dumps(models)).start()
    try:
        server.wait_ready(workers=3)
        yield server, model, onnx_path
    finally:
        server.kill()


def _expected(model: Any, rows: list[dict[str, Any]]) -> tuple[list[Any], np.ndarray]:
    frame = frame_of(rows)
    return model.predict(frame).tolist(), model.predict_proba(frame)


def _post(server: GunicornServer, path: str, body: Any, **kw: Any) -> requests.Response:
    return requests.post(f"{server.url}{path}", json=body, timeout=30, **kw)


def test_tabular_predict_objects_lists_and_named_model_equal_the_pipeline(served: Any) -> None:
    server, model, onnx_path = served
    rows = churn_rows()
    labels, probabilities = _expected(model, rows)

    objects = _post(server, "/predict", {"instances": rows})
    lists = _post(server, "/predict", {"instances": [[r[c] for c in COLUMNS] for r in rows]})
    graph = _post(server, "/predict", {"instances": rows, "model": "churn_onnx"})

    for response in (objects, lists):
        assert response.status_code == 200, response.text
        assert response.json()["predictions"] == labels
        np.testing.assert_allclose(response.json()["probabilities"], probabilities, atol=1e-9)
    assert graph.status_code == 200, graph.text
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    feeds = {c: np.array([[r[c]] for r in rows], dtype=object) for c in ("plan", "region")}
    for c in ("seats", "usage_hours"):
        feeds[c] = np.array([[np.nan if r[c] is None else r[c]] for r in rows], dtype=np.float32)
    onnx_labels, onnx_probabilities = session.run(None, feeds)
    assert graph.json()["predictions"] == onnx_labels.tolist()
    assert graph.json()["classes"] == [0, 1]
    np.testing.assert_allclose(graph.json()["probabilities"], onnx_probabilities, rtol=1e-6)


def test_tabular_tfserving_and_mlflow_bodies_equal_the_pipeline(served: Any) -> None:
    server, model, _ = served
    rows = churn_rows()
    labels, probabilities = _expected(model, rows)
    columns = {c: [r[c] for r in rows] for c in COLUMNS}
    split = {"columns": COLUMNS[::-1], "data": [[r[c] for c in COLUMNS[::-1]] for r in rows]}
    csv = frame_of(rows).to_csv()  # pandas' default: an index column, NaN as empty cells

    tf_rows = _post(server, "/v1/models/churn:predict", {"instances": rows})
    tf_columns = _post(server, "/v1/models/churn:predict", {"inputs": columns})
    records = _post(server, "/invocations", {"dataframe_records": rows})
    frame_split = _post(server, "/invocations", {"dataframe_split": split})
    text = requests.post(f"{server.url}/invocations", data=csv, timeout=30,
                         headers={"Content-Type": "text/csv"})  # fmt: skip

    assert [p["predictions"] for p in tf_rows.json()["predictions"]] == labels, tf_rows.text
    np.testing.assert_allclose(tf_columns.json()["outputs"]["probabilities"], probabilities,
                               atol=1e-9)  # fmt: skip
    for response in (records, frame_split, text):
        assert response.status_code == 200, response.text
        assert response.json()["predictions"] == labels


def test_tabular_v2_bytes_and_numbers_through_tritonclient(served: Any) -> None:
    server, model, _ = served
    rows = churn_rows()
    labels, probabilities = _expected(model, rows)
    client = triton.InferenceServerClient(url=f"127.0.0.1:{server.port}", network_timeout=30)
    metadata = client.get_model_metadata("churn")
    inputs = []
    for binary, name in zip((True, False, True, False), COLUMNS, strict=True):
        if name in ("plan", "region"):
            data = np.array([r[name] for r in rows], dtype=object)
            tensor = triton.InferInput(name, [len(rows)], "BYTES")
        else:
            data = np.array([np.nan if r[name] is None else r[name] for r in rows])
            tensor = triton.InferInput(name, [len(rows)], "FP64")
        tensor.set_data_from_numpy(data, binary_data=binary)
        inputs.append(tensor)

    result = client.infer("churn", inputs)

    assert [(i["name"], i["datatype"]) for i in metadata["inputs"]] == [
        ("plan", "BYTES"), ("region", "BYTES"), ("seats", "FP64"), ("usage_hours", "FP64"),
    ]  # fmt: skip
    assert result.as_numpy("predictions").tolist() == labels
    np.testing.assert_allclose(result.as_numpy("probabilities"), probabilities, atol=1e-9)
    client.close()


def test_tabular_int64_is_exact_on_every_protocol(served: Any) -> None:
    server, _, _ = served
    client = triton.InferenceServerClient(url=f"127.0.0.1:{server.port}", network_timeout=30)
    tensor = triton.InferInput("x", [len(BIG), 1], "INT64")
    tensor.set_data_from_numpy(np.array([[v] for v in BIG], dtype=np.int64), binary_data=True)
    json_tensor = {"name": "x", "datatype": "INT64", "shape": [len(BIG), 1], "data": BIG}

    answers = {
        "predict": _post(
            server, "/predict", {"instances": [[v] for v in BIG], "model": "ints"}
        ).json()["predictions"],
        "tf": _post(server, "/v1/models/ints:predict", {"instances": [[v] for v in BIG]}).json()[
            "predictions"
        ],
        "v2 json": _post(server, "/v2/models/ints/infer", {"inputs": [json_tensor]}).json()[
            "outputs"
        ][0]["data"],
        "v2 binary": client.infer("ints", [tensor]).as_numpy("predictions").tolist(),
    }
    client.close()
    too_big = _post(server, "/predict", {"instances": [[2**63]], "model": "ints"})

    assert answers == dict.fromkeys(answers, BIG)
    assert too_big.status_code == 422
    assert too_big.json()["error"]["details"][0]["loc"] == "instances[0][0]"


@pytest.mark.parametrize(
    ("path", "status"),
    [("/predict", 422), ("/v1/models/churn:predict", 422), ("/invocations", 422)],
)
def test_tabular_unknown_category_is_a_4xx_naming_feature_and_value(
    served: Any, path: str, status: int
) -> None:
    server, _, _ = served
    row = churn_rows()[0] | {"plan": "gold"}
    body = {"dataframe_records": [row]} if path == "/invocations" else {"instances": [row]}

    response = _post(server, path, body)

    assert response.status_code == status, response.text
    assert "plan" in response.text and "gold" in response.text


def test_tabular_concurrent_requests_are_merged_and_each_gets_its_own_answer(
    served: Any,
) -> None:
    server, model, _ = served
    rows = churn_rows()
    labels, _ = _expected(model, rows)
    before = server.metric('inference_batch_size_count{model="churn"}')

    def one(i: int) -> Any:
        return _post(server, "/predict", {"instances": [rows[i % len(rows)]]}).json()

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one, range(320)))

    assert [a["predictions"][0] for a in answers] == [labels[i % len(rows)] for i in range(320)]
    flushes = server.metric('inference_batch_size_count{model="churn"}') - before
    assert flushes < 320  # some predict calls served several requests
