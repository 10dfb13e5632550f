"""Multiprocess metric files: their blocks reserved on disk before they are used, and
the value class that writes them.

prometheus-client keeps each worker's samples in a memory-mapped file
(``prometheus_client.mmap_dict.MmapedDict``) that it creates and grows with
``truncate()``: a sparse file, whose blocks the filesystem only allocates when a page is
first written through the mapping. When ``PROMETHEUS_MULTIPROC_DIR`` is full (a small
tmpfs, a full disk), that write cannot be backed and the kernel sends SIGBUS: the worker
dies at once, with every request it was serving, and its replacement dies the same way.
``ReservedMmapedDict`` reserves the blocks with ``os.posix_fallocate`` first, so a full
directory is an ``OSError`` from the metric write instead (the file and its mapping are
left as they were), which the server logs and survives. A directory removed while the
server runs (a cleaner of ``/tmp``, where the default one is) is made again, by
``made_again``: a worker started after it writes its files there, and ``/metrics`` reads
them.

``MultiProcessValue`` is prometheus-client's value class of the multiprocess mode
(``prometheus_client.values.MultiProcessValue``: the same files, keys and fork rule)
with the cost of a write cut to what it must do. The library's ``inc`` calls the process
id function, looks the key's position up and packs through a helper on every write, and
a request makes about fifteen writes; this one keeps the position and the mapping's
owner, and learns of a fork from an at-fork hook instead of asking for the process id. The
collector reads its files as the library's (``tests/test_metrics.py``).

Boundary: standard library, prometheus-client, ``serving.observe.process`` and
``serving.observe.complaint`` only.
"""

from __future__ import annotations

import glob
import logging
import os
import struct
import threading
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector

from serving.observe import process
from serving.observe.complaint import Complaint

log = logging.getLogger(__name__)

__all__ = [
    "MultiProcessValue",
    "ReservedMmapedDict",
    "WholeFilesCollector",
    "inc_each",
    "inc_pair",
]

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
            try:
                fd = os.open(filename, os.O_RDWR | os.O_CREAT, 0o666)
            except FileNotFoundError:
                if not made_again(os.path.dirname(filename)):
                    raise
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


_pack = struct.Struct("dd").pack
#: One lock for every value and file of the process, as prometheus-client has it: a new
#: key may grow (and remap) the file another value writes through.
_lock = threading.Lock()
#: The process the files below belong to, and its files by name prefix (``counter``,
#: ``gauge_livesum``, ...) and values: a fork starts the child's own files at 0.
_owner = [process.pid()]
_files: dict[str, ReservedMmapedDict] = {}
_values: list[MultiProcessValue] = []
#: Set in a forked child until its first write reopens the files (an at-fork hook: a
#: write then checks a flag, not the process id).
_forked = [False]
os.register_at_fork(after_in_child=lambda: _forked.__setitem__(0, True))


def made_again(directory: str) -> bool:
    """Make the metrics ``directory`` (mode 0700, as a new temporary one) when it no longer
    exists, logging a warning; whether it did. The files of the processes that wrote there
    are gone with it: their counts are missing from ``/metrics`` until they are replaced
    (``SIGHUP`` replaces every worker)."""
    if os.path.isdir(directory):
        return False
    try:
        os.makedirs(directory, mode=0o700)
    except FileExistsError:  # another process made it first
        return False
    log.warning(
        "metrics directory %s was removed while the server ran: made again; the counts "
        "of the workers started before are missing from /metrics until they are replaced "
        "(SIGHUP replaces every worker)",
        directory,
    )
    return True


def _check_for_fork() -> None:
    """After a fork (the process id changed), reopen every value in this process's own
    files. Called under ``_lock``."""
    _forked[0] = False
    pid = process.pid()
    if _owner[0] == pid:
        return
    _owner[0] = pid
    for metric_file in _files.values():
        metric_file.close()  # type: ignore[no-untyped-call]
    _files.clear()
    for value in _values:
        value._open()


def inc_pair(first: MultiProcessValue, x: float, second: MultiProcessValue, y: float) -> None:
    """``first.inc(x)`` and ``second.inc(y)`` under one lock: a histogram's sum and bucket,
    a summary's count and sum. (The write is spelled out here, in ``inc_each`` and in the
    class, not called: a call per value would cost what the one lock saves.)"""
    with _lock:
        if _forked[0]:
            _check_for_fork()
        first._value += x
        pos = first._pos
        first._file._m[pos : pos + 16] = _pack(first._value, 0.0)
        second._value += y
        pos = second._pos
        second._file._m[pos : pos + 16] = _pack(second._value, 0.0)


