"""What ``ServingWorker`` needs of its Gunicorn and its process, checked or set at start:
``unserved`` (a configuration it does not serve), ``missing_seam`` (a method or argument of
Gunicorn's it overrides or calls, missing from the installed one) and
``raise_open_files_limit``; ``refuse_new_connections`` (a listening socket that completes
no handshake any more, before its last copy is closed).

Imports only the standard library and Gunicorn.
"""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import resource
import socket
import struct
import sys
from typing import Any

from gunicorn import util  # type: ignore[import-untyped]
from gunicorn.http import parser, wsgi  # type: ignore[import-untyped]
from gunicorn.workers import gthread  # type: ignore[import-untyped]

__all__ = ["missing_seam", "raise_open_files_limit", "refuse_new_connections", "unserved"]

#: ``SO_ATTACH_FILTER`` (Linux, ``asm-generic/socket.h``); Python's socket module lacks it.
_SO_ATTACH_FILTER = 26


def unserved(cfg: Any) -> str | None:
    """What of Gunicorn's configuration ``ServingWorker`` does not serve, or None."""
    if cfg.is_ssl:
        return (
            "ServingWorker serves HTTP/1.1 over TCP: terminate TLS in front of it "
            "(deploy/nginx) and drop certfile/keyfile"
        )
    if "h2" in (getattr(cfg, "http_protocols", None) or ()):
        return "ServingWorker serves HTTP/1.1: drop h2 from http_protocols"
    if getattr(cfg, "protocol", "http") != "http":
        return f"ServingWorker serves HTTP/1.1, not the {cfg.protocol} protocol"
    return None


def missing_seam() -> str | None:
    """The first method or argument of Gunicorn's that ``ServingWorker`` builds on and
    this Gunicorn lacks, named, or None."""
    for owner, name in (
        (gthread.ThreadWorker, "murder_pending"),
        (gthread.ThreadWorker, "finish_request"),
        (gthread.ThreadWorker, "enqueue_req"),
        (gthread.ThreadWorker, "set_accept_enabled"),
        (gthread.ThreadWorker, "is_parent_alive"),
        (gthread.TConn, "init"),
        (wsgi.Response, "default_headers"),
        (util, "write_nonblock"),
    ):
        if not callable(getattr(owner, name, None)):
            return f"this Gunicorn has no {owner.__name__}.{name}; install gunicorn>=27,<28"
    if "deadline" not in inspect.signature(parser.Parser.finish_body).parameters:
        return "this Gunicorn's Parser.finish_body takes no deadline; install gunicorn>=27,<28"
    if "response_class" not in inspect.signature(wsgi.create).parameters:
        return "this Gunicorn's wsgi.create takes no response_class; install gunicorn>=27,<28"
    return None


def raise_open_files_limit(wanted: int) -> None:
    """Raise this process's soft limit on open files towards ``wanted`` (at most its hard
    limit): each idle connection holds a descriptor, and a soft limit of 1,024 (systemd's
    default) is fewer than Gunicorn's 1,000 ``worker_connections`` and the rest."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def refuse_new_connections(listener: Any) -> bool:
    """Make the listening socket ``listener`` drop every packet from now on (a classic BPF
    filter of one instruction, ``ret #0``): no handshake completes into its backlog any
    more, and a client's SYN goes unanswered until the socket is closed, when the kernel
    refuses its retry. The connections already in the backlog stay, to be accepted.
    Linux only; False, changing nothing, elsewhere or when the kernel refuses it.

    The filter is on the socket itself, shared by every process holding it: only for a
    server that stops as a whole (``ServingWorker._stop_listening``)."""
    if not sys.platform.startswith("linux"):
        return False
    drop_all = ctypes.create_string_buffer(struct.pack("HBBI", 0x06, 0, 0, 0))  # BPF_RET|BPF_K
    program = struct.pack("HxxxxxxQ", 1, ctypes.addressof(drop_all))  # struct sock_fprog
    try:
        listener.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, program)
    except OSError:
        return False
    return True
