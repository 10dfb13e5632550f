"""Test receivers on loopback: a CloudEvents HTTP sink that parses what it receives with
the ``cloudevents`` SDK (binary or structured mode), optionally slow."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cloudevents.core.bindings.http import HTTPMessage, from_http_event

from tests.waiting import until


class CloudEventSink:
    """``with CloudEventSink() as sink:`` an HTTP server on 127.0.0.1 collecting each
    posted CloudEvent (and its raw headers and body) in ``events``; ``delay_s`` sleeps
    before each answer (a slow sink)."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.events: list[Any] = []
        self.raw: list[tuple[dict[str, str], bytes]] = []
        self.delay_s = delay_s
        self._lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = dict(self.headers.items())
                event = from_http_event(HTTPMessage(headers=headers, body=body))
                with sink._lock:
                    sink.events.append(event)
                    sink.raw.append((headers, body))
                time.sleep(sink.delay_s)
                self.send_response(202)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/events"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> CloudEventSink:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def wait_for(self, count: int, timeout_s: float = 30.0) -> list[Any]:
        """The events once at least ``count`` have arrived (AssertionError after
        ``timeout_s``)."""

        def received() -> list[Any]:
            with self._lock:
                return list(self.events) if len(self.events) >= count else []

        return until(received, timeout_s, interval_s=0.05,
                     what=lambda: f"{count} events ({len(self.events)} came)")  # fmt: skip
