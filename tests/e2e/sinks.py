"""Test receivers on loopback: ``HttpSink``, the one HTTP server tests post to, keeping what
each POST carried as parsed by the sink's ``parse``; ``CloudEventSink`` parses CloudEvents with
the ``cloudevents`` SDK (binary or structured mode), ``OtlpSink`` OTLP/HTTP trace exports
with ``opentelemetry-proto``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cloudevents.core.bindings.http import HTTPMessage, from_http_event
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.waiting import until

__all__ = ["CloudEventSink", "HttpSink", "OtlpSink"]

#: ``parse(headers, body)``: the items one POST carried (an event, spans, ...).
Parse = Callable[[dict[str, str], bytes], list[Any]]


class HttpSink:
    """``with HttpSink(parse) as sink:`` an HTTP server on 127.0.0.1 answering each POST
    with ``status``, after ``delay_s`` seconds (a slow sink); ``items`` holds what
    ``parse`` made of every POST in arrival order, ``raw`` each POST's headers and body."""

    def __init__(
        self,
        parse: Parse,
        *,
        path: str = "",
        status: int = 200,
        content_type: str | None = None,
        delay_s: float = 0.0,
    ) -> None:
        self.items: list[Any] = []
        self.raw: list[tuple[dict[str, str], bytes]] = []
        self.delay_s = delay_s
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = dict(self.headers.items())
                items = parse(headers, body)
                with sink._lock:
                    sink.items.extend(items)
                    sink.raw.append((headers, body))
                time.sleep(sink.delay_s)
                self.send_response(status)
                if content_type is not None:
                    self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{path}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HttpSink:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def received(self, keep: Callable[[Any], bool] = lambda item: True) -> list[Any]:
        """The items received so far that ``keep`` is true of, in arrival order."""
        with self._lock:
            return [item for item in self.items if keep(item)]

    def wait_for(
        self, count: int, keep: Callable[[Any], bool] = lambda item: True, timeout_s: float = 30.0
    ) -> list[Any]:
        """The items ``keep`` is true of, once at least ``count`` of them have arrived.

        :raises AssertionError: fewer than ``count`` after ``timeout_s`` seconds.
        """
        return until(
            lambda: kept if len(kept := self.received(keep)) >= count else [],
            timeout_s, interval_s=0.05,
            what=lambda: f"{count} items ({len(self.received(keep))} came)",
        )  # fmt: skip


def _cloudevent(headers: dict[str, str], body: bytes) -> list[Any]:
    return [from_http_event(HTTPMessage(headers=headers, body=body))]


class CloudEventSink(HttpSink):
    """A payload-log receiver: each posted CloudEvent, parsed, in ``events``; answers 202."""

    def __init__(self, delay_s: float = 0.0) -> None:
        super().__init__(_cloudevent, path="/events", status=202, delay_s=delay_s)

    def __enter__(self) -> CloudEventSink:
        super().__enter__()
        return self

    @property
    def events(self) -> list[Any]:
        return self.received()


def _spans(headers: dict[str, str], body: bytes) -> list[tuple[dict[str, str], Any]]:
    request = ExportTraceServiceRequest.FromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
        for scope in resource_spans.scope_spans:
            spans.extend((resource, span) for span in scope.spans)
    return spans


class OtlpSink(HttpSink):
    """An OTLP/HTTP traces endpoint (``url`` is the ``OTEL_EXPORTER_OTLP_ENDPOINT``; the
    exporter posts to ``/v1/traces``): each span as ``(resource attributes, span)``."""

    def __init__(self) -> None:
        super().__init__(_spans, content_type="application/x-protobuf")

    def __enter__(self) -> OtlpSink:
        super().__enter__()
        return self

    def spans(self, keep: Callable[[Any], bool], count: int) -> list[Any]:
        """The spans ``keep(span)`` is true of, once ``count`` have arrived (AssertionError
        after 30 s)."""
        return [span for _, span in self.wait_for(count, lambda item: keep(item[1]))]
