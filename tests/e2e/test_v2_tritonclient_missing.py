"""Missing values from the real ``tritonclient[http]`` under the real Gunicorn (issue 34):
a DataFrame pipeline whose ``plan`` may be missing (None) and whose numbers are imputed,
sent as tritonclient builds tensors from its rows (strings in an object array, numbers
FP64 with NaN), binary and JSON; answers compared with the pipeline in-process."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import joblib
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tests.e2e.server import GunicornServer
from tests.tabular import MISSING_ROWS, churn_with_missing_plans, frame_with_none, triton_inputs


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    """One worker serving the pipeline; a tritonclient client of it, and the pipeline."""
    tmp_path = tmp_path_factory.mktemp("missing")
    model = churn_with_missing_plans()
    joblib.dump(model, tmp_path / "churn.joblib")
    server = GunicornServer(tmp_path, workers=1, model_path=str(tmp_path / "churn.joblib"))
    server.start()
    try:
        server.wait_ready(workers=1)
        client = triton.InferenceServerClient(url=f"127.0.0.1:{server.port}", network_timeout=30)
        yield client, model
        client.close()
    finally:
        server.kill()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_missing_string_and_number_with_null_value_equal_the_pipeline(
    served: tuple[Any, Any], binary: bool
) -> None:
    client, model = served
    outputs = [
        triton.InferRequestedOutput(name, binary_data=binary)
        for name in ("predictions", "probabilities")
    ]

    with pytest.raises(InferenceServerException) as unknown:
        client.infer("churn", triton_inputs(MISSING_ROWS, binary), outputs=outputs)
    result = client.infer(
        "churn",
        triton_inputs(MISSING_ROWS, binary),
        outputs=outputs,
        parameters={"null_value": "None"},
    )

    assert unknown.value.status() == "400"
    assert "input 'plan': unknown category 'None'" in unknown.value.message()
    frame = frame_with_none(MISSING_ROWS)
    np.testing.assert_array_equal(result.as_numpy("predictions"), model.predict(frame))
    np.testing.assert_allclose(
        result.as_numpy("probabilities"), model.predict_proba(frame), rtol=1e-12
    )


def test_tritonclient_misspelt_parameter_is_400_naming_it(served: tuple[Any, Any]) -> None:
    client, _ = served

    with pytest.raises(InferenceServerException) as misspelt:
        client.infer("churn", triton_inputs(MISSING_ROWS, True), parameters={"nul_value": "None"})

    assert misspelt.value.status() == "400"
    assert "parameters.nul_value: unknown request parameter 'nul_value'" in (
        misspelt.value.message()
    )
