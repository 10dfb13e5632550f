"""Property-based fuzz of the running server against its own /openapi.json (schemathesis).

Every documented operation gets a bounded number of generated requests, valid ones and
(schemathesis' negative mode) invalid ones, against a real Gunicorn serving the demo
model. Each response must not be a 5xx and must match the document: a documented status,
the documented content type, a body valid against the documented schema. (Driven with
hypothesis directly: schemathesis' pytest plugin does not run under pytest 9.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance

from tests.e2e.server import GunicornServer

#: Generated requests per operation and mode: bounded so CI stays quick.
MAX_EXAMPLES = 25


@pytest.fixture(scope="module")
def served_schema(tmp_path_factory: pytest.TempPathFactory) -> Iterator[schemathesis.BaseSchema]:
    server = GunicornServer(Path(tmp_path_factory.mktemp("fuzz")), access_log="false").start()
    try:
        server.wait_ready()
        yield schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    finally:
        server.kill()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_api_answers_every_generated_request_as_documented(
    served_schema: schemathesis.BaseSchema, mode: GenerationMode
) -> None:
    operations = [result.ok() for result in served_schema.get_all_operations()]
    assert len(operations) >= 4
    sent: dict[str, int] = {}
    for operation in operations:
        if mode is GenerationMode.NEGATIVE and not len(operation.body):
            continue  # path parameters are free strings: nothing there can be invalid

        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
        def check(case: schemathesis.Case) -> None:
            # A schema-valid body can still be refused (422: 29 features for a 30-feature
            # model); the checks that matter are no 5xx and answers as documented.
            case.call_and_validate(excluded_checks=[positive_data_acceptance], timeout=30)
            sent[case.operation.label] = sent.get(case.operation.label, 0) + 1

        check()
    assert sent.get("POST /predict", 0) >= 10, sent  # the fuzz really exercised the body
