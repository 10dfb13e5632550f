"""What the app does around every request, without Flask: before it, the request's
``Call`` (request id, deadline, route, payload-log draw) and its place among the requests
on their way to a batcher; after it, the request metrics and the access-log line, from
the call's ``Timing`` as the data plane filled it in.

The app's Flask hooks (``serving.app``) and the ``/predict`` fast path
(``serving.protocols.predict.fast``) both call these, so a request is counted and logged
the same whichever answered it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import Any

from serving.context import Call, new_request_id
from serving.dataplane import DataPlane
from serving.observe import access_log, tracing
from serving.observe.metrics import ServingMetrics

__all__ = ["RequestHooks"]

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class RequestHooks:
    """The start and the end of every request the app answers.

    Usage::

        hooks = RequestHooks(plane, metrics)
        call = hooks.start(environ, "predict", "/predict", predicts=True)
        ...                                         # plane.infer(call, ...)
        hooks.finish(call, "POST", 200, trace=None)
    """

    __slots__ = ("_access_log", "_arrivals", "_metrics", "_plane")

    def __init__(self, plane: DataPlane, metrics: ServingMetrics) -> None:
        self._plane = plane
        self._arrivals = plane.arrivals
        self._metrics = metrics
        self._access_log = plane.settings.access_log

    def start(
        self, environ: Mapping[str, Any], protocol: str, route: str, *, predicts: bool
    ) -> Call:
        """The ``Call`` of the request of WSGI ``environ``, arriving now: its
        ``X-Request-ID`` when it sent a valid one (1-128 of ``A-Za-z0-9._:-``), else a new
        one. A prediction route's request (``predicts``) is on its way to a batcher until
        the data plane queues it (under Gunicorn counted already, from its thread taking
        it up); any other (a probe, /metrics, the docs, a 404) is not, and no batch may
        wait for it.

        :param route: the route template (``/predict/{model_name}``), never the path.
        """
        incoming = environ.get("HTTP_X_REQUEST_ID", "")
        request_id = incoming if _REQUEST_ID.fullmatch(incoming) else new_request_id()
        call = self._plane.call(request_id, protocol=protocol, route=route)
        if predicts:
            self._arrivals.enter()
        else:
            self._arrivals.leave()
        return call

    def finish(self, call: Call, method: str, status: int, trace: Any) -> None:
        """The request of ``call`` is answered with HTTP ``status``: end its ``trace``
        (``tracing.start_request``'s, or None), count it in the request metrics and
        queue its access-log line (when ``SERVING_ACCESS_LOG`` is on)."""
        self._arrivals.leave()  # when it failed before a batcher
        timing = call.timing
        if trace is not None:
            tracing.end_request(trace, status)
        duration_s = time.perf_counter() - timing.started
        self._metrics.observe_request(method, call.route, status, duration_s)
        if self._access_log:
            model, version = timing.model, timing.version  # asked for, or answered by
            if model is None:  # a prediction naming none: the default model's request
                served = self._plane.models
                model, version = served.model_name, served.model_version
            fields = {
                "request_id": call.request_id,
                "method": method[:16],
                "route": call.route,
                "status": status,
                "latency_ms": round(duration_s * 1000, 3),
                "model": model or None,  # "": a route about no model (a probe, the index)
                "model_version": version if model else None,
            }
            if trace is not None and trace[2]:
                fields["trace_id"] = trace[2]
            if timing.instances:
                fields["instances"] = timing.instances
            if timing.batch_size:
                fields["batch_size"] = timing.batch_size
            access_log.record(fields)
