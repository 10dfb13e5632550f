"""The one request path every protocol shares, without a web framework.

A protocol's route reads its body, its codec decodes it into ``serving.instances``
(``Frame``, ``Records``, ``Columns`` or ``Tensors``, no model needed), and
``DataPlane.infer`` does the rest once, in this order:

1. the instance count against ``SERVING_MAX_INSTANCES_PER_REQUEST`` (413);
2. the model by name and version (``ModelCache.resolve``: 404, 409) and its readiness
   (``ModelRuntime.require_ready``: 503);
3. the output names asked for, against the model's (422);
4. ``serving.conform.conform``: the instances against the model's inputs, as the
   ``(n_instances, n_features)`` rows its batcher merges (422);
5. what is left of the request's deadline (408 when receiving the request used it up);
6. the queue-depth metric, then the model's batcher (``submit_many``): 503 overloaded
   (counted as rejected), 504 timeout, 500 when the model fails on these rows;
7. the request's stages for the V2 statistics (``ServingMetrics.observe_stages``) and
   its spans (``serving.observe.tracing``, when configured) and,
   when ``SERVING_PAYLOAD_LOG`` is on, its rows (copied before the model ran: a model
   may write into its input) and outputs to the payload log.

The codec then encodes ``Inference.outputs`` into its response body. Requests of every
protocol meet in the same batcher, so they are merged into the same predict calls.

Boundary: no Flask, werkzeug or request bodies (pydantic only through ``Settings``); a
test imports this module in a fresh interpreter. Deadlines are ``time.monotonic()``
values.
"""

from __future__ import annotations

import time
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from serving.batching.batcher import ThreadedBatcher
from serving.cache import ModelCache
from serving.conform import conform
from serving.errors import InvalidInput, Overloaded, PayloadTooLarge, RequestTimeout
from serving.instances import Instances, Tensors
from serving.model.handle import ModelHandle, Outputs
from serving.observe import tracing
from serving.observe.metrics import ServingMetrics
from serving.observe.payload_log import PayloadLog
from serving.runtime import ModelRuntime
from serving.settings import Settings

__all__ = ["DataPlane", "Inference", "check_outputs"]


@dataclass(frozen=True, slots=True)
class Inference:
    """One request's answer: the model that gave it and its named outputs, each with one
    entry per instance along the first axis."""

    handle: ModelHandle
    outputs: Outputs


