"""Master: count each model version a reload stops serving, as
``serving_model_unloads_total{model,version}`` (Triton's unload, here the old workers'
exit once the new ones serve: ``serving.server.rollover``).

The master counts, in its own file of the multiprocess metrics directory: it alone knows
what each reload leaves out (the workers of a generation know only what they serve).
prometheus-client is imported at the first reload, long after the master set
``PROMETHEUS_MULTIPROC_DIR`` (``serving.server.hooks``), never at module level.

Usage::

    unloads = Unloads(settings)          # when_ready: what the first workers serve
    unloads.reloaded(new_settings)       # on_reload: counts what is no longer there
"""

from __future__ import annotations

from typing import Any

from serving.settings import Settings

__all__ = ["Unloads", "versions"]

Key = tuple[str, str]


def versions(settings: Settings) -> set[Key] | None:
    """Every ``(model, version)`` ``settings`` serve, or None when the one model's folder
    no longer says (``Settings.single_spec``)."""
    try:
        specs = settings.entries() or [settings.single_spec()]
    except ValueError:
        return None
    return {(spec.name, spec.version) for spec in specs}


class Unloads:
    """The versions the master's workers serve, and the counter of those a reload drops."""

    def __init__(self, settings: Settings) -> None:
        self.served = versions(settings) or set()
        self._counter: Any = None

    def reloaded(self, settings: Settings) -> set[Key]:
        """Count (and return) the versions served before that ``settings`` leave out."""
        now = versions(settings)
        if now is None:
            return set()
        gone, self.served = self.served - now, now
        for model, version in sorted(gone):
            self.counter().labels(model, version).inc()
        return gone

    def counter(self) -> Any:
        if self._counter is None:
            from prometheus_client import Counter

            self._counter = Counter(
                "serving_model_unloads",
                "Model versions a reload (a changed repository, an unload call, SIGHUP) "
                "stopped serving: their workers exit once the new ones serve.",
                ["model", "version"],
                registry=None,
            )
        return self._counter
