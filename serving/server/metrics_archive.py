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

import errno
import operator
import os
from collections.abc import Callable
from pathlib import Path

from prometheus_client import mmap_dict
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
#: prometheus-client's first size of a ``.db`` file (its ``_INITIAL_MMAP_SIZE``, 64 KiB).
_INITIAL_MMAP_BYTES: int = getattr(mmap_dict, "_INITIAL_MMAP_SIZE", 1 << 16)


def archive_dead_worker(directory: Path, pid: int, tag: str) -> int:
    """Fold dead worker ``pid``'s counter, histogram, summary and ``max`` gauge samples
    into the archive in ``directory`` and remove its files; the number of samples moved.

    :raises OSError: when a file cannot be read or the archive cannot be written, or
        (``ENOSPC``) when the filesystem has not room for the archive to grow: the
        worker's files are then left in place (nothing is lost, only not yet folded).
    """
    moved = 0
    for kind, fold in _FOLD.items():
        dead = directory / f"{kind}_{pid}.db"
        if not dead.exists():
            continue
        if dead.stat().st_size == 0:  # killed between creating and sizing it: no samples
            dead.unlink()
            continue
        path = directory / f"{kind}_archive-{tag}.db"
        _check_room(directory, path, dead)
        samples = MmapedDict.read_all_values_from_file(str(dead))  # type: ignore[no-untyped-call]
        archive = MmapedDict(str(path))  # type: ignore[no-untyped-call]
        try:
            for key, value, timestamp, _ in samples:
                total, _ = archive.read_value(key)  # type: ignore[no-untyped-call]
                archive.write_value(key, fold(total, value), timestamp)  # type: ignore[no-untyped-call]
                moved += 1
        finally:
            archive.close()  # type: ignore[no-untyped-call]
        dead.unlink()
    return moved


def _check_room(directory: Path, archive: Path, dead: Path) -> None:
    """Refuse (``ENOSPC``) to fold ``dead`` into ``archive`` unless the filesystem has
    room for the archive to double (prometheus-client grows its mmap by doubling the
    file, 64 KiB at first) plus the dead file: a write through an mmap past what the
    filesystem can hold is not an error but SIGBUS, which killed the master on a full
    tmpfs (found by the attack on this branch)."""
    size = archive.stat().st_size if archive.exists() else 0
    need = 2 * max(size, _INITIAL_MMAP_BYTES) + dead.stat().st_size
    stats = os.statvfs(directory)
    free = stats.f_bavail * stats.f_frsize
    if free < need:
        raise OSError(
            errno.ENOSPC,
            f"{free} bytes free in {directory}, {need} needed to fold {dead.name} into "
            f"{archive.name} (left as it is)",
        )
