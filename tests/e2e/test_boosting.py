"""LightGBM and XGBoost classifiers fitted on pandas ``category`` columns, served from their
own saves (LightGBM joblib, XGBoost pickle) under the real Gunicorn: every protocol's answer
equals the model's own on the DataFrame a caller builds in-process with the training
dtypes, null and unknown categories included (before, every worker's warm-up failed and
the server exited)."""

from __future__ import annotations

import pickle
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import joblib
import numpy as np
import pandas as pd
import pytest
import requests

from tests.e2e.server import GunicornServer
from tests.tabular import boosting_frame_of, boosting_model, boosting_rows

MODELS = ("lightgbm", "xgboost")
STRINGS = ("plan", "region")


@pytest.fixture(scope="module", params=MODELS)
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[GunicornServer, str, Any, pd.DataFrame]]:
    """Two workers serving one model (``/invocations`` answers with the default model):
    ``lightgbm`` from a joblib file or ``xgboost`` from a pickle."""
    name = request.param
    tmp_path = tmp_path_factory.mktemp(name)
    model, frame = boosting_model(name)
    if name == "lightgbm":
        path = tmp_path / "lightgbm.joblib"
        joblib.dump(model, path)
    else:
        path = tmp_path / "xgboost.pkl"
        path.write_bytes(pickle.dumps(model))
    server = GunicornServer(tmp_path, workers=2, model_path=path, model_name=name).start()
    try:
        server.wait_ready(workers=2)
        yield server, name, model, frame
    finally:
        server.kill()


def _post(server: GunicornServer, path: str, **kw: Any) -> Any:
    response = requests.post(f"{server.url}{path}", timeout=30, **kw)
    assert response.status_code == 200, response.text
    return response.json()


def _in_process(model: Any, frame: pd.DataFrame, rows: list[dict[str, Any]]) -> tuple[Any, Any]:
    expected = boosting_frame_of(rows, frame)
    return model.predict(expected).tolist(), model.predict_proba(expected)


def _same(answer: Any, expected: np.ndarray, name: str) -> None:
    """Equal to ``expected`` in its dtype (XGBoost's float32 probabilities are written as
    float32's shortest repr): exactly from LightGBM itself, within the compile tolerance
    from XGBoost compiled to ONNX Runtime (SERVING_COMPILE=auto)."""
    got = np.asarray(answer, dtype=expected.dtype).reshape(expected.shape)
    if name == "lightgbm":
        np.testing.assert_array_equal(got, expected)
    else:
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)


def test_boosting_every_protocol_answers_as_the_model_in_process(served: Any) -> None:
    server, name, model, frame = served
    rows = boosting_rows(frame, len(frame))  # 400 rows: 10 % null numbers, unknowns, nulls
    labels, probabilities = _in_process(model, frame, rows)
    columns = list(frame.columns)
    v2 = {"inputs": [
        {"name": c, "shape": [len(rows)], "datatype": "BYTES" if c in STRINGS else "FP64",
         "data": [r[c] for r in rows]} for c in columns
    ]}  # fmt: skip
    split = {"columns": columns[::-1], "data": [[r[c] for c in columns[::-1]] for r in rows]}
    csv = pd.DataFrame(rows).to_csv(index=False)  # null: an empty cell

    objects = _post(server, f"/predict/{name}", json={"instances": rows})
    lists = _post(server, f"/predict/{name}", json={"instances": [list(r.values()) for r in rows]})
    v2_answer = _post(server, f"/v2/models/{name}/infer", json=v2)
    tf_rows = _post(server, f"/v1/models/{name}:predict", json={"instances": rows})
    records = _post(server, "/invocations", json={"dataframe_records": rows})
    frame_split = _post(server, "/invocations", json={"dataframe_split": split})
    text = _post(server, "/invocations", data=csv, headers={"Content-Type": "text/csv"})

    for answer in (objects, lists):
        assert answer["predictions"] == labels
        _same(answer["probabilities"], probabilities, name)
    outputs = {o["name"]: o["data"] for o in v2_answer["outputs"]}
    assert outputs["predictions"] == labels
    _same(outputs["probabilities"], probabilities, name)
    assert [p["predictions"] for p in tf_rows["predictions"]] == labels
    _same([p["probabilities"] for p in tf_rows["predictions"]], probabilities, name)
    for answer in (records, frame_split, text):
        assert answer["predictions"] == labels
    engine = requests.get(f"{server.url}/healthz", timeout=5).json()["models"][0]["engine"]
    assert engine == ("lightgbm" if name == "lightgbm" else "onnxruntime")


