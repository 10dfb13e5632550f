"""The one request path every protocol shares, without a web framework.

A protocol's route reads its body, its codec decodes it into ``serving.inputs.instances``
(``Frame``, ``Records``, ``Columns`` or ``Tensors``, no model needed), and
``DataPlane.infer`` does the rest once, in this order:

1. the instance count against ``SERVING_MAX_INSTANCES_PER_REQUEST`` (413);
2. the model by name and version (``ModelCache.resolve``: 404, 409) and its readiness
   (``ModelRuntime.require_ready``: 503);
3. the output names asked for, against the model's (422);
4. ``serving.inputs.conform.conform``: the instances against the model's inputs, as the
   ``(n_instances, n_features)`` rows its batcher merges (422);
5. what is left of the request's deadline (408 when receiving the request used it up);
6. the model's batcher (``submit``, tagged with the
   request's ``Timing``): 503 overloaded (counted as rejected), 504 timeout, 500 when the
   model fails on these rows; the batcher's flush observer counts the stages of the
   requests a predict call answered for the V2 statistics, once per call;
7. a failed request's stages (``ServingMetrics.observe_stages``), the request's spans
   (``serving.observe.tracing``, when configured) and,
   when ``SERVING_PAYLOAD_LOG`` is on, its rows (copied before the model ran: a model
   may write into its input) and outputs to the payload log.

The codec then encodes ``Inference.outputs`` into its response body. Requests of every
protocol meet in the same batcher, so they are merged into the same predict calls.

Boundary: no Flask, werkzeug or request bodies (pydantic only through ``Settings``); a
test imports this module in a fresh interpreter. Deadlines are ``time.monotonic()``
values.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from serving.batching.arrivals import Arrivals, process_arrivals
from serving.batching.batcher import ThreadedBatcher
from serving.cache import ModelCache
from serving.context import Call, Timing
from serving.errors import (
    InvalidInput,
    Overloaded,
    PayloadTooLarge,
    RequestTimeout,
    VersionConflict,
)
from serving.inputs.conform import conform
from serving.inputs.instances import Instances, Tensors
from serving.inputs.rules import Rules
from serving.model.handle import ModelHandle, Outputs
from serving.observe import tracing
from serving.observe.metrics import ServingMetrics
from serving.observe.payload_log import PayloadLog
from serving.runtime import ModelRuntime
from serving.settings import Settings

__all__ = ["DataPlane", "Inference", "check_outputs"]

log = logging.getLogger(__name__)
#: Most (model, name) pairs logged as ignored per process: a client sending random names
#: cannot grow the set without bound.
_MAX_IGNORED = 1024
#: Most (rules, model, version) entries of the per-model rules kept per process.
_MAX_RULES = 256


@dataclass(slots=True)
class Inference:
    """One request's answer: the model that gave it, its named outputs (each with one
    entry per instance along the first axis) and the call's ``Timing`` (instances, batch
    size, stage marks)."""

    handle: ModelHandle
    outputs: Outputs
    timing: Timing


class DataPlane:
    """Resolve, check, queue and answer one request's instances on one model.

    :param get_models: this process's models (under Gunicorn built after the fork, so
        looked up per request rather than held).

    Usage::

        plane = DataPlane(settings, metrics, lambda: cache)
        answer = plane.infer(plane.call("req-1"), None, None, Frame([[1.0, 2.0, 3.0]]))
        answer.outputs["predictions"]
    """

    def __init__(
        self,
        settings: Settings,
        metrics: ServingMetrics,
        get_models: Callable[[], ModelCache],
        arrivals: Arrivals | None = None,
    ) -> None:
        self.settings = settings
        #: Requests on their way to a batcher (``serving.batching.arrivals``).
        self.arrivals = arrivals if arrivals is not None else process_arrivals()
        self.metrics = metrics
        self.get_models = get_models
        #: ``SERVING_PAYLOAD_LOG``'s sink, or None when it is off.
        self.payloads = PayloadLog.from_settings(settings, metrics)
        #: How requests' columns are taken unless a route says (``SERVING_EXTRA_COLUMNS``).
        self.rules = Rules(extra=settings.extra_columns)
        self._ignored_names: set[tuple[str, str, str]] = set()
        self._rules_for: dict[tuple[Rules | None, str, str], Rules] = {}

    @property
    def models(self) -> ModelCache:
        """This process's models."""
        return self.get_models()

    def call(
        self,
        request_id: str,
        *,
        protocol: str = "",
        route: str = "",
        started: float | None = None,
    ) -> Call:
        """A ``Call`` arriving now, due ``SERVING_REQUEST_TIMEOUT_MS`` from ``started``
        (``time.monotonic()``, default now), drawn for the payload log with probability
        ``SERVING_PAYLOAD_LOG_SAMPLE`` (never when it is off)."""
        deadline = (time.monotonic() if started is None else started) + (
            self.settings.request_timeout_ms / 1000
        )
        sample = self.settings.payload_log_sample
        sampled = self.payloads is not None and (sample >= 1 or random.random() < sample)
        return Call(request_id, deadline, protocol, route, sampled)

    def ready(
        self, name: str | None = None, version: str | None = None
    ) -> tuple[ModelRuntime, ModelHandle]:
        """The runtime and handle of model ``name`` at ``version`` (defaults: the first
        model, its first version), for metadata routes.

        :raises ModelNotFound: (404). :raises VersionConflict: (409).
        :raises NotReady: (503) while it loads or stops.
        """
        runtime = self.resolve(name, version)
        handle, _ = runtime.require_ready()
        return runtime, handle

    def resolve(self, name: str | None, version: str | None) -> ModelRuntime:
        """``ModelCache.resolve``; a ``VersionConflict`` also says why the repository does
        not serve the version asked for (its policy passed it over, it was refused).

        :raises ModelNotFound: (404). :raises VersionConflict: (409).
        """
        models = self.get_models()
        try:
            return models.resolve(name, version)
        except VersionConflict as exc:
            model = models.model_name if name is None else name
            why = {(r.model, r.version): r.reason for r in models.refused}
            if (model, exc.requested) not in why:
                raise
            reason = why[model, exc.requested]
            raise VersionConflict(exc.requested, exc.served, exc.name, reason) from None

    def infer(
        self,
        call: Call,
        model_name: str | None,
        version: str | None,
        instances: Instances,
        *,
        outputs: list[str] | None = None,
        rules: Rules | None = None,
    ) -> Inference:
        """Answer ``instances`` with model ``model_name`` (default: the first model) at
        ``version`` (default: its first), through the model's batcher, by ``call``'s
        deadline; ``call.timing`` gets the model, the instance count, the batch size and
        the end of each stage, whether it succeeds or not (the access log reads it).

        :param outputs: output names the caller asked for; each must be one of the model's.
        :param rules: how the request's columns are taken (``serving.inputs.rules``; default:
            ``SERVING_EXTRA_COLUMNS``); each name ignored is logged once per model.
        :raises ModelNotFound: (404) no model called ``model_name``.
        :raises VersionConflict: (409) the model is served here, but not at ``version``.
        :raises PayloadTooLarge: (413) above ``SERVING_MAX_INSTANCES_PER_REQUEST``.
        :raises NotReady: (503) the model is not loaded yet or is stopping.
        :raises InvalidInput: (422) an unknown output name, or instances that do not fit
            the model's inputs (``conform``), naming the instance and feature.
        :raises RequestTimeout: (408) when receiving the request used up the deadline.
        :raises Overloaded: (503) the model's queue is full (counted as rejected).
        :raises InferenceTimeout: (504) no answer by the deadline.
        :raises InferenceError: (500) the model failed on these instances.
        """
        timing = call.timing
        timing.model, timing.version = model_name, version  # asked for: logged on a 404
        runtime = self.resolve(model_name, version)  # 404 whatever the body
        limit = self.settings.max_instances_per_request
        count = _count(instances)
        if count > limit:
            raise PayloadTooLarge(
                "request", count, limit, "SERVING_MAX_INSTANCES_PER_REQUEST", "instances"
            )
        handle, batcher = runtime.require_ready()
        timing.model, timing.version = handle.name, handle.version
        payloads = self.payloads if call.sampled else None
        kept = None
        try:
            rows = self._conform(handle, instances, outputs, timing, self._rules(rules, handle))
            if payloads is not None:  # taken before the model may write into its input
                kept = payloads.keep(rows)
            answer = self._queue(handle, batcher, rows, call=call, outputs=outputs)
        except Exception:
            self._observe(handle, timing, ok=False)
            if payloads is not None and kept is not None:
                payloads.record(call, handle.name, handle.version, kept, None)
            raise
        self._observe(handle, timing, ok=True)
        if payloads is not None and kept is not None:
            payloads.record(call, handle.name, handle.version, kept, answer)
        return Inference(handle, answer, timing)

    def _rules(self, rules: Rules | None, handle: ModelHandle) -> Rules:
        """``rules`` (default ``self.rules``) reporting ignored names to a log for
        ``handle``: built once per rules and model, not per request."""
        key = (rules, handle.name, handle.version)
        found = self._rules_for.get(key)
        if found is None:
            if len(self._rules_for) >= _MAX_RULES:  # versions come and go: keep it bounded
                self._rules_for.clear()
            found = replace(rules or self.rules, on_ignored=self._ignored(*key[1:]))
            self._rules_for[key] = found
        return found

    def _ignored(self, model: str, version: str) -> Callable[[str], None]:
        """Log a name ``model`` ``version`` does not have, once per model and name. It
        holds the names, not the handle: a version dropped is freed (an attack saw each
        version published keep its ONNX session for the life of the worker)."""

        def log_once(name: str) -> None:
            key = (model, version, name)
            if key not in self._ignored_names and len(self._ignored_names) < _MAX_IGNORED:
                self._ignored_names.add(key)
                log.info(
                    "model %r version %r: ignoring %r, which it does not take "
                    "(SERVING_EXTRA_COLUMNS=ignore, or MLflow's rules on /invocations)",
                    model, version, name[:64],
                )  # fmt: skip

        return log_once

    @staticmethod
    def _conform(
        handle: ModelHandle,
        instances: Instances,
        outputs: list[str] | None,
        timing: Timing,
        rules: Rules,
    ) -> Any:
        """Steps 3 and 4 of ``infer``: the rows the batcher merges."""
        check_outputs(outputs, handle.output_names)
        rows = conform(instances, handle, rules)
        timing.instances, timing.conformed = len(rows), time.perf_counter()
        return rows

    def _queue(
        self,
        handle: ModelHandle,
        batcher: ThreadedBatcher,
        rows: Any,
        *,
        call: Call,
        outputs: list[str] | None,
    ) -> Outputs:
        """Steps 5 and 6 of ``infer``; ``call.timing`` gets the batch's size, its predict
        call's ``infer_s`` and when it was answered."""
        timing = call.timing
        timeout_s = call.deadline - time.monotonic()
        if timeout_s <= 0:  # nothing queued: the time went into receiving the request
            limit_ms = self.settings.request_timeout_ms
            elapsed_ms = limit_ms - timeout_s * 1000
            raise RequestTimeout(
                f"the request took {elapsed_ms:.0f} ms to arrive, past "
                f"SERVING_REQUEST_TIMEOUT_MS ({limit_ms:g} ms)"
            )
        self.arrivals.leave()  # at the batcher now: no longer on its way
        try:
            timing.span = tracing.current_span_context()
            answer = batcher.submit(rows, timeout_s, tag=timing)
        except Overloaded:
            self.metrics.count_rejected(handle.name, handle.version)
            raise
        finally:
            timing.answered = time.perf_counter()
        timing.batch_size, timing.infer_s, timing.merged = (
            answer.batch_size,
            answer.infer_s,
            answer.merged,
        )
        check_outputs(outputs, tuple(answer.outputs))
        return answer.outputs

    def _observe(self, handle: ModelHandle, timing: Timing, *, ok: bool) -> None:
        """Record a request's spans, when OpenTelemetry is configured, and a failed one's
        stages for the V2 statistics extension (seconds; stages it did not reach count 0).
        A batcher's flush observer counted the answered ones, per predict call; one that
        fails after its answer (an unknown output name) stays counted so."""
        tracing.record_stages(timing)
        if not ok and not timing.counted:
            self.metrics.observe_stages(handle.name, handle.version, ok, **timing.stages())


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
            raise InvalidInput.at(loc, msg, "output")
