"""One predict call on a batch of requests: merge their rows, call the model, time it,
tell the observer, and answer each request exactly its own output rows; when the call
fails, retry it in halves by request, so only the requests whose instances make the model
fail get its error (a failing batch of n requests costs about 2 log2(n) extra calls; a
good batch costs none). No surveyed peer isolates failures so (docs/batching.md).

Run by ``ThreadedBatcher`` on its thread, or on a caller's thread at low load; one call
at a time either way (the batcher's model lock).

Boundary: the standard library, numpy, ``serving.errors`` and the sibling ``pending``.
Durations are measured with ``time.perf_counter()``, deadlines with ``time.monotonic()``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from serving.batching.pending import BatchOutputs, PendingRequest, split_outputs
from serving.errors import InferenceTimeout, InvalidInput, ServingError

__all__ = ["FlushStats", "PredictBatch", "PredictCalls"]

log = logging.getLogger(__name__)

#: ``predict_batch(rows)``: rows ``(n_instances, n_features)`` -> outputs of ``n_instances`` rows.
PredictBatch = Callable[[npt.NDArray[Any]], BatchOutputs]

#: Most predict calls spent naming the instance a failing request fails on.
_MAX_PROBES: Final = 24

#: Weight of the newest call in the moving average of a predict call's duration.
_AVERAGE_WEIGHT: Final = 0.1


@dataclass(slots=True)
class FlushStats:
    """What one flush did, handed to the ``on_flush`` observer after the predict call and
    before its requests are answered (so an answer's caller finds it counted).

    ``duration_s`` is the predict call's wall time in seconds, from ``called_at``
    (``perf_counter()``); ``queue_depth`` the instances still queued when it returned;
    ``error`` is set when the batch failed; ``tags`` are the ``submit`` tags of the
    requests it answers, in order: not those whose caller gave up or whose deadline
    passed before it returned (they get a timeout, as their callers count them), none
    when it failed.
    """

    batch_size: int
    n_requests: int
    duration_s: float
    queue_depth: int
    error: BaseException | None
    called_at: float = 0.0
    tags: tuple[Any, ...] = ()


def _merge(parts: list[npt.NDArray[Any]]) -> npt.NDArray[Any]:
    """The rows of several requests as one batch, in order."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


class PredictCalls:
    """The predict calls of one batcher, and what they tell it: the moving average of a
    call's duration (``average_s``, seconds; ``inf`` until the first call) and since when
    the current call runs (``busy_since``, ``time.monotonic()``; None when idle).

    :param lock: the batcher's lock: a call takes its requests under it (a caller giving
        up at its deadline takes the same lock), so each is answered or fails, never both.
    :param queue_depth: the instances still queued, for ``FlushStats``.
    """

    def __init__(
        self,
        predict_batch: PredictBatch,
        lock: threading.Lock,
        queue_depth: Callable[[], int],
        on_flush: Callable[[FlushStats], None] | None = None,
    ) -> None:
        self._predict = predict_batch
        self._lock = lock
        self._queue_depth = queue_depth
        self._on_flush = on_flush
        self.average_s = float("inf")
        self.busy_since: float | None = None

    def answer(self, batch: list[PendingRequest]) -> None:
        """Run ``batch`` (no longer counted in the queue depth; ``_model`` held) and answer
        or fail every request of it."""
        try:
            self._isolate(batch)
        except BaseException as exc:  # a bug of ours: still, nobody in this batch may hang
            log.exception("batcher failed on a batch; failing its requests")
            for request in batch:
                request.fail(f"the batcher failed: {type(exc).__name__}: {exc}", exc)

    def _isolate(self, batch: list[PendingRequest]) -> None:
        """Predict on ``batch``; if the call fails and holds several requests, bisect by
        request and retry each half, so only the requests whose instances make the model
        fail get its error and every other request still gets its predictions. A failing
        batch of n requests costs about 2 log2(n) extra calls; a good batch costs none."""
        error = self._call(batch)
        if error is None:
            return
        if len(batch) > 1:
            middle = len(batch) // 2
            self._isolate(batch[:middle])
            self._isolate(batch[middle:])
            return
        request = batch[0]
        rows = len(request.rows)
        named = isinstance(error, InvalidInput) or not isinstance(error, ServingError)
        where = (0 if rows == 1 else self._first_failing(request.rows)) if named else None
        if isinstance(error, ServingError):
            message = error.message
            if isinstance(error, InvalidInput) and where is not None:
                loc = f"instances[{where}]"
                details = [{**detail, "loc": loc} for detail in error.details]
                message = f"{loc}: {message}"
                error = InvalidInput(message, details)
        else:
            instances = (
                "1 instance" if rows == 1
                else f"{rows} instances" if where is None
                else f"instances[{where}] of {rows}"
            )  # fmt: skip
            message = f"model failed on {instances}: {type(error).__name__}: {error}"
        request.fail(message, error)

    def _first_failing(self, rows: npt.NDArray[Any]) -> int | None:
        """The index of a row of ``rows`` (a request whose predict call failed) on which
        the model fails alone, found by bisection: at most ``2 log2(len(rows))`` calls on
        ever smaller parts, only on this error path, answering nobody. None when no part
        fails alone (the model fails on the rows together) or after ``_MAX_PROBES`` calls."""
        start, stop, probes = 0, len(rows), 0
        self.busy_since = time.monotonic()  # a stuck probe is a stuck predict call
        try:
            while stop - start > 1 and probes < _MAX_PROBES:
                middle = (start + stop) // 2
                probes += 1
                if not self._succeeds(rows[start:middle]):
                    stop = middle
                    continue
                probes += 1
                if self._succeeds(rows[middle:stop]):
                    return None
                start = middle
        finally:
            self.busy_since = None
        return start if stop - start == 1 else None

    def _succeeds(self, rows: npt.NDArray[Any]) -> bool:
        try:
            split_outputs(self._predict(rows), [len(rows)])
        except BaseException:
            return False
        return True

    def _call(self, batch: list[PendingRequest]) -> BaseException | None:
        """One predict call: answers the requests of ``batch``, or returns the error."""
        sizes = [len(request.rows) for request in batch]
        rows = _merge([request.rows for request in batch])
        error: BaseException | None = None
        self.busy_since = time.monotonic()
        started = time.perf_counter()
        try:
            parts = split_outputs(self._predict(rows), sizes)
        except BaseException as exc:  # SystemExit from a model must not end the batcher
            error = exc
        duration_s = time.perf_counter() - started
        self.busy_since = None
        if self.average_s == float("inf"):
            self.average_s = duration_s
        else:
            self.average_s += _AVERAGE_WEIGHT * (duration_s - self.average_s)
        tags = tuple(request.tag for request in batch)
        taken: tuple[bool, ...] = ()
        if error is None:  # each request is answered, or failed if its caller gave up
            now = time.monotonic()
            with self._lock:
                taken = tuple(request.take(now) for request in batch)
        if self._on_flush is not None:
            answered = tuple(tag for tag, took in zip(tags, taken, strict=False) if took)
            stats = FlushStats(
                len(rows), len(batch), duration_s, self._queue_depth(), error, started, answered
            )
            try:
                self._on_flush(stats)
            except Exception:
                log.exception("on_flush observer failed")
        if error is None:
            for request, outputs, took in zip(batch, parts, taken, strict=True):
                if took:
                    request.answer(outputs, len(rows), duration_s, tags)
                else:
                    waited_ms = (request.deadline - request.enqueued_at) * 1000
                    message = f"no prediction within {waited_ms:.0f} ms"
                    request.fail(message, InferenceTimeout(message))
        return error
