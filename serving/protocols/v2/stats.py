"""KServe V2 statistics extension, as Triton serves it (``GET /v2/models[/{name}]/stats``).

The numbers come from the Prometheus metrics the data plane already records
(``ServingMetrics.collect``), so under Gunicorn they are summed over every worker, live or
dead since start-up, exactly as ``/metrics`` is:

- ``inference_requests_total{outcome=...}``: the count of ``success`` and ``fail``; as
  in Triton, the stages count the successful requests only;
- ``inference_request_stage_seconds_total{stage=...}``: ``compute_input`` (checking and
  conforming the instances), ``queue`` (waiting in the batcher), ``compute_infer`` (the
  predict call that answered it) and ``compute_output`` (splitting the outputs per
  request) of the successful requests, whose ``success`` time is their sum; ``fail``
  the whole time in the data plane of the failed ones;
- ``inference_batch_compute_seconds{batch_size=...}``: ``batch_stats``, and from it
  ``execution_count`` (predict calls that succeeded) and ``inference_count`` (their
  instances), as Triton counts successful executions only (``inference_batch_size`` also
  counts failed calls, and the retries of a failed batch's halves);
- ``inference_last_timestamp_seconds``: ``last_inference``, in ms since the epoch.

Durations are answered as Triton does, in integer nanoseconds (``ns``). Encoding the
response into its wire format happens in the route and is in no stage. Source: Triton's
``docs/protocol/extension_statistics.md``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from prometheus_client.metrics_core import Metric
from pydantic import BaseModel, Field

from serving.context import REQUEST_STAGES

__all__ = ["STAGES", "V2InferenceStatistics", "V2ModelStatistics", "model_statistics"]

#: Per-request stages of Triton's ``inference_stats`` that the data plane times.
STAGES = ("success", "fail", *REQUEST_STAGES)
#: Stages Triton reports that this server has no use for (no response cache): zeros.
_ZERO_STAGES = ("cache_hit", "cache_miss")


class V2StatDuration(BaseModel):
    count: int = Field(description="Requests (or predict calls) counted.")
    ns: int = Field(description="Their cumulative time, in nanoseconds.")


class V2InferStats(BaseModel):
    success: V2StatDuration
    fail: V2StatDuration
    queue: V2StatDuration
    compute_input: V2StatDuration
    compute_infer: V2StatDuration
    compute_output: V2StatDuration
    cache_hit: V2StatDuration
    cache_miss: V2StatDuration


class V2BatchStats(BaseModel):
    batch_size: int
    compute_input: V2StatDuration = Field(description="Not timed apart per batch: ns 0.")
    compute_infer: V2StatDuration = Field(description="Predict calls of this size and time.")
    compute_output: V2StatDuration = Field(description="Not timed apart per batch: ns 0.")


class V2ModelStatistics(BaseModel):
    model_config = {"protected_namespaces": ()}

    name: str
    version: str
    last_inference: int = Field(description="When the last request was answered, ms since epoch.")
    inference_count: int = Field(
        description="Instances of the predict calls that succeeded (a batch of n counts n).",
    )
    execution_count: int = Field(description="Predict calls that succeeded.")
    inference_stats: V2InferStats
    batch_stats: list[V2BatchStats]


class V2InferenceStatistics(BaseModel):
    """``GET /v2/models[/{model_name}[/versions/{model_version}]]/stats``: summed over
    every worker since the server started."""

    model_stats: list[V2ModelStatistics]


def model_statistics(
    families: Iterable[Metric], models: Iterable[tuple[str, str]]
) -> list[dict[str, Any]]:
    """Triton's ``model_stats`` entry for each ``(name, version)`` in ``models``, in order,
    from the collected metric ``families`` (models without samples yet count zero)."""
    stages, batches, last = _totals(families)
    answer = []
    for (name, version, stage), totals in list(stages.items()):
        if stage in REQUEST_STAGES:  # the stages of every successful request, and its time
            success = stages[(name, version, "success")]
            totals[0] = success[0]
            success[1] += totals[1]
    for name, version in models:
        infer = {
            stage: _duration(*stages.get((name, version, stage), (0.0, 0.0))) for stage in STAGES
        }
        infer.update({stage: _duration(0.0, 0.0) for stage in _ZERO_STAGES})
        sizes = sorted(size for (n, v, size) in batches if (n, v) == (name, version))
        batch_stats = []
        for size in sizes:
            count, seconds = batches[(name, version, size)]
            batch_stats.append(
                {
                    "batch_size": size,
                    "compute_input": _duration(count, 0.0),
                    "compute_infer": _duration(count, seconds),
                    "compute_output": _duration(count, 0.0),
                }
            )
        executions = sum(batches[(name, version, size)][0] for size in sizes)
        instances = sum(size * batches[(name, version, size)][0] for size in sizes)
        answer.append(
            {
                "name": name,
                "version": version,
                "last_inference": int(last.get((name, version), 0.0) * 1000),
                "inference_count": int(instances),
                "execution_count": int(executions),
                "inference_stats": infer,
                "batch_stats": batch_stats,
            }
        )
    return answer


_Key = tuple[str, str]


def _totals(
    families: Iterable[Metric],
) -> tuple[
    dict[tuple[str, str, str], list[float]],
    dict[tuple[str, str, int], list[float]],
    dict[_Key, float],
]:
    """``[count, seconds]`` per model, version and stage; ``[predict calls that
    succeeded, seconds]`` per model, version and batch size; the last answer's time."""
    stages: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    batches: dict[tuple[str, str, int], list[float]] = defaultdict(lambda: [0.0, 0.0])
    last: dict[_Key, float] = defaultdict(float)
    for family in families:
        for sample in family.samples:
            labels = sample.labels
            key = (labels.get("model", ""), labels.get("version", ""))
            if sample.name.endswith("_total"):  # counters (their family drops _total)
                if family.name == "inference_requests":
                    stages[(*key, labels["outcome"])][0] += sample.value
                elif family.name == "inference_request_stage_seconds":
                    stages[(*key, labels["stage"])][1] += sample.value
                continue
            slot = 0 if sample.name.endswith("_count") else 1
            if not _is_count_or_sum(sample) and not family.name.endswith("_timestamp_seconds"):
                continue  # histogram buckets, _created
            if family.name == "inference_batch_compute_seconds":
                batches[(*key, int(labels["batch_size"]))][slot] += sample.value
            elif family.name == "inference_last_timestamp_seconds":
                last[key] = max(last[key], sample.value)
    return stages, batches, last


def _is_count_or_sum(sample: Any) -> bool:
    return bool(sample.name.endswith(("_count", "_sum")))


def _duration(count: float, seconds: float) -> dict[str, int]:
    return {"count": int(count), "ns": round(seconds * 1e9)}
