"""serving.observe.tracing_guards: the OpenTelemetry SDK's variables asked of the SDK in
the master, and its per-header warnings made sparse."""

from __future__ import annotations

import logging

import pytest

from serving.observe import tracing_guards


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "-1", "non-negative integer"),
        ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "-1", "non-negative integer"),
        ("OTEL_SPAN_EVENT_COUNT_LIMIT", "-5", "non-negative integer"),
        ("OTEL_SPAN_LINK_COUNT_LIMIT", "many", "non-negative integer"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "0", "max_queue_size"),
        ("OTEL_BSP_SCHEDULE_DELAY", "soon", "not an integer"),
        # under the default batch size (512): the variable set is named, not the other
        ("OTEL_BSP_MAX_QUEUE_SIZE", "16", "less than or equal to max_queue_size"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "-5", "not a positive number of seconds"),
        ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "soon", "not a positive number of seconds"),
        ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "inf", "not a positive number of seconds"),
    ],
)
def test_tracing_guards_name_the_variable_the_sdk_refuses(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, says: str
) -> None:
    monkeypatch.setenv(variable, value)

    problem = tracing_guards.environment_problem()

    assert problem is not None
    assert problem[0] == variable
    assert problem[1].startswith(f"got {value!r}: ")
    assert says in problem[1]


@pytest.mark.parametrize(
    ("sampler", "argument", "variable", "says"),
    [
        # the SDK took a name it does not know for its default: every request traced
        ("parentbased_traceidratios", None, "OTEL_TRACES_SAMPLER", "not a sampler the SDK"),
        # a ratio out of [0, 1], or no number, the SDK took for 1.0
        ("traceidratio", "2", "OTEL_TRACES_SAMPLER_ARG", "not a ratio from 0 to 1"),
        ("parentbased_traceidratio", "half", "OTEL_TRACES_SAMPLER_ARG", "not a ratio"),
        ("parentbased_traceidratio", None, "OTEL_TRACES_SAMPLER_ARG", "not a ratio"),
    ],
)
def test_tracing_guards_name_the_sampler_variable_the_sdk_refuses_or_replaces(
    monkeypatch: pytest.MonkeyPatch, sampler: str, argument: str | None, variable: str, says: str
) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    if argument is not None:
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", argument)

    problem = tracing_guards.environment_problem()

    assert problem is not None
    assert problem[0] == variable
    value = sampler if variable == "OTEL_TRACES_SAMPLER" else argument
    assert problem[1].startswith(f"got {value!r}: ")
    assert says in problem[1]


def test_tracing_guards_take_good_values_and_the_traces_timeout_before_the_general_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "64")
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "1024")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "2.5")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "-5")  # not read: the traces one is set
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "ParentBased_TraceIdRatio")  # the SDK lowers it
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")

    assert tracing_guards.environment_problem() is None


def test_tracing_guards_sparse_loggers_say_one_line_a_minute_cut_short(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tracing_guards.quiet_header_warnings()
    tracing_guards.quiet_header_warnings()  # once per process: a second call adds nothing
    logger = logging.getLogger("opentelemetry.trace.span")

    with caplog.at_level(logging.WARNING, logger="opentelemetry.trace.span"):
        for _ in range(5):
            logger.warning("bad tracestate %s", "x" * 1000)

    lines = [r.getMessage() for r in caplog.records if r.name == "opentelemetry.trace.span"]
    assert len(logger.filters) == 1
    assert len(lines) <= 1  # none when an earlier test of this process logged one
    assert all(len(line) < tracing_guards.LINE_CHARS + 80 for line in lines)
