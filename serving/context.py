"""A request's context, passed explicitly: the app's hooks make a ``Call`` when a request
arrives; the route hands it to ``DataPlane.infer``, which fills in its ``Timing`` (the
model that answered and when each stage ended); the access log, the V2 statistics, the
payload log and the trace read them back. No ``flask.g`` below the app's hooks, no
out-parameter dict, no context variable.

Boundary: standard library only. Clocks: ``time.monotonic()`` for the deadline,
``time.perf_counter()`` for stage marks (seconds).
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BODY_OVER_LIMIT",
    "CLOSE_CONNECTION",
    "REQUEST_STAGES",
    "Call",
    "Timing",
    "new_request_id",
    "stage_seconds",
]

#: WSGI environ key our Gunicorn worker sets (True) on a request whose chunked body, as
#: its main loop read it, declared more data than ``SERVING_MAX_BODY_BYTES``: the body
#: read answers 413 at once instead of waiting for data it would refuse.
BODY_OVER_LIMIT = "serving.body_over_limit"
#: WSGI environ key the application sets (True) on a request whose answer must close its
#: connection, which our Gunicorn worker does (an application's own ``Connection`` header
#: is dropped by Gunicorn): a model load or unload answered by a worker on its way out,
#: whose next request on the same connection would still see what it served.
CLOSE_CONNECTION = "serving.close_connection"
#: The stages of a request as Triton's statistics extension names them, in its order.
REQUEST_STAGES = ("queue", "compute_input", "compute_infer", "compute_output")

# A request id: this process's random prefix (drawn again in each forked child) and a
# count. Unique across workers and restarts as a random id is, without a getrandom
# system call per request (secrets.token_hex made one).
_prefix = [os.urandom(8).hex()]
_count = itertools.count()
os.register_at_fork(after_in_child=lambda: _prefix.__setitem__(0, os.urandom(8).hex()))


def new_request_id() -> str:
    """A request id for a request that came without one: 32 lowercase hex digits, never
    the same twice in this process or in another (a fork draws a new prefix)."""
    return f"{_prefix[0]}{next(_count) & 0xFFFFFFFFFFFFFFFF:016x}"


@dataclass(slots=True)
class Timing:
    """What the data plane did for one request: the model that answered it and the
    ``perf_counter()`` end of each stage it reached (None: not reached).

    :param started: when the request arrived.
    :param conformed: its instances were checked and merged-ready (``conform``).
    :param answered: its batch's predict call returned.
    :param infer_s: that call's wall time, in seconds.
    :param batch_size: instances in that call; ``instances``: this request's.
    :param merged: the ``Timing`` of every request merged into that call, this one's too.
    :param span: the request's trace span context (None when not traced), linked from
        the predict span of every request merged with it.
    :param counted: the batcher's observer counted it answered in the V2 statistics (once
        per batch, ``serving.observe.metrics``); a request failing after that is not
        counted again.
    """

    started: float
    model: str | None = None
    version: str | None = None
    instances: int = 0
    conformed: float | None = None
    answered: float | None = None
    infer_s: float = 0.0
    batch_size: int = 0
    merged: tuple[Any, ...] = ()
    span: Any = None
    counted: bool = False

    @property
    def computed(self) -> float | None:
        """When the predict call that answered began: ``answered - infer_s``, never before
        ``conformed`` (the call may have started before this request joined the queue)."""
        if self.answered is None or self.conformed is None:
            return None
        return max(self.answered - self.infer_s, self.conformed)

    def stages(self, now: float | None = None) -> dict[str, float]:
        """Seconds per stage of ``REQUEST_STAGES`` (0 for those not reached): queue its
        wait in the batcher, compute_input checking its instances, compute_infer the
        predict call, compute_output from the answer to ``now`` (default: now)."""
        now = time.perf_counter() if now is None else now
        conformed = self.conformed if self.conformed is not None else now
        answered = self.answered if self.answered is not None else conformed
        seconds = stage_seconds(self.started, conformed, answered, self.infer_s, now)
        return dict(zip(REQUEST_STAGES, seconds, strict=True))


def stage_seconds(
    started: float, conformed: float, answered: float, infer_s: float, now: float
) -> tuple[float, float, float, float]:
    """A request's seconds in each of ``REQUEST_STAGES``, in its order, from its
    ``perf_counter()`` marks: arrived (``started``), instances checked (``conformed``), its
    predict call of ``infer_s`` seconds returned (``answered``), and ``now``. The queue
    wait never counts the part of the call that ran before the request was queued."""
    return (max(answered - conformed - infer_s, 0.0), conformed - started, infer_s, now - answered)


@dataclass(slots=True)
class Call:
    """Who asks and by when: one request as the data plane sees it.

    :param request_id: its ``X-Request-ID`` (the caller's, or one made up).
    :param deadline: ``time.monotonic()`` by which its answer is due.
    :param protocol: the protocol it came by (``predict``, ``v2``, ``tfserving``,
        ``mlflow``), as the payload log names it.
    :param route: its route template (``/v2/models/{model_name}/infer``).
    :param sampled: its request and response go to the payload log.

    Usage::

        call = Call.start("req-1", timeout_s=30.0)
        answer = plane.infer(call, None, None, Frame([[1.0, 2.0, 3.0]]))
        call.timing.batch_size                   # the predict call that answered it
    """

    request_id: str
    deadline: float
    protocol: str = ""
    route: str = ""
    sampled: bool = False
    timing: Timing = field(default_factory=lambda: Timing(time.perf_counter()))

    @classmethod
    def start(
        cls, request_id: str, timeout_s: float, *, protocol: str = "", route: str = "",
        sampled: bool = False,
    ) -> Call:  # fmt: skip
        """A call arriving now, due ``timeout_s`` seconds from now."""
        started = time.perf_counter()
        return cls(
            request_id, time.monotonic() + timeout_s, protocol, route, sampled,
            Timing(started),
        )  # fmt: skip
