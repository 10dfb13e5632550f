"""Run the shipped ``deploy/nginx/serving.conf.template`` in a real nginx on 127.0.0.1.

The template is rendered with ``envsubst`` restricted to its variables, as the official
nginx image does for /etc/nginx/templates/ (docker-compose.yml), and included in a
minimal nginx.conf that holds only what the image's own nginx.conf provides: pid, error
log and temporary paths, here under the test's directory. nginx runs in the foreground
(``daemon off``) in a new process group; readiness is polled against a monotonic deadline
and the error log is printed when start-up fails.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

from tests.deploy.tools import require, run
from tests.e2e.server import ROOT, free_port
from tests.waiting import until

__all__ = ["TEMPLATE", "VARIABLES", "NginxServer", "render", "template_variables"]

TEMPLATE = ROOT / "deploy" / "nginx" / "serving.conf.template"
#: Every variable the template takes (its header documents each).
VARIABLES = (
    "LISTEN_PORT",
    "STABLE_UPSTREAM",
    "CANARY_UPSTREAM",
    "STABLE_VERSION",
    "CANARY_VERSION",
    "CANARY_PERCENT",
    "MAX_BODY_BYTES",
    "ACCESS_LOG",
)


def template_variables(text: str) -> set[str]:
    """The ``${NAME}`` variables used in a template's configuration (comments excluded)."""
    code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    return set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)\}", code))


def render(values: dict[str, str], template: Path = TEMPLATE) -> str:
    """The template with ``values`` substituted by envsubst, nginx's ``$vars`` untouched.

    :raises AssertionError: when ``values`` does not name exactly the template's variables.
    """
    assert set(values) == set(VARIABLES), f"variables: {sorted(values)} != {sorted(VARIABLES)}"
    shell_format = " ".join(f"${{{name}}}" for name in VARIABLES)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **values}
    done = subprocess.run(
        [require("envsubst"), shell_format],
        input=template.read_text(),
        capture_output=True,
        text=True,
        env=env,
        timeout=10,
        check=True,
    )
    return done.stdout


class NginxServer:
    """nginx with the shipped template in front of a stable and a canary upstream.

    Usage::

        proxy = NginxServer(tmp_path, stable="127.0.0.1:8001", canary="127.0.0.1:8002",
                            stable_version="1", canary_version="2").start()
        proxy.wait_ready(); ...; proxy.stop()
    """

    def __init__(
        self,
        directory: Path,
        *,
        stable: str,
        canary: str,
        stable_version: str,
        canary_version: str,
        canary_percent: str = "10",
        max_body_bytes: int = 2 * 1024 * 1024,
    ) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.access_log = directory / "access.log"
        self.error_log = directory / "error.log"
        self.values = {
            "LISTEN_PORT": f"127.0.0.1:{self.port}",
            "STABLE_UPSTREAM": stable,
            "CANARY_UPSTREAM": canary,
            "STABLE_VERSION": stable_version,
            "CANARY_VERSION": canary_version,
            "CANARY_PERCENT": canary_percent,
            "MAX_BODY_BYTES": str(max_body_bytes),
            "ACCESS_LOG": str(self.access_log),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def write_config(self) -> Path:
        """Render the template and write the nginx.conf that includes it; its path."""
        (self.directory / "serving.conf").write_text(render(self.values))
        d = self.directory
        # As root, nginx would run its workers as nobody, who cannot enter pytest's 0700
        # directories; the user directive is only allowed (and needed) as root.
        user = "user root root;\n" if os.geteuid() == 0 else ""
        conf = d / "nginx.conf"
        conf.write_text(
            f"{user}worker_processes 1;\n"
            f"pid {d}/nginx.pid;\n"
            f"error_log {self.error_log} info;\n"
            "events { worker_connections 1024; }\n"
            "http {\n"
            f"    client_body_temp_path {d}/body;\n"
            f"    proxy_temp_path {d}/proxy;\n"
            f"    fastcgi_temp_path {d}/fastcgi;\n"
            f"    uwsgi_temp_path {d}/uwsgi;\n"
            f"    scgi_temp_path {d}/scgi;\n"
            f"    include {d}/serving.conf;\n"
            "}\n"
        )
        return conf

    def command(self) -> list[str]:
        conf = self.write_config()
        paths = ["-p", str(self.directory), "-c", str(conf), "-e", str(self.error_log)]
        return [require("nginx"), *paths]

    def check(self) -> str:
        """``nginx -t`` on the rendered configuration; its output."""
        return run([*self.command(), "-t"])

    def start(self) -> NginxServer:
        self.proc = subprocess.Popen(
            [*self.command(), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        return self

    def errors(self) -> str:
        return self.error_log.read_text(errors="replace") if self.error_log.exists() else ""

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        """Wait until the listener accepts connections."""

        def listening() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"nginx exited {self.proc.returncode}:\n{self.errors()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            except OSError:
                return False
            return True

        until(
            listening, timeout_s, interval_s=0.05, what=lambda: f"nginx listening:\n{self.errors()}"
        )

    def log_entries(self) -> list[dict[str, Any]]:
        """The JSON access log (``serving_json``), one dict per answered request."""
        if not self.access_log.exists():
            return []
        return [json.loads(line) for line in self.access_log.read_text().splitlines()]

    def wait_for_entries(self, count: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """The access log once it has at least ``count`` entries (nginx writes an entry after
        the response has gone out, so a client can be ahead of the log)."""
        return until(
            lambda: entries if len(entries := self.log_entries()) >= count else [], timeout_s,
            interval_s=0.05, what=lambda: f"{count} log entries ({len(self.log_entries())})",
        )  # fmt: skip

    def wait_for_entry(self, request_id: str, count: int = 1, timeout_s: float = 10.0) -> Any:
        """The latest entry of ``request_id`` once it has been logged ``count`` times."""

        def found() -> list[Any]:
            return [e for e in self.log_entries() if e["request_id"] == request_id]

        entries = until(lambda: f if len(f := found()) >= count else [], timeout_s,
                        interval_s=0.05, what=f"{request_id} logged {count}x")  # fmt: skip
        return entries[-1]

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGQUIT (graceful shutdown); nginx's exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"nginx still running after {timeout_s}s") from None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