def test_boosting_concurrent_single_rows_each_get_the_in_process_answer(served: Any) -> None:
    """Requests merged into batches of other requests' rows (other categories, nulls)
    answer as alone: the categories are the model's, never a batch's."""
    server, name, model, frame = served
    rows = boosting_rows(frame, 40)
    labels, probabilities = _in_process(model, frame, rows)

    def one(i: int) -> Any:
        return _post(server, f"/predict/{name}", json={"instances": [rows[i % len(rows)]]})

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(one, range(160)))

    assert [a["predictions"][0] for a in answers] == [labels[i % 40] for i in range(160)]
    expected = probabilities[[i % 40 for i in range(160)]]
    _same([a["probabilities"][0] for a in answers], expected, name)


#: What skops must be told to trust to rebuild each library's estimator from an MLflow
#: save (docs/models.md lists the same).
TRUSTED = {
    "xgboost": "xgboost.core.Booster,xgboost.sklearn.XGBClassifier",
    "lightgbm": "collections.OrderedDict,lightgbm.basic.Booster,lightgbm.sklearn.LGBMClassifier",
}


@pytest.mark.parametrize("name", MODELS)
def test_boosting_an_mlflow_save_serves_with_the_trusted_types_the_docs_list(
    tmp_path: Any, name: str
) -> None:
    """Issue 34 item 6: the skops types an XGBoost or LightGBM MLflow folder needs are the
    ones docs/models.md lists; with them, the folder answers as the model in-process."""
    import lightgbm
    import mlflow.sklearn
    import xgboost
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    rows = np.random.default_rng(0).random((200, 4))
    labels = (rows[:, 0] + rows[:, 1] > 1).astype(int)
    estimator = (
        xgboost.XGBClassifier(n_estimators=8) if name == "xgboost"
        else lightgbm.LGBMClassifier(n_estimators=8, verbose=-1)
    )  # fmt: skip
    model = make_pipeline(StandardScaler(), estimator).fit(rows, labels)
    folder = tmp_path / f"{name}_mlflow"
    with warnings.catch_warnings():  # MLflow's notice about its own pyfunc type hints
        warnings.filterwarnings("ignore", ".*Any type hint is inferred", UserWarning)
        mlflow.sklearn.save_model(
            model, folder, skops_trusted_types=TRUSTED[name].split(","),
            pip_requirements=[f"{name}=={version_of(name)}"],
        )  # fmt: skip
    server = GunicornServer(
        tmp_path, model_dir=folder, skops_trusted_types=TRUSTED[name], workers=1
    ).start()
    try:
        server.wait_ready(workers=1)
        answer = server.predict(rows[:20].tolist())
    finally:
        server.kill()

    assert answer.status_code == 200, answer.text
    assert answer.json()["predictions"] == model.predict(rows[:20]).tolist()
    expected = model.predict_proba(rows[:20])
    np.testing.assert_allclose(answer.json()["probabilities"], expected, rtol=1e-6, atol=1e-7)


def version_of(name: str) -> str:
    """The installed library's version (MLflow would infer it by loading the model again
    in a subprocess: slow)."""
    import importlib

    return str(importlib.import_module(name).__version__)
