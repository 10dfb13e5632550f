"""Finding and running the Debian tools the deploy and browser tests use (nginx, promtool,
envsubst, chromium).

Locally a missing tool skips its tests, naming the package to install; in CI (``CI`` set,
as ``.ci/run`` does) it fails them, because ``.ci/run`` installs every one of them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

__all__ = ["PACKAGES", "check_promql", "require", "run"]

#: Debian package of each tool (``.ci/run`` installs them before the tests).
PACKAGES = {
    "nginx": "nginx-light",
    "promtool": "prometheus",
    "envsubst": "gettext-base",
    "chromium": "chromium",
}


def require(tool: str) -> str:
    """The path of ``tool``; skips the test when it is missing and ``CI`` is unset.

    :raises pytest.fail.Exception: when the tool is missing in CI.
    """
    path = shutil.which(tool, path=os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin")
    if path is not None:
        return path
    hint = f"{tool} not found (apt-get install {PACKAGES.get(tool, tool)})"
    if os.environ.get("CI"):
        pytest.fail(f"{hint}; .ci/run installs it", pytrace=False)
    pytest.skip(f"{hint}; CI fails here instead of skipping")


def run(
    args: list[str], stdin: str | None = None, timeout_s: float = 60.0, check: bool = True
) -> str:
    """Run a tool to completion; its combined output.

    :raises AssertionError: when it exits non-zero and ``check`` is true, with the command
        and its output.
    """
    done = subprocess.run(
        args,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0 or not check, (
        f"{' '.join(args)} exited {done.returncode}:\n{output}"
    )
    return output


def check_promql(exprs: list[str], directory: Path) -> None:
    """Parse each PromQL expression with ``promtool check rules`` (as recording rules).

    :raises AssertionError: naming promtool's complaint when one does not parse.
    """
    rules = [{"record": f"check:expr_{i}", "expr": expr} for i, expr in enumerate(exprs)]
    path = directory / "promql-check.yml"
    path.write_text(json.dumps({"groups": [{"name": "check", "rules": rules}]}))  # JSON is YAML
    run([require("promtool"), "check", "rules", str(path)])