class DataPlane:
    """Resolve, check, queue and answer one request's instances on one model.

    :param get_models: this process's models (under Gunicorn built after the fork, so
        looked up per request rather than held).

    Usage::

        plane = DataPlane(settings, metrics, lambda: cache)
        deadline = time.monotonic() + settings.request_timeout_ms / 1000
        answer = plane.infer(None, None, Frame([[1.0, 2.0, 3.0]]), deadline=deadline)
        answer.outputs["predictions"]
    """

    def __init__(
        self, settings: Settings, metrics: ServingMetrics, get_models: Callable[[], ModelCache]
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.get_models = get_models
        #: ``SERVING_PAYLOAD_LOG``'s sink, or None when it is off.
        self.payloads = PayloadLog.from_settings(settings, metrics)

    @property
    def models(self) -> ModelCache:
        """This process's models."""
        return self.get_models()

    def deadline(self, started: float | None = None) -> float:
        """The ``time.monotonic()`` deadline of a request that started at ``started``
        (default: now), ``SERVING_REQUEST_TIMEOUT_MS`` later."""
        start = time.monotonic() if started is None else started
        return start + self.settings.request_timeout_ms / 1000

    def ready(
        self, name: str | None = None, version: str | None = None
    ) -> tuple[ModelRuntime, ModelHandle]:
        """The runtime and handle of model ``name`` at ``version`` (defaults: the first
        model, its first version), for metadata routes.

        :raises ModelNotFound: (404). :raises VersionConflict: (409).
        :raises NotReady: (503) while it loads or stops.
        """
        runtime = self.get_models().resolve(name, version)
        handle, _ = runtime.require_ready()
        return runtime, handle

    def infer(
        self,
        model_name: str | None,
        version: str | None,
        instances: Instances,
        *,
        deadline: float,
        outputs: list[str] | None = None,
        log: MutableMapping[str, Any] | None = None,
    ) -> Inference:
        """Answer ``instances`` with model ``model_name`` (default: the first model) at
        ``version`` (default: its first), through the model's batcher.

        :param deadline: ``time.monotonic()`` by which the answer is due (``deadline()``).
        :param outputs: output names the caller asked for; each must be one of the model's.
        :param log: the request's access-log fields; gets ``instances``, ``model``,
            ``model_version`` and ``batch_size``.
        :raises PayloadTooLarge: (413) above ``SERVING_MAX_INSTANCES_PER_REQUEST``.
        :raises ModelNotFound: (404) no model called ``model_name``.
        :raises VersionConflict: (409) the model is served here, but not at ``version``.
        :raises NotReady: (503) the model is not loaded yet or is stopping.
        :raises InvalidInput: (422) an unknown output name, or instances that do not fit
            the model's inputs (``conform``), naming the instance and feature.
        :raises RequestTimeout: (408) when receiving the request used up the deadline.
        :raises Overloaded: (503) the model's queue is full (counted as rejected).
        :raises InferenceTimeout: (504) no answer by the deadline.
        :raises InferenceError: (500) the model failed on these instances.
        """
        limit = self.settings.max_instances_per_request
        count = _count(instances)
        if count > limit:
            raise PayloadTooLarge(
                "request", count, limit, "SERVING_MAX_INSTANCES_PER_REQUEST", "instances"
            )
        runtime = self.get_models().resolve(model_name, version)
        handle, batcher = runtime.require_ready()
        started = time.perf_counter()
        timing: dict[str, Any] = {}
        try:
            answer = self._queue(
                runtime, handle, batcher, instances,
                deadline=deadline, outputs=outputs, timing=timing, log=log,
            )  # fmt: skip
        except Exception:
            self._observe(handle, started, timing, ok=False)
            if self.payloads is not None:
                self.payloads.record(handle.name, handle.version, timing.get("rows"), None)
            raise
        if log is not None:
            log["batch_size"] = timing["batch_size"]
        self._observe(handle, started, timing, ok=True)
        if self.payloads is not None:
            self.payloads.record(handle.name, handle.version, timing["rows"], answer)
        return Inference(handle, answer)

    def _queue(
        self,
        runtime: ModelRuntime,
        handle: ModelHandle,
        batcher: ThreadedBatcher,
        instances: Instances,
        *,
        deadline: float,
        outputs: list[str] | None,
        timing: dict[str, Any],
        log: MutableMapping[str, Any] | None,
    ) -> Outputs:
        """Steps 3-6 of ``infer``; ``timing`` gets the batch size, the predict call's
        ``infer_s`` and the end of each stage (``perf_counter()``) for the statistics."""
        check_outputs(outputs, handle.output_names)
        rows = conform(instances, handle)
        if self.payloads is not None:  # taken before the model may write into its input
            timing["rows"] = self.payloads.keep(rows)
        timing["conformed"] = time.perf_counter()
        if log is not None:
            log.update(instances=len(rows), model=handle.name, model_version=handle.version)
        timeout_s = deadline - time.monotonic()
        if timeout_s <= 0:  # nothing queued: the time went into receiving the request
            limit_ms = self.settings.request_timeout_ms
            elapsed_ms = limit_ms - timeout_s * 1000
            raise RequestTimeout(
                f"the request took {elapsed_ms:.0f} ms to arrive, past "
                f"SERVING_REQUEST_TIMEOUT_MS ({limit_ms:g} ms)"
            )
        queued = batcher.queue_depth + len(rows)
        if queued <= runtime.settings.max_queue_depth:  # else refused below, never queued
            self.metrics.observe_queue(handle.name, handle.version, queued)
        try:
            answer = batcher.submit_many(
                rows, timeout_s=timeout_s, stats=timing, tag=tracing.current_span_context()
            )
        except Overloaded:
            self.metrics.rejected.labels(handle.name, handle.version).inc()
            raise
        finally:
            timing["answered"] = time.perf_counter()
        check_outputs(outputs, tuple(answer))
        return answer

    def _observe(
        self, handle: ModelHandle, started: float, timing: dict[str, Any], *, ok: bool
    ) -> None:
        """Record a request's stages for the V2 statistics extension (seconds; stages it
        did not reach count 0): compute_input is checking and conforming its instances,
        queue its wait in the batcher, compute_infer the predict call that answered it,
        compute_output checking its outputs."""
        tracing.record_stages(started, timing)  # spans, when OpenTelemetry is configured
        now = time.perf_counter()
        conformed = timing.get("conformed", now)
        answered = timing.get("answered", conformed)
        infer_s = timing.get("infer_s", 0.0)
        self.metrics.observe_stages(
            handle.name,
            handle.version,
            ok,
            compute_input=conformed - started,
            queue=max(answered - conformed - infer_s, 0.0),
            compute_infer=infer_s,
            compute_output=now - answered,
        )


def _count(instances: Instances) -> int:
    """Instances in a request; for tensors the most any input declares (inputs with
    different counts are refused later, by ``conform``)."""
    if isinstance(instances, Tensors):
        return max((len(v) if v.ndim else 0 for _, v in instances.inputs), default=0)
    return len(instances)


def check_outputs(wanted: list[str] | None, available: tuple[str, ...] | None) -> None:
    """:raises InvalidInput: (422) naming the first output in ``wanted`` the model does not
    have (nothing to check while ``available`` is unknown)."""
    for index, name in enumerate(wanted or ()):
        if available is not None and name not in available:
            loc, msg = f"outputs[{index}]", f"the model has no output {name!r}"
            msg += f" (it has {', '.join(available)})"
            raise InvalidInput(f"{loc}: {msg}", [{"loc": loc, "msg": msg, "type": "output"}])
