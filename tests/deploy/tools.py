"""Finding the Debian tools the deploy tests run (nginx, promtool, envsubst).

Locally a missing tool skips its tests, naming the package to install; in CI (``CI`` set,
as ``.ci/run`` does) it fails them, because ``.ci/run`` installs every one of them.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

__all__ = ["PACKAGES", "require", "run"]

#: Debian package of each tool (``.ci/run`` installs them before the tests).
PACKAGES = {"nginx": "nginx-light", "promtool": "prometheus", "envsubst": "gettext-base"}


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


def run(args: list[str], stdin: str | None = None, timeout_s: float = 60.0) -> str:
    """Run a tool to completion; its combined output.

    :raises AssertionError: when it exits non-zero, with the command and its output.
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
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{output}"
    return output
