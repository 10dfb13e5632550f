"""serving.observe.memory: the PSS a load adds, as the kernel counts it, and the
libraries it imported first."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from serving.observe import memory
from serving.observe.memory import Look

MIB = 2**20


def test_look_added_counts_the_pages_an_array_touches() -> None:
    before = Look.now()
    assert before.pss is not None and before.pss > 10 * MIB  # an interpreter with numpy
    ballast = np.ones(32 * MIB // 8)  # written: every page resident
    added, imported = before.added()
    assert added is not None and 30 * MIB <= added <= 40 * MIB
    assert imported == ()
    untouched, _ = Look.now().added()
    assert untouched is not None and untouched < 4 * MIB
    del ballast


def test_look_added_names_the_libraries_imported_since(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "freshlib").mkdir()
    (tmp_path / "freshlib" / "__init__.py").write_text("import freshlib.part\n")
    (tmp_path / "freshlib" / "part.py").write_text("")
    (tmp_path / "_private.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = Look.now()
    import _private  # noqa: F401
    import freshlib  # noqa: F401

    try:
        assert before.added()[1] == ("freshlib",)
    finally:
        for name in ("freshlib", "freshlib.part", "_private"):
            sys.modules.pop(name, None)


def test_look_added_is_none_when_a_look_cannot_tell(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert Look(None).added()[0] is None
    monkeypatch.setattr(memory, "_ROLLUP", tmp_path / "absent")
    assert memory.pss_bytes() is None
    assert Look(10 * MIB).added()[0] is None
