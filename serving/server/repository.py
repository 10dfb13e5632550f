"""What the master does with a model repository (``SERVING_MODEL_REPOSITORY``): say once
what it cannot serve, and follow it (``SERVING_MODEL_CONTROL=poll``)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

from serving.repository.poll import Poller
from serving.settings import Settings

__all__ = ["follow", "say_refused"]


def say_refused(warn: Callable[..., None], settings: Settings) -> None:
    """One line per repository entry the settings read and could not serve, and why (at
    start and at each reload)."""
    for refusal in settings.refused_models():
        where = f"{refusal.model}/{refusal.version}" if refusal.version else refusal.model
        warn("model repository: %s not served: %s", where, refusal.reason)


def follow(log: Any, settings: Settings) -> Poller | None:
    """Master, once, before the first fork: under ``poll``, a thread that looks at the
    repository and, when it has changed and stood still, sends the master ``SIGHUP``: the
    reload every change goes through (settings read again, the repository with them, the
    workers rolled over one by one). A thread that holds no lock a forked worker needs
    (it lists and stats files, and logs)."""
    if not settings.polls_repository() or settings.model_repository is None:
        return None
    master = os.getpid()

    def reload() -> None:
        log.info("model repository: changed; reloading")
        os.kill(master, signal.SIGHUP)

    poller = Poller(settings.model_repository, settings.repository_poll_s, reload, log.warning)
    poller.start()
    log.info(
        "model repository: looking at %s every %g s", settings.model_repository,
        settings.repository_poll_s,
    )  # fmt: skip
    return poller
