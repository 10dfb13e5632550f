"""Multiprocess metric files whose blocks are reserved on disk before they are used.

prometheus-client keeps each worker's samples in a memory-mapped file
(``prometheus_client.mmap_dict.MmapedDict``) that it creates and grows with
``truncate()``: a sparse file, whose blocks the filesystem only allocates when a page is
first written through the mapping. When ``PROMETHEUS_MULTIPROC_DIR`` is full (a small
tmpfs, a full disk), that write cannot be backed and the kernel sends SIGBUS: the worker
dies at once, with every request it was serving, and its replacement dies the same way.
``ReservedMmapedDict`` reserves the blocks with ``os.posix_fallocate`` first, so a full
directory is an ``OSError`` from the metric write instead (the file and its mapping are
left as they were), which the server logs and survives.

Boundary: standard library and prometheus-client only.
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client.mmap_dict import MmapedDict

__all__ = ["ReservedMmapedDict"]

#: The size prometheus-client gives a new file (``mmap_dict._INITIAL_MMAP_SIZE``).
INITIAL_SIZE_BYTES = 1 << 16


class _ReservingFile:
    """The file object of a ``ReservedMmapedDict``: ``truncate(size)`` reserves the
    blocks up to ``size`` before the file grows (raising ``OSError`` when it cannot)."""

    def __init__(self, file: Any) -> None:
        self._file = file

    def truncate(self, size: int) -> int:
        os.posix_fallocate(self._file.fileno(), 0, size)
        return int(self._file.truncate(size))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


class ReservedMmapedDict(MmapedDict):
    """``MmapedDict`` whose file never has a block the mapping writes to unreserved.

    Usage (``serving.observe.metrics`` installs it for the multiprocess mode)::

        prometheus_client.values.MmapedDict = ReservedMmapedDict
    """

    def __init__(self, filename: str, read_mode: bool = False) -> None:
        if not read_mode:  # the first page is written as soon as the file is mapped
            fd = os.open(filename, os.O_RDWR | os.O_CREAT, 0o666)
            try:
                size = os.fstat(fd).st_size
                try:
                    os.posix_fallocate(fd, 0, size or INITIAL_SIZE_BYTES)
                except OSError as exc:
                    if size == 0:  # new: left empty, it breaks every reader of the folder
                        os.unlink(filename)
                    raise OSError(exc.errno, exc.strerror, filename) from exc
            finally:
                os.close(fd)
        super().__init__(filename, read_mode)  # type: ignore[no-untyped-call]
        if not read_mode:
            self._f = _ReservingFile(self._f)  # type: ignore[assignment]

    def _init_value(self, key: str) -> None:
        capacity = self._capacity
        try:
            super()._init_value(key)  # type: ignore[no-untyped-call]
        except OSError:  # the file did not grow: the old mapping and size still hold
            self._capacity = capacity
            raise
