"""Which engine should answer: the model's own library or ONNX Runtime (``SERVING_COMPILE``),
from the two sweeps of the same model on this machine.

Compiled wins when its call is at least ``WIN`` faster at one instance and at the batch
size the server would run; the setting that gets it is ``auto`` (the default) where the
server compiles such a model by itself, else ``on``. ONNX Runtime holds its own copy of a
tree ensemble in each worker (``BYTES_PER_NODE``, measured: docs/models.md, "Compiled to
ONNX Runtime"), which the recommendation states.

Boundary: numbers in, a choice out (no model, no settings, no files).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from serving.tune.sweep import SweepPoint

__all__ = ["BYTES_PER_NODE", "EngineChoice", "WIN", "choose_engine"]

#: Compiled must cost at most this share of the library's call to be worth it.
WIN = 0.9
#: ONNX Runtime's copy of a tree ensemble per worker, bytes per tree node (measured).
BYTES_PER_NODE = 420


@dataclass(frozen=True)
class EngineChoice:
    """What to set ``SERVING_COMPILE`` to, whether the model is then served compiled,
    and why."""

    setting: Literal["auto", "on", "off"]
    compiled: bool
    reasons: tuple[str, ...]


def choose_engine(
    library: list[SweepPoint],
    compiled: list[SweepPoint] | None,
    *,
    batch_size: int,
    auto_compiles: bool,
    nodes: int = 0,
    not_compiled: str | None = None,
) -> EngineChoice:
    """The engine for a model swept as ``library`` (its own predict) and ``compiled``
    (None when it did not compile: ``not_compiled`` says why).

    :param batch_size: the batch size the server would run (the recommendation's).
    :param auto_compiles: whether ``SERVING_COMPILE=auto`` compiles this model.
    :param nodes: its tree nodes (ONNX Runtime's copy per worker), 0 for none.
    """
    if compiled is None:
        return EngineChoice(
            "auto", False, (f"it does not compile: {not_compiled or 'not a scikit-learn model'}",)
        )
    one = _ratio(library, compiled, 1)
    full = _ratio(library, compiled, batch_size)
    speed = (
        f"a compiled call costs {one:.2g}x the library's at 1 instance and {full:.2g}x at "
        f"{batch_size}"
    )
    if one > WIN or full > WIN:
        setting: Literal["auto", "off"] = "off" if auto_compiles else "auto"
        default = "SERVING_COMPILE=auto compiles it: turn it off" if auto_compiles else (
            "SERVING_COMPILE=auto leaves it to the library"
        )  # fmt: skip
        return EngineChoice(setting, False, (f"{speed}: not worth it", default))
    reasons = [speed]
    if nodes:
        megabytes = nodes * BYTES_PER_NODE / 2**20
        reasons.append(
            f"ONNX Runtime holds its own copy of the {nodes:,} tree nodes in each worker "
            f"(about {megabytes:,.0f} MiB a worker), beside the library's shared one"
        )
    if auto_compiles:
        reasons.append("SERVING_COMPILE=auto (the default) compiles it")
        return EngineChoice("auto", True, tuple(reasons))
    reasons.append("SERVING_COMPILE=auto does not compile it: set SERVING_COMPILE=on")
    return EngineChoice("on", True, tuple(reasons))


def _ratio(library: list[SweepPoint], compiled: list[SweepPoint], size: int) -> float:
    """Compiled's call time over the library's at the swept size nearest ``size``."""
    at = min(library, key=lambda p: abs(p.batch_size - size)).batch_size
    mine = next(p for p in compiled if p.batch_size == at)
    theirs = next(p for p in library if p.batch_size == at)
    return mine.seconds_per_call / theirs.seconds_per_call
