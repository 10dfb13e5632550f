"""Written boundaries, checked: the batcher and loaders import no web stack or metrics."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = ("flask", "werkzeug", "pydantic", "prometheus_client", "gunicorn")


def fresh_python(code: str) -> str:
    """Run ``code`` in a new interpreter (nothing imported yet) and return what it printed."""
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
        check=True,
    )  # fmt: skip
    return result.stdout.strip()


@pytest.mark.parametrize(
    "module",
    [
        "serving.batching",
        "serving.pending",
        "serving.handle",
        "serving.loaders",
        "serving.onnx_loader",
        "serving.custom",
        "serving.providers",
        "serving.errors",
    ],
)
def test_core_module_imports_no_web_stack(module: str) -> None:
    code = (
        f"import sys, {module}\n"
        f"print(','.join(sorted(m for m in {FORBIDDEN!r} if m in sys.modules)))"
    )
    assert fresh_python(code) == ""


def test_gunicorn_config_does_not_import_prometheus_in_the_master() -> None:
    code = (
        "import runpy, sys\n"
        "runpy.run_path('gunicorn.conf.py')\n"
        "print('prometheus_client' in sys.modules, 'flask' in sys.modules)"
    )
    assert fresh_python(code) == "False False"
