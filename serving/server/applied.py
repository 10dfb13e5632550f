"""How a model control call (``serving.server.control``) learns its outcome: the master's
note at each reload of the change number it applies and the generation it forks
(``note_applied``), and the wait on the board until that generation serves, or fails
(``outcome``).

Imports only the standard library, ``serving.errors`` and the board.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Literal, NamedTuple

from serving.errors import NotReady
from serving.server.board import GOING, Board, server_stopping, write_json

__all__ = ["OLD_WAIT_S", "OTHER_WAIT_S", "Failed", "note_applied", "outcome"]

_APPLIED = "explicit-applied.json"
#: Seconds between two looks at the board while a call waits.
_LOOK_S = 0.05


def note_applied(board: Board, changes: int, generation: int, problem: str | None) -> None:
    """Master, at each reload: it applies ``changes`` calls (at least) to the workers of
    ``generation`` it will fork, or refused the reload for ``problem``."""
    note = {"changes": changes, "generation": generation, "error": problem}
    write_json(board.path / _APPLIED, note)


class Failed(NamedTuple):
    """Why the reload applying a call failed; ``other``: on another model than the call's
    (a model no call changed, whose file broke in place)."""

    why: str
    other: bool = False


def outcome(board: Board, changes: int, deadline_s: float, name: str = "") -> Failed | None:
    """Wait until the reload that applies change ``changes`` is over: None when every
    worker not leaving is of its generation or newer and ready, and the older ones are
    gone (this one, and those waiting on a call, excepted; at most ``OLD_WAIT_S`` more:
    one draining a long request is not waited for); else why it failed. A worker of that
    generation that could not load another model than ``name`` (a call at the same time:
    its own to undo) is waited past, for ``OTHER_WAIT_S`` at most.

    :raises TimeoutError: past ``deadline_s`` seconds.
    :raises NotReady: when the server stops meanwhile.
    """
    end = time.monotonic() + deadline_s
    past = -1  # a generation failed by another model: wait for a newer one
    other: tuple[float, str] | None = None  # since when, and why
    served_since: float | None = None
    marker = board.path / f"{_WAITING}{os.getpid()}"
    marker.touch()
    try:
        while time.monotonic() < end:
            if server_stopping():
                raise NotReady("the server is stopping: the change may not have been applied")
            note = _applied(board)
            if note is None or note["changes"] < changes or note["generation"] <= past:
                if other is not None and time.monotonic() - other[0] > OTHER_WAIT_S:
                    return Failed(other[1], other=True)  # no call undid it
                time.sleep(_LOOK_S)
                continue
            if note["error"]:
                return Failed(str(note["error"]))
            state, why = _look(board, note["generation"], name)
            if state == "failed":
                return Failed(why)
            if state == "other":
                past, other = note["generation"], (time.monotonic(), why)
            if state in ("served", "over"):
                served_since = served_since or time.monotonic()
                if state == "over" or time.monotonic() - served_since > OLD_WAIT_S:
                    return None
            time.sleep(_LOOK_S)
    finally:
        marker.unlink(missing_ok=True)
    raise TimeoutError


#: Longest a call waits, once every worker serves its change, for the older workers to
#: go (an idle kept-alive connection lingers 2 s on a worker on its way out).
OLD_WAIT_S = 3.0
#: Longest a call waits past a reload whose workers failed on another model, for the call
#: that changed that model to undo it; past it, the failure is this call's too.
OTHER_WAIT_S = 5.0

_WAITING = "waiting."


def _look(
    board: Board, generation: int, name: str
) -> tuple[Literal["failed", "other", "loading", "served", "over"], str]:
    """Where the reload of ``generation`` is: a worker of it ``failed`` to load ``name``
    (or a model it does not say: the reason), or failed on an ``other`` model; still
    ``loading``; every worker staying ``served`` by it and ready, with older ones left;
    or ``over``."""
    fleet = board.read()
    staying = [pid for pid, state in fleet.states.items() if state not in GOING]
    newer = [p for p in staying if fleet.generations.get(p, -1) >= generation]
    for pid in newer:
        if fleet.failed(pid) and pid in fleet.errors:
            failed = fleet.failed_models.get(pid)
            why = f"worker {pid}: {fleet.errors[pid]}"
            return ("other" if name and failed is not None and failed[0] != name else "failed"), why
    for death in board.deaths():  # a crash in native code leaves no error behind
        if death.generation is not None and death.generation >= generation:
            why = (
                f"worker {death.pid} died while loading {death.name}/{death.version} (the "
                "process ended: a crash in native code, or an exit, while the file loaded)"
            )
            return ("other" if name and death.name != name else "failed"), why
    if (
        not newer
        or len(newer) < len(staying)
        or any(
            fleet.states[p] != "ready" or p in fleet.stages
            for p in newer  # stage: in place
        )
    ):
        return "loading", ""
    me = os.getpid()
    older = [
        pid
        for pid in fleet.states
        if fleet.generations.get(pid, -1) < generation
        and pid != me
        and not (board.path / f"{_WAITING}{pid}").exists()
    ]
    return ("served" if older else "over"), ""


def _applied(board: Board) -> dict[str, Any] | None:
    try:
        note = json.loads((board.path / _APPLIED).read_text())
        return {
            "changes": int(note["changes"]),
            "generation": int(note["generation"]),
            "error": note.get("error"),
        }
    except (OSError, ValueError, KeyError, TypeError):
        return None
