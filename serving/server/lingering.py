"""Graceful closes off the worker's main loop: ``Lingerer``.

Gunicorn closes a connection whose answer said ``Connection: close`` gracefully (RFC 9112
section 9.6): half-close, then read until the client closes, for at most 2 s. gthread does
it on the worker's main loop, which accepts nothing meanwhile: 10 clients that never
closed stopped a worker for 20 s, and 100 stalled bodies answered 408 for 200 s.
``ServingConn.close`` hands such a socket to a ``Lingerer`` instead: one daemon thread
lingers on every such socket at once.

Imports only the standard library.
"""

from __future__ import annotations

import queue
import selectors
import socket
import threading
import time
from typing import Any

__all__ = ["Lingerer"]


class Lingerer:
    """Closes half-closed sockets once their client closes, it has sent ``max_drain_bytes``
    more, or ``linger_s`` seconds have passed, for many sockets in one daemon thread."""

    def __init__(self, linger_s: float = 2.0, max_drain_bytes: int = 65536) -> None:
        self.linger_s, self.max_drain_bytes = linger_s, max_drain_bytes
        self._incoming: queue.SimpleQueue[tuple[socket.socket, float]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def close(self, sock: socket.socket) -> None:
        """Half-close ``sock`` now (the client sees the end of the response) and close it
        fully later, in the lingering thread."""
        try:
            sock.shutdown(socket.SHUT_WR)
            sock.setblocking(False)
        except OSError:
            sock.close()
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="serving-linger", daemon=True)
            self._thread.start()
        self._incoming.put((sock, time.monotonic() + self.linger_s))

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        lingering: dict[socket.socket, list[float]] = {}  # sock -> [deadline, bytes drained]

        def done(sock: socket.socket) -> None:
            del lingering[sock]
            selector.unregister(sock)
            sock.close()

        while True:
            try:
                block = not lingering
                while True:
                    sock, deadline = self._incoming.get(block=block)
                    block = False
                    lingering[sock] = [deadline, 0]
                    selector.register(sock, selectors.EVENT_READ)
            except queue.Empty:
                pass
            for key, _ in selector.select(timeout=0.05):
                readable: Any = key.fileobj
                try:
                    data = readable.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                lingering[readable][1] += len(data)
                if not data or lingering[readable][1] >= self.max_drain_bytes:
                    done(readable)
            now = time.monotonic()
            for sock in [s for s, (deadline, _) in lingering.items() if deadline <= now]:
                done(sock)
