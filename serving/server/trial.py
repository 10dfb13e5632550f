"""A trial load in a separate process, before the master loads a new model version to share.

The Gunicorn master loads the pickle, joblib and skops models its workers share
(``serving.server.sharing``). A file whose load crashes the process (a native library
built for another version reading the wrong memory, a pickle that calls ``os.abort``)
would take the master down with it, and with it every worker serving the old versions.
So on a reload, before the master loads what changed, a fresh interpreter
(``python -m serving.server.trial``) loads the same models from the same settings first:
only when it did not die (a signal) and ended within ``SERVING_LOAD_TIMEOUT_S`` does the
master load them (a load that fails with an error fails the same way in the master,
which says so as it always has). Otherwise the master's load is left out: each new
worker loads its own, and one that dies loading is noticed as such
(``serving.server.repository.Quarantine``).

Boundary: standard library and ``serving.loading`` / ``serving.model_settings`` (the
child); no Gunicorn, Flask or prometheus-client.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence

from serving.model_settings import ModelSettings

__all__ = ["main", "trial_load"]


def trial_load(models: Sequence[ModelSettings], timeout_s: float) -> str | None:
    """Load ``models`` in a fresh interpreter with this process's ``sys.path``: why the
    master must not load them (``died of SIGSEGV``, ``took longer than 30 s
    (SERVING_LOAD_TIMEOUT_S)``), or None: they loaded, or failed with an error the
    master's own load reports as it always has (its load fails the same way, safely)."""
    payload = json.dumps([model.model_dump(mode="json") for model in models])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "serving.server.trial"],
            input=payload, capture_output=True, text=True, timeout=timeout_s, env=env,
            check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"took longer than {timeout_s:g} s (SERVING_LOAD_TIMEOUT_S)"
    if done.returncode < 0:
        return f"died of {signal.Signals(-done.returncode).name}"
    return None


def main() -> None:
    """The child: load each model of the JSON list on stdin as the master would (an
    error exits 1 with its traceback)."""
    from serving.loading import load_artifact

    for fields in json.loads(sys.stdin.read()):
        load_artifact(ModelSettings.model_validate(fields))


if __name__ == "__main__":
    main()
