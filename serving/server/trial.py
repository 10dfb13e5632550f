"""A trial load in a separate process, before the master loads a new model version to share.

The Gunicorn master loads the pickle, joblib and skops models its workers share
(``serving.server.sharing``). A file whose load crashes the process (a native library
built for another version reading the wrong memory, a pickle that calls ``os.abort``)
would take the master down with it, and with it every worker serving the old versions.
So on a reload, before the master loads what changed, a fresh interpreter
(``python -m serving.server.trial``) loads the same models from the same settings first:
only when it exits 0 does the master load them. A trial that dies, fails or runs past
``SERVING_LOAD_TIMEOUT_S`` leaves the master's load out: each new worker loads its own,
and one that dies loading is noticed as such (``serving.server.repository.Quarantine``).

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

#: The most of a failed trial's own words kept in the reason.
_MAX_REASON = 300


def trial_load(models: Sequence[ModelSettings], timeout_s: float) -> str | None:
    """Load ``models`` in a fresh interpreter with this process's ``sys.path``: None when
    it loaded them all, else why not (``died of SIGSEGV``, ``failed: <its error>``,
    ``took longer than 30 s``)."""
    payload = json.dumps([model.model_dump(mode="json") for model in models])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "serving.server.trial"],
            input=payload, capture_output=True, text=True, timeout=timeout_s, env=env,
            check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return f"took longer than {timeout_s:g} s"
    if done.returncode == 0:
        return None
    if done.returncode < 0:
        return f"died of {signal.Signals(-done.returncode).name}"
    said = (done.stderr.strip().splitlines() or ["no error given"])[-1]
    return f"failed: {said[:_MAX_REASON]}"


def main() -> None:
    """The child: load each model of the JSON list on stdin as the master would; exit 1
    with one line on stderr when one fails."""
    from serving.loading import load_artifact

    for fields in json.loads(sys.stdin.read()):
        model = ModelSettings.model_validate(fields)
        try:
            load_artifact(model)
        except Exception as exc:  # the master would have failed the same way
            print(f"{model.name!r} version {model.version!r}: {exc}", file=sys.stderr)
            raise SystemExit(1) from None


if __name__ == "__main__":
    main()
