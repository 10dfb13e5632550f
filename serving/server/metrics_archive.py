"""Fold a dead worker's prometheus-client files into one archive file per type.

In multiprocess mode every worker writes ``counter_<pid>.db`` and ``histogram_<pid>.db``
in ``PROMETHEUS_MULTIPROC_DIR``, and every scrape reads every file: with workers recycled
for ``SERVING_MAX_REQUESTS`` the directory grows without bound and so does the time of a
scrape (prometheus/client_python#367). ``archive_dead_worker`` (the master's
``child_exit``) adds each of the dead worker's samples to the same key in
``<type>_archive-<tag>.db`` and removes the worker's file, so counters and histograms keep
their totals and the number of files stays at one per live worker plus one per type.
Samples are raw multiprocess values (histogram buckets are stored per bucket, not
cumulative), so adding them is what ``MultiProcessCollector`` itself does at each scrape.

``tag`` is the master's pid: after a ``SIGUSR2`` upgrade, the old and the new master each
keep their own archive in the shared directory and never write the same file.

Imports only the standard library and prometheus-client.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from pathlib import Path

from prometheus_client.mmap_dict import MmapedDict

__all__ = ["ARCHIVED_TYPES", "archive_dead_worker"]

#: File types folded into the archive, and how: summed over processes, or the largest
#: (a ``max`` gauge such as the last inference time). ``live*`` gauges are not archived:
#: ``mark_process_dead`` drops them.
_FOLD: dict[str, Callable[[float, float], float]] = {
    "counter": operator.add,
    "histogram": operator.add,
    "summary": operator.add,
    "gauge_max": max,
}
ARCHIVED_TYPES = tuple(_FOLD)


def archive_dead_worker(directory: Path, pid: int, tag: str) -> int:
    """Fold dead worker ``pid``'s counter, histogram, summary and ``max`` gauge samples
    into the archive in ``directory`` and remove its files; the number of samples moved.

    :raises OSError: when a file cannot be read or the archive cannot be written (the
        worker's file is then left in place: nothing is lost, only not yet folded).
    """
    moved = 0
    for kind, fold in _FOLD.items():
        dead = directory / f"{kind}_{pid}.db"
        if not dead.exists():
            continue
        samples = MmapedDict.read_all_values_from_file(str(dead))  # type: ignore[no-untyped-call]
        archive = MmapedDict(str(directory / f"{kind}_archive-{tag}.db"))  # type: ignore[no-untyped-call]
        try:
            for key, value, timestamp, _ in samples:
                total, _ = archive.read_value(key)  # type: ignore[no-untyped-call]
                archive.write_value(key, fold(total, value), timestamp)  # type: ignore[no-untyped-call]
                moved += 1
        finally:
            archive.close()  # type: ignore[no-untyped-call]
        dead.unlink()
    return moved
