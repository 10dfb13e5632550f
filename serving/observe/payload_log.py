"""Payload logging: what the model saw and answered, sent to a sink for drift monitoring
and replay, without ever slowing or failing a prediction.

``SERVING_PAYLOAD_LOG=request|response|all`` logs, for each sampled request that reached a
model (``SERVING_PAYLOAD_LOG_SAMPLE``), a *request* record (the decoded instances, as the
model's ``(n_instances, n_features)`` rows, or one object per instance for typed models)
and, when it was answered, a *response* record (the named outputs). Each is a CloudEvent
with KServe's logger conventions, so its consumers work unchanged: ``type``
``org.kubeflow.serving.inference.request`` / ``.response``, ``id`` the request id
(``X-Request-ID``, so both records of a request share it), ``source``
``/serving/<hostname>``, and the extensions ``inferenceservicename`` (model name),
``modelversion``, ``endpoint`` (the route template), ``protocol`` and ``component``.
Headers are never read, so API keys and ``Authorization`` cannot appear in a record.

Sinks (``SERVING_PAYLOAD_LOG_URL``, in ``serving.observe.payload_sinks``): ``http(s)://``
posts each record with the ``cloudevents`` SDK in binary or structured mode
(``SERVING_PAYLOAD_LOG_MODE``), retrying with doubling backoff from 0.1 s;
``file:///path.jsonl`` appends each record as one structured-mode JSON line to
``path-<pid>.jsonl`` (one file per worker, so rotation at
``SERVING_PAYLOAD_LOG_FILE_MAX_BYTES`` never races). A file sink whose directory cannot be
written stops the server at start (``check_sink``).

A request thread only copies the rows it logs before the model sees them (``keep``: a
model may write into its input) and puts a tuple on a queue (``put_nowait``); the numpy
arrays are turned into JSON by one background thread per worker, started on the first
record in that process (so after Gunicorn's fork). The queue holds at most
``SERVING_PAYLOAD_LOG_QUEUE_SIZE`` records and ``SERVING_PAYLOAD_LOG_QUEUE_BYTES`` bytes of
arrays (a record being sent counts until it is sent): beyond either, a record is dropped
(``queue_full``), as is one the sink refused after every retry (``sink_error``: a dead
collector, a full disk, a removed directory); both are counted in
``payload_log_dropped_total{reason}`` and ``payload_log_dropped_bytes_total{reason}``, and
said in the log at the first drop, then at most once a minute with the count, never with
a traceback. Nothing here raises into a request.

Boundary: no Flask (the request id, protocol and route arrive in the ``Call`` the data
plane passes, ``serving.context``).
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

from serving.context import Call
from serving.observe.complaint import Complaint
from serving.observe.metrics import ServingMetrics
from serving.observe.payload_sinks import FileSink, check_sink, file_path, http_sink
from serving.settings import Settings

__all__ = ["EVENT_TYPE", "PayloadLog"]

log = logging.getLogger(__name__)

#: CloudEvent types of KServe's payload logger, by record kind.
EVENT_TYPE: Final = {
    "request": "org.kubeflow.serving.inference.request",
    "response": "org.kubeflow.serving.inference.response",
}
_STOP: Final = object()

Kind = Literal["request", "response"]


class PayloadLog:
    """The payload log of one process (lazily started after fork).

    :raises SettingsError: when its file sink cannot be written (``check_sink``).

    Usage::

        payloads = PayloadLog.from_settings(settings, metrics)   # None when off
        rows = payloads.keep(rows)                       # before the model runs
        payloads.record(call, "m", "1", rows, outputs)   # outputs None: the request failed
    """

    def __init__(self, settings: Settings, metrics: ServingMetrics) -> None:
        if settings.payload_log_url is None:
            raise ValueError("a payload log needs SERVING_PAYLOAD_LOG_URL")
        check_sink(settings)
        self.settings = settings
        self.metrics = metrics
        self.url = settings.payload_log_url
        self.kinds = {"request", "response"} if settings.payload_log == "all" else {
            settings.payload_log
        }  # fmt: skip
        self.source = f"/serving/{socket.gethostname()}"
        self.max_bytes = settings.payload_log_queue_bytes
        self._pid = -1
        self._queue: queue.Queue[Any] = queue.Queue(settings.payload_log_queue_size)
        self._held = 0  # bytes of the records queued or being sent, under _held_lock
        self._held_lock = threading.Lock()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._said = {
            reason: Complaint(
                log, "payload log records", f'payload_log_dropped_total{{reason="{reason}"}}'
            )
            for reason in ("queue_full", "sink_error", "stopped")
        }

    @classmethod
    def from_settings(cls, settings: Settings, metrics: ServingMetrics) -> PayloadLog | None:
        """The payload log ``SERVING_PAYLOAD_LOG`` asks for, or None when it is off."""
        return None if settings.payload_log == "off" else cls(settings, metrics)

    @property
    def held_bytes(self) -> int:
        """Bytes of arrays in this process's queue and in the record being sent."""
        return self._held

    def keep(self, rows: npt.NDArray[Any]) -> npt.NDArray[Any]:
        """What ``record`` will need of a sampled request's ``rows``, taken before the
        model sees them: a copy when its request record is logged (a model may write into
        its input; a copy costs a memcpy of the rows, on sampled requests only), else the
        rows themselves (only its response is logged)."""
        return rows.copy() if "request" in self.kinds else rows

    def record(
        self,
        call: Call,
        model: str,
        version: str,
        rows: npt.NDArray[Any],
        outputs: dict[str, npt.NDArray[Any]] | None,
    ) -> None:
        """Queue the records of ``call`` (a sampled one: ``call.sampled``): its ``rows``
        (from ``keep``) when ``request`` is logged, its ``outputs`` (None when it failed)
        when ``response`` is, named by its request id, protocol and route.
        Never blocks, never raises: a record that does not fit is dropped and counted."""
        meta = (call.request_id, call.protocol, call.route, model, version, time.time())
        if "request" in self.kinds:
            self._put(("request", meta, rows), nbytes(rows))
        if outputs is not None and "response" in self.kinds:
            self._put(("response", meta, outputs), sum(map(nbytes, outputs.values())))

    def _put(self, item: tuple[Kind, tuple[Any, ...], Any], size: int) -> None:
        if self._pid != os.getpid():
            self._start()
        with self._held_lock:
            fits = self._held + size <= self.max_bytes
            if fits:
                self._held += size
        if fits:
            try:
                self._queue.put_nowait((*item, size))
                return
            except queue.Full:
                self._release(size)
        self._drop("queue_full", size, "the sink is behind: the queue is full "
                   "(SERVING_PAYLOAD_LOG_QUEUE_SIZE, SERVING_PAYLOAD_LOG_QUEUE_BYTES)")  # fmt: skip

    def _release(self, size: int) -> None:
        with self._held_lock:
            self._held -= size

    def _drop(self, reason: str, size: int, why: str) -> None:
        self.metrics.payload_log_dropped.labels(reason).inc()
        self.metrics.payload_log_dropped_bytes.labels(reason).inc(size)
        self._said[reason].drop(why)

    def _start(self) -> None:
        """Start this process's sender thread (a fresh queue: one inherited from the
        parent through fork has no thread behind it)."""
        with self._lock:
            if self._pid == os.getpid():
                return
            self._queue = queue.Queue(self.settings.payload_log_queue_size)
            self._held = 0
            self._thread = threading.Thread(
                target=self._run, args=(self._queue,), name="payload-log", daemon=True
            )
            self._thread.start()
            self._pid = os.getpid()
            atexit.register(self.stop, 2.0)

    def stop(self, timeout_s: float | None = None) -> None:
        """Send what is queued (up to ``timeout_s`` seconds), then end the thread; what is
        still queued then is dropped and counted (``reason="stopped"``)."""
        thread = self._thread
        if thread is None or self._pid != os.getpid():
            return
        try:
            self._queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            pass
        else:
            thread.join(timeout_s)
        while True:  # records a stopping worker will never send (found by the attack)
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                self._release(item[3])
                self._drop("stopped", item[3], "the worker stopped before they were sent")

    def _sink(self) -> Callable[[Any], None]:
        if self.url.startswith("http"):
            return http_sink(self.settings)
        s = self.settings
        return FileSink(file_path(s), s.payload_log_file_max_bytes, s.payload_log_file_backups)

    def _run(self, items: queue.Queue[Any]) -> None:
        send = self._sink()
        said = self._said["sink_error"]
        while (item := items.get()) is not _STOP:
            kind, meta, payload, size = item
            try:
                send(self._event(kind, meta, payload))
            except Exception as exc:
                self._drop("sink_error", size, f"the sink failed: {type(exc).__name__}: {exc}")
            else:
                said.ok()
            finally:
                self._release(size)
        if isinstance(send, FileSink):
            send.close()

    def _event(self, kind: Kind, meta: tuple[Any, ...], payload: Any) -> Any:
        from cloudevents.core.v1.event import CloudEvent  # the SDK only when logging is on

        request_id, protocol, endpoint, model, version, at = meta
        data: dict[str, Any] = {"model_name": model, "model_version": version}
        if kind == "request":
            data["instances"] = _jsonable_rows(payload)
        else:
            data["outputs"] = {name: np.asarray(v).tolist() for name, v in payload.items()}
        attributes = {
            "type": EVENT_TYPE[kind],
            "source": self.source,
            "id": request_id,
            "time": datetime.fromtimestamp(at, UTC),  # when the model answered
            "datacontenttype": "application/json",
            "inferenceservicename": model,
            "modelversion": version,
            "endpoint": endpoint,
            "protocol": protocol,
            "component": "predictor",
        }
        return CloudEvent(attributes, data)


def _jsonable_rows(rows: npt.NDArray[Any]) -> list[Any]:
    """``(n_instances, n_features)`` rows as lists; a record array (typed features) as
    one object per instance keyed by feature."""
    names = rows.dtype.names
    if names is None:
        return list(rows.tolist())
    return [dict(zip(names, row, strict=True)) for row in rows.tolist()]


def nbytes(value: npt.NDArray[Any]) -> int:
    """Bytes an array holds: its buffer and, for object elements (the strings of typed
    features or labels), each object's ``sys.getsizeof``."""
    size = int(value.nbytes)
    if value.dtype.hasobject:
        fields = value.dtype.names
        columns = [value] if fields is None else [value[f] for f in fields]
        for column in columns:
            if column.dtype.hasobject:
                size += sum(map(sys.getsizeof, column.ravel().tolist()))
    return size
