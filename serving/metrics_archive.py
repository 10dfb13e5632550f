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

from pathlib import Path

from prometheus_client.mmap_dict import MmapedDict

__all__ = ["ARCHIVED_TYPES", "archive_dead_worker"]

#: File types whose samples are summed over processes (gauges are not: the live ones are
#: dropped by ``mark_process_dead``).
ARCHIVED_TYPES = ("counter", "histogram", "summary")


def archive_dead_worker(directory: Path, pid: int, tag: str) -> int:
    """Add dead worker ``pid``'s counter, histogram and summary samples to the archive in
    ``directory`` and remove its files; the number of samples moved.

    :raises OSError: when a file cannot be read or the archive cannot be written (the
        worker's file is then left in place: nothing is lost, only not yet folded).
    """
    moved = 0
    for kind in ARCHIVED_TYPES:
        dead = directory / f"{kind}_{pid}.db"
        if not dead.exists():
            continue
        samples = MmapedDict.read_all_values_from_file(str(dead))  # type: ignore[no-untyped-call]
        archive = MmapedDict(str(directory / f"{kind}_archive-{tag}.db"))  # type: ignore[no-untyped-call]
        try:
            for key, value, timestamp, _ in samples:
                total, _ = archive.read_value(key)  # type: ignore[no-untyped-call]
                archive.write_value(key, total + value, timestamp)  # type: ignore[no-untyped-call]
                moved += 1
        finally:
            archive.close()  # type: ignore[no-untyped-call]
        dead.unlink()
    return moved