def inc_each(values: Sequence[MultiProcessValue], amounts: Sequence[float]) -> None:
    """``value.inc(amount)`` for each pair, under one lock: a predict call's five stage
    counters."""
    with _lock:
        if _forked[0]:
            _check_for_fork()
        for value, amount in zip(values, amounts, strict=True):
            value._value += amount
            pos = value._pos
            value._file._m[pos : pos + 16] = _pack(value._value, 0.0)


class _Unexported:
    """Where a value whose file cannot be made or grown writes: 16 bytes of its own, in
    memory (the value and timestamp, as a file's slot)."""

    __slots__ = ("_m",)

    def __init__(self) -> None:
        self._m = bytearray(16)


#: Said when a value's series cannot be kept in the directory (at most once a minute).
_UNEXPORTED = Complaint(
    log, "metric series (kept in memory, not exported)", "no metric (its directory is full)"
)


class MultiProcessValue:
    """A float kept in this process's file of ``PROMETHEUS_MULTIPROC_DIR`` (the
    directory is read at the value's first write to a file), as prometheus-client's
    ``MmapedValue``: same constructor, ``inc``, ``set``, ``get``; exemplars are not kept
    in multiprocess mode, there or here.

    Usage (``serving.observe.metrics`` installs it when the directory is set)::

        prometheus_client.values.ValueClass = MultiProcessValue
    """

    _multiprocess = True
    __slots__ = ("_file", "_key", "_params", "_pos", "_timestamp", "_value")

    def __init__(  # noqa: PLR0917  (prometheus-client calls it with these positionally)
        self,
        typ: str,
        metric_name: str,
        name: str,
        labelnames: Any,
        labelvalues: Any,
        help_text: str,
        multiprocess_mode: str = "",
        **kwargs: Any,
    ) -> None:
        self._params = typ, metric_name, name, labelnames, labelvalues, help_text, multiprocess_mode
        with _lock:
            _check_for_fork()
            self._open()
            _values.append(self)

    def _open(self) -> None:
        """Find (or add) this value's key in this process's file. Called under ``_lock``.
        When the file cannot be made or grown (the directory full), the value counts in
        memory instead (``_Unexported``): its series is missing from ``/metrics``, said
        once a minute, and the worker serves on (its load failed on it, at every start)."""
        typ, metric_name, name, labelnames, labelvalues, help_text, mode = self._params
        prefix = f"{typ}_{mode}" if typ == "gauge" else typ
        self._key = mmap_key(metric_name, name, labelnames, labelvalues, help_text)
        try:
            metric_file = _files.get(prefix)
            if metric_file is None:
                directory = os.environ["PROMETHEUS_MULTIPROC_DIR"]
                path = os.path.join(directory, f"{prefix}_{_owner[0]}.db")
                metric_file = _files[prefix] = ReservedMmapedDict(path)
            self._value, self._timestamp = metric_file.read_value(self._key)  # type: ignore[no-untyped-call]
            self._pos: int = metric_file._positions[self._key]
            self._file: Any = metric_file
        except OSError as exc:
            _UNEXPORTED.drop(str(exc))
            self._file, self._pos, self._value, self._timestamp = _Unexported(), 0, 0.0, 0.0

    def inc(self, amount: float) -> None:
        with _lock:
            if _forked[0]:
                _check_for_fork()
            self._value += amount
            pos = self._pos
            self._file._m[pos : pos + 16] = _pack(self._value, 0.0)

    def set(self, value: float, timestamp: float | None = None) -> None:
        with _lock:
            if _forked[0]:
                _check_for_fork()
            self._value = value
            self._timestamp = timestamp or 0.0
            pos = self._pos
            self._file._m[pos : pos + 16] = _pack(value, self._timestamp)

    def set_exemplar(self, exemplar: Any) -> None:
        return

    def get(self) -> float:
        with _lock:
            if _forked[0]:
                _check_for_fork()
            return float(self._value)

    def get_exemplar(self) -> None:
        return None


class WholeFilesCollector(MultiProcessCollector):
    """prometheus-client's multiprocess collector over the ``*.db`` files a scrape can
    read: a worker creating its file (or failing to, on a full disk) leaves it shorter
    than its 8-byte header for a moment, and reading it raised ``struct.error``:
    ``/metrics`` answered 500 (2 scrapes in 85 on a full directory, found by the attack).
    Such a file holds no sample yet."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.directory = os.environ["PROMETHEUS_MULTIPROC_DIR"]
        super().__init__(registry, path=self.directory)  # type: ignore[no-untyped-call]

    def collect(self) -> Any:
        files = [path for path in glob.glob(os.path.join(self.directory, "*.db")) if _sized(path)]
        return self.merge(files, accumulate=True)  # type: ignore[no-untyped-call]


def _sized(path: str) -> bool:
    """Whether ``path`` is past its header (8 bytes: the used size and padding); False
    for one gone (archived) since it was listed."""
    try:
        return os.path.getsize(path) >= 8
    except OSError:
        return False
