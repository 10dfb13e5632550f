"""A stopping worker stops listening as soon as it stops accepting.

Gunicorn's gthread worker, once told to stop, stops taking connections from its listening
socket but keeps its copy of it open until it exits, up to 2 s later (kept-alive
connections linger) or the graceful timeout. The master has already closed its own copy,
yet while any process holds one the kernel still completes new connections into the
backlog: a client whose answer said ``Connection: close`` reconnected at once, sent its
request, and was reset when the last worker exited (13-16 of 16 keep-alive clients under
``SIGTERM`` with one worker). ``stop_listening_when_stopping`` closes the worker's copy
when its accept loop ends, so once every process has closed its copy a new client is
refused before it sends anything; a worker stopped alone (a reload, a recycle) leaves the
others listening.

Imports only the standard library.
"""

from __future__ import annotations

import contextlib
from typing import Any

__all__ = ["stop_listening_when_stopping"]


def stop_listening_when_stopping(worker: Any) -> None:
    """Make ``worker`` (a gthread worker, before its ``run``) close its listening sockets
    when it stops accepting because it is stopping (``alive`` false), not at exit. Does
    nothing to a worker without ``set_accept_enabled`` (Gunicorn before 27)."""
    set_accept_enabled = getattr(worker, "set_accept_enabled", None)
    if set_accept_enabled is None:
        return

    def closing_when_stopping(enabled: bool) -> None:
        set_accept_enabled(enabled)
        if not enabled and not worker.alive:
            for listener in worker.sockets:
                with contextlib.suppress(OSError):
                    listener.close()

    worker.set_accept_enabled = closing_when_stopping
