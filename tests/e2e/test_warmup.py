"""Issue 34: a team's own class over an ``OrdinalEncoder`` pipeline, declaring ``plan`` a
free string (no categories), under the real Gunicorn: the warm-up's made-up ``""`` is
refused by the encoder, the worker logs one warning and serves, and every answer equals
the pipeline called in-process (before, every worker stopped: "warm-up failed")."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from tests.e2e.server import GunicornServer
from tests.tabular import PLAN_ROWS, write_plan


def test_custom_class_over_a_free_string_column_starts_and_answers_as_in_process(
    tmp_path: Path, gunicorn: Callable[..., GunicornServer]
) -> None:
    model = write_plan(tmp_path)
    server = gunicorn(workers=1, model_class="tests.models:FreePlan", model_dir=tmp_path)
    server.wait_ready(workers=1)

    answered = server.predict(PLAN_ROWS)
    unknown = server.predict([{"plan": "gold", "seats": 1.0}])

    assert answered.status_code == 200, answered.text
    np.testing.assert_allclose(
        answered.json()["predictions"], model.predict(pd.DataFrame(PLAN_ROWS)), rtol=1e-12
    )
    assert unknown.status_code == 500  # the encoder's own refusal, as in-process
    warnings = [line for line in server.output().splitlines() if "invented rows" in line]
    assert len(warnings) == 1 and "class tests.models:FreePlan" in warnings[0]
    assert "unknown categories" in warnings[0]
    assert server.terminate() == 0
