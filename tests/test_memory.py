"""serving.observe.memory: the PSS a load adds, as the kernel counts it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from serving.observe import memory

MIB = 2**20


def test_added_since_counts_the_pages_an_array_touches() -> None:
    before = memory.pss_bytes()
    assert before is not None and before > 10 * MIB  # an interpreter with numpy loaded
    ballast = np.ones(32 * MIB // 8)  # written: every page resident
    added = memory.added_since(before)
    assert added is not None and 30 * MIB <= added <= 40 * MIB
    untouched = memory.added_since(memory.pss_bytes())
    assert untouched is not None and untouched < 4 * MIB
    del ballast


def test_added_since_is_none_when_a_look_cannot_tell(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert memory.added_since(None) is None
    monkeypatch.setattr(memory, "_ROLLUP", tmp_path / "absent")
    assert memory.pss_bytes() is None
    assert memory.added_since(10 * MIB) is None
