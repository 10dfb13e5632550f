"""What the master checks before it starts, so a mistake stops it with one line:
``SERVING_*`` names that are no setting (likely typos; Kubernetes' own service variables
excepted) and an address another process holds.

Imports the standard library, Gunicorn's ``systemd`` helper and the settings class.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping
from typing import Any

from gunicorn import systemd  # type: ignore[import-untyped]

from serving.settings import Settings

__all__ = ["address_taken", "unknown_variables"]

#: Variables Kubernetes injects for a Service named "serving" (SERVING_SERVICE_HOST, SERVING_PORT,
#: SERVING_PORT_8000_TCP_ADDR, ...): not ours, not typos.
_INJECTED = re.compile(r"^SERVING_(SERVICE_[A-Z_]+|PORT(_\d+_[A-Z]+(_[A-Z]+)?)?)$")


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """``SERVING_*`` names in ``environ`` that are no setting (likely typos), sorted."""
    known = {f"SERVING_{name.upper()}" for name in Settings.model_fields}
    return sorted(
        name
        for name in environ
        if name.startswith("SERVING_") and name not in known and not _INJECTED.match(name)
    )


def address_taken(server: Any) -> str | None:
    """``"HOST:PORT: why"`` for the first TCP address of the bind that another process
    holds, or None. Gunicorn, binding after ``on_starting``, retries for 5 s first, while
    a health check may reach whatever holds the port: the start stops at once instead.
    Not checked for sockets it inherits (a ``SIGUSR2`` generation, systemd) or shares
    (``reuse_port``)."""
    if server.master_pid or server.cfg.reuse_port or systemd.listen_fds(False):
        return None
    for address in server.cfg.address:
        if not isinstance(address, tuple):  # unix:/path or fd://N
            continue
        host, port = address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Gunicorn binds
            try:
                probe.bind((host, port))
            except OSError as exc:
                shown = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
                return (
                    f"{shown}: {exc.strerror} (another process holds it: stop it, or set "
                    "SERVING_BIND)"
                )
    return None
