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

Sinks (``SERVING_PAYLOAD_LOG_URL``): ``http(s)://`` posts each record with the
``cloudevents`` SDK in binary or structured mode (``SERVING_PAYLOAD_LOG_MODE``), retrying
with doubling backoff from 0.1 s; ``file:///path.jsonl`` appends each record as one
structured-mode JSON line to ``path-<pid>.jsonl`` (one file per worker, so rotation at
``SERVING_PAYLOAD_LOG_FILE_MAX_BYTES`` never races), rotated by the standard library's
``RotatingFileHandler``.

A request thread only puts a tuple on a bounded queue (``put_nowait``); the numpy arrays
are turned into JSON by one background thread per worker, started on the first record in
that process (so after Gunicorn's fork). A full queue, and a record whose retries all
failed, are dropped and counted in ``payload_log_dropped_total{reason}``.

Boundary: no Flask (the route and request id arrive through ``bind``, a context
variable set by ``serving.app``).
"""

from __future__ import annotations

import atexit
import contextvars
import logging
import logging.handlers
import os
import queue
import random
import socket
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np
import numpy.typing as npt

from serving.observe.metrics import ServingMetrics
from serving.settings import Settings

__all__ = ["EVENT_TYPE", "PayloadLog", "bind"]

log = logging.getLogger(__name__)

#: CloudEvent types of KServe's payload logger, by record kind.
EVENT_TYPE: Final = {
    "request": "org.kubeflow.serving.inference.request",
    "response": "org.kubeflow.serving.inference.response",
}
_STOP: Final = object()
_BACKOFF_S = 0.1

#: This request's (request id, protocol, endpoint, sampled), set by ``bind``.
_current: contextvars.ContextVar[tuple[str, str, str, bool]] = contextvars.ContextVar(
    "serving_payload_request"
)

Kind = Literal["request", "response"]


def bind(request_id: str, protocol: str, endpoint: str, sample: float) -> None:
    """Name the request this thread now serves, and draw whether it is logged (with
    probability ``sample``); called by the app before each request."""
    sampled = sample >= 1 or random.random() < sample
    _current.set((request_id, protocol, endpoint, sampled))


class PayloadLog:
    """The payload log of one process (lazily started after fork).

    Usage::

        payloads = PayloadLog.from_settings(settings, metrics)   # None when off
        bind("req-1", "v2", "/v2/models/{model_name}/infer", 1.0)
        payloads.record("m", "1", rows, outputs)   # outputs None when the request failed
    """

    def __init__(self, settings: Settings, metrics: ServingMetrics) -> None:
        if settings.payload_log_url is None:
            raise ValueError("a payload log needs SERVING_PAYLOAD_LOG_URL")
        self.settings = settings
        self.metrics = metrics
        self.url = settings.payload_log_url
        self.kinds = {"request", "response"} if settings.payload_log == "all" else {
            settings.payload_log
        }  # fmt: skip
        self.source = f"/serving/{socket.gethostname()}"
        self._pid = -1
        self._queue: queue.Queue[Any] = queue.Queue(settings.payload_log_queue_size)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_settings(cls, settings: Settings, metrics: ServingMetrics) -> PayloadLog | None:
        """The payload log ``SERVING_PAYLOAD_LOG`` asks for, or None when it is off."""
        return None if settings.payload_log == "off" else cls(settings, metrics)

    def record(
        self,
        model: str,
        version: str,
        rows: npt.NDArray[Any] | None,
        outputs: dict[str, npt.NDArray[Any]] | None,
    ) -> None:
        """Queue the records of the bound request (none when it was not sampled or no
        ``bind`` named it): its ``rows`` when ``request`` is logged, its ``outputs`` (None
        when it failed) when ``response`` is. Never blocks, never raises."""
        current = _current.get(None)
        if current is None or not current[3] or rows is None:
            return
        request_id, protocol, endpoint, _ = current
        meta = (request_id, protocol, endpoint, model, version, time.time())
        if "request" in self.kinds:
            self._put(("request", meta, rows))
        if outputs is not None and "response" in self.kinds:
            self._put(("response", meta, outputs))

    def _put(self, item: tuple[Kind, tuple[Any, ...], Any]) -> None:
        if self._pid != os.getpid():
            self._start()
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.metrics.payload_log_dropped.labels("queue_full").inc()

    def _start(self) -> None:
        """Start this process's sender thread (a fresh queue: one inherited from the
        parent through fork has no thread behind it)."""
        with self._lock:
            if self._pid == os.getpid():
                return
            self._queue = queue.Queue(self.settings.payload_log_queue_size)
            sink = _http_sink(self.settings) if self.url.startswith("http") else None
            writer = None if sink is not None else _FileWriter(self.settings)
            self._thread = threading.Thread(
                target=self._run, args=(self._queue, sink, writer), name="payload-log",
                daemon=True,
            )  # fmt: skip
            self._thread.start()
            self._pid = os.getpid()
            atexit.register(self.stop, 2.0)

    def stop(self, timeout_s: float | None = None) -> None:
        """Send what is queued (up to ``timeout_s`` seconds), then end the thread."""
        thread = self._thread
        if thread is None or self._pid != os.getpid():
            return
        try:
            self._queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            return
        thread.join(timeout_s)

    def _run(self, items: queue.Queue[Any], sink: Any, writer: _FileWriter | None) -> None:
        send = sink if sink is not None else writer
        assert send is not None
        failures = 0
        while (item := items.get()) is not _STOP:
            try:
                send(self._event(*item))
            except Exception as exc:
                if failures % 1000 == 0:  # the first failure, then 1 in 1000
                    log.warning("payload log record dropped: %s: %s", type(exc).__name__, exc)
                failures += 1
                self.metrics.payload_log_dropped.labels("sink_error").inc()
        if writer is not None:
            writer.close()

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


def _http_sink(settings: Settings) -> Any:
    """``send(event)``: post it in the configured content mode, retrying with backoff.

    :raises OSError: when every try failed (the caller counts the drop).
    """
    from cloudevents.core.bindings import http

    encode = http.to_binary_event if settings.payload_log_mode == "binary" else (
        http.to_structured_event
    )  # fmt: skip
    url = settings.payload_log_url
    assert url is not None
    timeout_s = settings.payload_log_timeout_ms / 1000
    tries = settings.payload_log_retries + 1

    def send(event: Any) -> None:
        message = encode(event)
        for attempt in range(tries):
            request = urllib.request.Request(
                url, data=message.body, headers=message.headers, method="POST"
            )
            try:
                with urllib.request.urlopen(request, timeout=timeout_s) as response:
                    response.read()
                return
            except OSError:  # URLError, HTTPError, timeouts, refused connections
                if attempt == tries - 1:
                    raise
                time.sleep(_BACKOFF_S * 2**attempt)

    return send


class _FileWriter:
    """``write(event)``: one structured-mode JSON line in this worker's rotated file."""

    def __init__(self, settings: Settings) -> None:
        from cloudevents.core.bindings import http

        assert settings.payload_log_url is not None
        url = settings.payload_log_url.removeprefix("file://")
        path = Path(urllib.request.url2pathname(url))
        own = path.with_name(f"{path.stem}-{os.getpid()}{path.suffix}")
        self._encode = http.to_structured_event
        self._handler = logging.handlers.RotatingFileHandler(
            own,
            maxBytes=settings.payload_log_file_max_bytes,
            backupCount=settings.payload_log_file_backups,
            encoding="utf-8",
        )
        self._handler.setFormatter(logging.Formatter("%(message)s"))

    def __call__(self, event: Any) -> None:
        line = self._encode(event).body.decode()
        self._handler.emit(logging.makeLogRecord({"msg": line, "levelno": logging.INFO}))
        self._handler.flush()

    def close(self) -> None:
        self._handler.close()
