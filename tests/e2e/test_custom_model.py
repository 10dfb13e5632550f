"""The custom-class example (examples/custom_model.py) under the real Gunicorn: answers as
its own in-process predict does, and concurrent requests are merged into batches."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests

from tests.e2e.server import ROOT, GunicornServer

EXAMPLES = ROOT / "examples"


@pytest.fixture
def shape_ratios(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The example's trained artifact directory."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    from custom_model import train

    train(tmp_path / "shape_ratios")
    return tmp_path / "shape_ratios"


@pytest.fixture
def serve_class(tmp_path: Path) -> Iterator[Callable[..., GunicornServer]]:
    """``serve_class(**settings)``: one worker serving the example class, ready; the
    example's module found through PYTHONPATH, as in the README."""
    servers: list[GunicornServer] = []

    def start(**settings: object) -> GunicornServer:
        server = GunicornServer(
            tmp_path, workers=1, model_class="custom_model:ShapeRatioModel", **settings
        )
        server.env["PYTHONPATH"] = str(EXAMPLES)
        servers.append(server.start())
        server.wait_ready(workers=1)
        return server

    yield start
    for server in servers:
        server.kill()


def expected_outputs(directory: Path, rows: np.ndarray) -> dict[str, np.ndarray]:
    from custom_model import ShapeRatioModel

    model = ShapeRatioModel()
    model.load(directory)
    outputs: dict[str, np.ndarray] = model.predict(model.preprocess(rows))
    return outputs


def test_custom_class_answers_as_its_own_predict_and_is_batched(
    serve_class: Callable[..., GunicornServer],
    shape_ratios: Path,
    breast_cancer: tuple[np.ndarray, np.ndarray],
) -> None:
    X, _ = breast_cancer
    server = serve_class(
        model_dir=shape_ratios,
        model_name="shape_ratios",
        max_batch_size=32,
        batch_policy="window",
        max_batch_latency_ms=20,
    )

    barrier = threading.Barrier(48)

    def call(row: int) -> requests.Response:
        barrier.wait(30)
        return server.predict([X[row].tolist()])

    with ThreadPoolExecutor(48) as pool:
        responses = list(pool.map(call, range(48)))
    whole = server.predict(X[:100].tolist())

    expected = expected_outputs(shape_ratios, X[:100])
    for row, response in enumerate(responses):
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["predictions"] == [int(expected["predictions"][row])]
        np.testing.assert_allclose(body["probabilities"], expected["probabilities"][[row]])
    assert whole.status_code == 200, whole.text
    assert (whole.json()["model_name"], whole.json()["classes"]) == ("shape_ratios", [0, 1])
    np.testing.assert_array_equal(whole.json()["predictions"], expected["predictions"])
    np.testing.assert_allclose(whole.json()["probabilities"], expected["probabilities"])

    text = requests.get(f"{server.url}/metrics", timeout=10).text
    calls = server.metric('inference_batch_size_count{model="shape_ratios"}', text)
    single_row_calls = server.metric('inference_batch_size_bucket{le="1.0"}', text)
    assert server.metric("inference_batch_size_sum", text) == 48 + 100
    assert single_row_calls < calls - 1, "no predict call merged several requests"
    named = requests.post(
        f"{server.url}/predict",
        json={"instances": [dict(zip(_feature_names(), X[0].tolist(), strict=True))]},
        timeout=30,
    )
    assert named.json()["predictions"] == [int(expected["predictions"][0])], named.text


def _feature_names() -> tuple[str, ...]:
    from custom_model import ShapeRatioModel

    return ShapeRatioModel.feature_names


def test_custom_class_failing_on_one_request_fails_only_that_request(
    serve_class: Callable[..., GunicornServer],
    shape_ratios: Path,
    breast_cancer: tuple[np.ndarray, np.ndarray],
) -> None:
    """A row whose worst/mean ratio overflows to infinity in preprocess makes the
    classifier raise: only the request carrying it fails, not the ones merged with it."""
    X, _ = breast_cancer
    server = serve_class(model_dir=shape_ratios, batch_policy="window", max_batch_latency_ms=50)
    bad = X[0].copy()
    bad[0], bad[20] = 1e-320, 1e308  # worst/mean overflows to inf: the classifier refuses it

    barrier = threading.Barrier(8)

    def call(row: int) -> requests.Response:
        barrier.wait(30)
        return server.predict([(bad if row == 3 else X[row]).tolist()])

    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(call, range(8)))

    statuses = [response.status_code for response in responses]
    assert statuses == [200, 200, 200, 500, 200, 200, 200, 200], [r.text for r in responses]
    assert responses[3].json()["error"]["code"] == "inference_error"
