"""Dynamic micro-batching: one thread per worker merges instances of concurrent requests.

Request threads call ``ThreadedBatcher.submit_many(rows)`` and block; the batcher's one
background thread takes queued instances off a ``queue.SimpleQueue`` (the ``queue``
module's C-implemented FIFO: no Python-level locking per put/get) and makes one
``predict_batch`` call per batch on a single ``(n_instances, n_features)`` array (or a
record array of typed columns, ``serving.inputs.conform``) built from
instances of different requests, then hands each caller exactly its own output rows.

Two flush policies (``docs/batching.md`` draws both):

- ``window``: a batch is flushed when it holds ``max_batch_size`` instances, or when its
  first instance has waited ``max_batch_latency_ms`` since it was queued, whichever comes
  first: Triton's dynamic batcher (``max_queue_delay_microseconds``), TF Serving's
  ``batch_timeout_micros``.
- ``adaptive`` (default): nobody waits for a window. While a predict call runs, arrivals
  accumulate in the queue; when the model is free again, everything queued goes at once
  (up to ``max_batch_size``). Batches grow with load by themselves: size 1 when idle, full
  when saturated. This is Triton's dynamic batcher with ``max_queue_delay`` 0 and the
  "batch what arrived while busy" behaviour Clipper (Crankshaw et al., NSDI 2017) starts
  from. One wait remains: while other requests of the worker are on their way to a
  batcher (``Arrivals``), a batch waits for them, at most one predict call's time (a
  moving average) or ``max_batch_latency_ms``, whichever is shorter.

  A lone request pays no hand-off: one that finds nothing queued, the model idle and
  no other request of this worker on its way to a batcher (``Arrivals``: taken up by a
  worker thread with bytes to read, not yet queued) runs its own rows on its own
  thread, as the naive
  server would, when recent calls took less than half the time the caller has left: a
  call on the caller's thread cannot be abandoned at its deadline, so one not expected
  to fit is not started there but queued, where the caller stops waiting at its
  deadline. If a call on the caller's thread still ends past the deadline, the caller
  gets ``InferenceTimeout`` as a queued caller would (the outputs are dropped), never a
  late answer. Two thread wake-ups are saved, which on an idle multi-core VM cost about
  as much as a light model's predict call (``docs/batching.md``).
  With other requests on their way, every request goes through the batcher thread, so
  they merge: the gate looks at what is in flight now, not at how much past calls
  merged, and cannot lock itself into running requests one by one (issue 19: a gate on
  the average batch size stayed at batches of one once they had collapsed). What
  arrives while a caller runs its own rows queues and goes as the next batch on the
  batcher thread. The "leader/follower" pattern (Schmidt et al., *Pattern-Oriented
  Software Architecture* vol. 2), gated by load so that it never breaks batches up.

A request is never split: one that does not fit in the room left opens the next batch,
and one larger than ``max_batch_size`` runs alone in one call (its size is bounded by
``max_instances_per_request``; splitting it would only add calls: 125 instances through
a 300-tree forest cost 4 calls of 19 ms at 32 per call, or one of 21 ms).
Rows of a different width never share a batch. A failing call is retried in halves by
request, so only the requests that make the model fail get its error. The queue is
bounded (``max_queue_depth``, refused at once) and a caller's deadline drops its queued
instances.

Boundary: this module imports only the standard library, numpy, ``serving.errors`` and its
siblings ``arrivals`` and ``pending`` (no Flask, no pydantic, no prometheus; see README.md);
observers get plain ``FlushStats`` through a callback.
Durations are measured with ``time.perf_counter()``, deadlines with ``time.monotonic()``.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Final, Literal

import numpy.typing as npt

from serving.batching.arrivals import Arrivals
from serving.batching.calls import FlushStats, PredictBatch, PredictCalls
from serving.batching.pending import Answer, BatchOutputs, PendingRequest, split_outputs
from serving.errors import InferenceTimeout, NotReady, Overloaded

__all__ = [
    "BatchOutputs",
    "BatchPolicy",
    "FlushStats",
    "PredictBatch",
    "ThreadedBatcher",
    "split_outputs",
]

log = logging.getLogger(__name__)

#: ``window``: wait up to max_batch_latency_ms to fill a batch; ``adaptive``: never wait.
BatchPolicy = Literal["adaptive", "window"]

_STOP: Final = object()


def _key(rows: npt.NDArray[Any]) -> tuple[Any, ...]:
    """What rows must share to be merged into one predict call: their width and element
    type (a record array's fields, for typed batches)."""
    return (rows.dtype, rows.shape[1:])


class ThreadedBatcher:
    """Merge the instances of concurrent requests into batched ``predict_batch`` calls.

    :param predict_batch: called on the batcher thread (at low load on the caller's,
        one call at a time either way) with the merged batch: a matrix
        ``(n_instances, n_features)`` or a record array ``(n_instances,)``, whichever the
        callers submitted (merged by ``(dtype, shape[1:])``); returns named outputs of
        ``n_instances`` rows each.
    :param max_batch_size: most instances per predict call (>= 1).
    :param max_batch_latency_ms: ``window`` policy: longest the first instance of a batch
        waits for more instances, in milliseconds (0: flush whatever is queued at once).
    :param policy: ``adaptive`` (default: flush what is queued as soon as the model is
        free) or ``window`` (wait up to ``max_batch_latency_ms`` to fill the batch).
    :param max_queue_depth: most instances waiting; beyond it ``submit_many`` refuses at
        once (backpressure) instead of letting latency grow without bound.
    :param on_flush: optional observer called after each predict call, on the thread
        that made it, before that call's requests are answered.
    :param on_queue: optional observer of the queue depth (instances) each time a request
        is queued, under the batcher's lock (so depths arrive in order); a request run
        on its caller's thread is never queued.
    :param arrivals: this worker's requests on their way to a batcher (``adaptive``: a
        request runs on its caller's thread only when none is); None: none ever are.

    Usage::

        batcher = ThreadedBatcher(model.predict_batch, max_batch_size=32).start()
        outputs = batcher.submit_many(np.array([[1.0, 2.0]]))   # {"predictions": array([...])}
        batcher.stop()                                         # answers all queued, then refuses
    """

    def __init__(
        self,
        predict_batch: PredictBatch,
        *,
        max_batch_size: int = 32,
        max_batch_latency_ms: float = 10.0,
        policy: BatchPolicy = "adaptive",
        max_queue_depth: int = 2048,
        on_flush: Callable[[FlushStats], None] | None = None,
        on_queue: Callable[[int], None] | None = None,
        name: str = "serving-batcher",
        arrivals: Arrivals | None = None,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_batch_latency_ms < 0:
            raise ValueError(f"max_batch_latency_ms must be >= 0, got {max_batch_latency_ms}")
        self.max_batch_size = max_batch_size
        self.max_batch_latency_ms = max_batch_latency_ms
        if policy not in ("adaptive", "window"):
            raise ValueError(f"policy must be 'adaptive' or 'window', got {policy!r}")
        self.policy = policy
        self.max_queue_depth = max_queue_depth
        self._latency_s = max_batch_latency_ms / 1000.0
        self._on_queue = on_queue
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()  # orders submit against stop: nothing lands after _STOP
        # Held for every batch from its collection to its answers: by the batcher thread,
        # or by a caller running its own rows. Taken after _lock, never waited for while
        # holding it (callers only try it), so the two cannot deadlock.
        self._model = threading.Lock()
        self._inline = policy == "adaptive"
        self._arrivals = arrivals if arrivals is not None else Arrivals()
        self._accepting = False
        self._depth = 0
        self._carry: PendingRequest | None = None
        self._stop_seen = False
        # Its moving average of a call's time is written under _model. It reads the depth
        # through a weak reference: a batcher and its calls in a reference cycle held a
        # dropped model (an ONNX session) until a full collection.
        me = weakref.ref(self)
        self._calls = PredictCalls(
            predict_batch, self._lock, lambda: getattr(me(), "_depth", 0), on_flush
        )
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def queue_depth(self) -> int:
        """Instances queued and not yet taken into a batch."""
        return self._depth

    @property
    def busy_for_s(self) -> float:
        """Seconds the current predict call has been running (0.0 when the model is idle)."""
        since = self._calls.busy_since
        return 0.0 if since is None else time.monotonic() - since

    @property
    def running(self) -> bool:
        """True while the batcher thread runs and accepts new instances."""
        return self._accepting and self._thread.is_alive()

    def start(self) -> ThreadedBatcher:
        """Start the batcher thread; returns ``self``. Starting twice raises ``RuntimeError``."""
        with self._lock:
            self._thread.start()
            self._accepting = True
        return self

    def submit_many(
        self, instances: npt.NDArray[Any], timeout_s: float | None = None
    ) -> dict[str, npt.NDArray[Any]]:
        """``submit(instances, timeout_s).outputs``: the named outputs for exactly these
        instances, in order (raises as ``submit`` does)."""
        return self.submit(instances, timeout_s).outputs

    def submit(
        self, instances: npt.NDArray[Any], timeout_s: float | None = None, tag: Any = None
    ) -> Answer:
        """Queue ``instances`` and block until all of them are answered.

        :param instances: array of shape ``(n_instances, n_features)``, or a record array
            of ``(n_instances,)`` with one typed field per feature; ``n_instances >= 1``.
        :param timeout_s: longest to wait for the answer, in seconds; ``None`` waits until
            the batcher answers (it always does: every queued instance is answered or failed).
            Instances still queued when it has passed are dropped, not computed.
        :param tag: anything, handed back in the ``merged`` tags of every request merged
            with these instances (the data plane's trace span contexts).
        :returns: the named outputs for exactly these instances, in order, with the size,
            time and merged tags of the predict call that answered them.
        :raises ValueError: when ``instances`` is not a non-empty 2-D array.
        :raises NotReady: when the batcher is not started or is stopping.
        :raises Overloaded: at once, when the queue holds instances and these would take it
            past ``max_queue_depth`` (a request alone in the queue is always taken).
        :raises InferenceError: when the predict call of a batch holding these instances
            raised or returned a wrong number of rows.
        :raises InferenceTimeout: when ``timeout_s`` passed first; on the caller's own
            thread, when the call ended after it (the outputs are dropped).
        """
        typed = instances.ndim == 1 and instances.dtype.names is not None
        if not (instances.ndim == 2 or typed) or len(instances) == 0:
            raise ValueError(
                "instances must be (n_instances >= 1, n_features), or a record array of "
                f"(n_instances >= 1,), got {instances.shape}"
            )
        request = PendingRequest(instances, timeout_s, tag)
        with self._lock:
            if not self._accepting:
                raise NotReady("the batcher is not running (starting up or shutting down)")
            depth = self._depth
            # Nothing queued, no batch collected or running, and no other request on its
            # way to merge with: run it here (module docstring).
            inline = (
                self._inline
                and not depth
                and not self._arrivals.coming()
                and (timeout_s is None or 2 * self._calls.average_s < timeout_s)
                and self._model.acquire(blocking=False)
            )
            if not inline:
                if depth and depth + len(instances) > self.max_queue_depth:
                    raise Overloaded(
                        f"{depth} instances are queued; {len(instances)} more would pass the "
                        f"limit of {self.max_queue_depth} (SERVING_MAX_QUEUE_DEPTH)"
                    )
                self._depth = depth + len(instances)
                self._queue.put(request)
                if self._on_queue is not None:
                    self._on_queue(self._depth)
        if inline:
            try:
                self._calls.answer([request])
            finally:
                self._model.release()
            # An answer past the deadline is failed by ``_call`` (not taken); a failure
            # past it is a timeout too, as a queued caller's wait would have ended
            if request.error is not None and time.monotonic() > request.deadline:
                assert timeout_s is not None
                raise InferenceTimeout(f"no prediction within {timeout_s * 1000:.0f} ms")
            return self._result(request)
        if not request.wait(timeout_s):
            with self._lock:
                given_up = request.give_up()
            if given_up:
                assert timeout_s is not None
                raise InferenceTimeout(f"no prediction within {timeout_s * 1000:.0f} ms")
            request.wait(None)  # taken by a call that returned in time: answered right after
        return self._result(request)

    @staticmethod
    def _result(request: PendingRequest) -> Answer:
        return Answer(request.result(), request.batch_size, request.infer_s, request.merged)

    def stop(self, timeout_s: float | None = None) -> None:
        """Refuse new instances, answer every instance already queued (and wait for a
        caller running its own rows), then end the thread.

        :param timeout_s: longest to wait for the drain, in seconds (``None``: until done).
        """
        with self._lock:
            if not self._accepting:
                return
            self._accepting = False
            self._queue.put(_STOP)
        started = time.monotonic()
        self._thread.join(timeout_s)
        # A caller running its own rows holds the model lock: wait for its answer too.
        left = -1.0 if timeout_s is None else max(timeout_s - (time.monotonic() - started), 0.0)
        if self._model.acquire(timeout=left):
            self._model.release()

    # -- the batcher thread --------------------------------------------------------------

    def _run(self) -> None:
        try:
            while (first := self._first()) is not None:
                with self._model:  # waits for a caller running its own rows
                    batch = self._collect(first)  # empty if ``first`` died meanwhile
                    if batch:
                        self._flush(batch)
        except BaseException as exc:  # a bug here must not leave any caller waiting
            log.exception("batcher thread died; failing every queued instance")
            with self._lock:  # after this no submit can queue, so the drain below is final
                self._accepting = False
            self._fail_all(f"the batcher failed: {exc}", exc)
            raise

    def _next(self, timeout_s: float | None) -> PendingRequest | None:
        """The next request: the carried-over one first, then the queue; None when none came."""
        if self._carry is not None:
            carried, self._carry = self._carry, None
            return carried
        if self._stop_seen:
            return None
        try:
            if timeout_s is None or timeout_s > 0:
                item = self._queue.get(timeout=timeout_s)
            else:
                item = self._queue.get_nowait()
        except queue.Empty:
            return None
        if item is _STOP:
            self._stop_seen = True
            return None
        request: PendingRequest = item
        return request

    def _first(self) -> PendingRequest | None:
        """Block for the first live request of the next batch; None once stopped."""
        request = self._next(None)
        while request is not None and request.dead():
            self._discard(request)  # failed already, or its caller has given up waiting
            request = self._next(None)
        return request

    def _collect(self, first: PendingRequest) -> list[PendingRequest]:
        """Fill the batch opened by ``first`` until it is full or its time is up: under
        ``window``, ``max_batch_latency_ms`` from ``first``'s arrival; under ``adaptive``,
        what is queued, and while other requests are on their way (``Arrivals``), up to a
        predict call's time (moving average) or ``max_batch_latency_ms`` more for them."""
        request: PendingRequest | None = first
        key = _key(first.rows)
        adaptive = self.policy == "adaptive"
        if adaptive:
            deadline = time.monotonic() + min(self._calls.average_s, self._latency_s)
        else:
            deadline = first.enqueued_at + self._latency_s
        batch: list[PendingRequest] = []
        size = 0
        while request is not None:
            if request.dead():
                self._discard(request)
            elif _key(request.rows) != key:
                self._carry = request
                break
            else:
                if batch and size + len(request.rows) > self.max_batch_size:
                    self._carry = request  # does not fit: it opens the next batch
                    break
                batch.append(request)
                size += len(request.rows)
                if size >= self.max_batch_size:
                    break
            wait_s = deadline - time.monotonic()
            if adaptive and not self._arrivals.count:
                wait_s = 0.0  # nobody on the way: what is queued goes now
            request = self._next(wait_s)
        return batch

    def _discard(self, request: PendingRequest) -> None:
        with self._lock:
            self._depth -= len(request.rows)

    def _flush(self, batch: list[PendingRequest]) -> None:
        with self._lock:
            self._depth -= sum(len(request.rows) for request in batch)
        self._calls.answer(batch)

    def _fail_all(self, message: str, cause: BaseException) -> None:
        if self._carry is not None:
            self._carry.fail(message, cause)
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not _STOP:
                item.fail(message, cause)
