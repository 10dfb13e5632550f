"""serving.observe.metrics in prometheus-client's multiprocess mode, in a fresh interpreter."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD_WRITES = """
import os, sys
from prometheus_client import CollectorRegistry
from serving.observe.metrics import ServingMetrics

metrics = ServingMetrics(CollectorRegistry())
metrics.observe_request("POST", "/predict", 200, 0.01)      # the parent's file
pid = os.fork()
if pid == 0:                                                # a worker forked after import
    for _ in range(3):
        metrics.observe_request("POST", "/predict", 200, 0.01)
    os._exit(0)
os.waitpid(pid, 0)
print(pid)
"""


def test_metrics_written_after_a_fork_go_to_the_childs_own_file(tmp_path: Path) -> None:
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(Path.cwd())}
    out = subprocess.run(
        [sys.executable, "-c", CHILD_WRITES], env=env, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    child = int(out.stdout.strip())

    files = {p.name for p in tmp_path.glob("counter_*.db")}
    assert f"counter_{child}.db" in files and len(files) == 2, files
    from prometheus_client.mmap_dict import MmapedDict

    def requests_in(path: Path) -> float:
        db = MmapedDict(str(path), read_mode=True)
        try:
            return sum(v for k, v, _ in db.read_all_values() if '"http_requests_total"' in k)
        finally:
            db.close()

    assert requests_in(tmp_path / f"counter_{child}.db") == 3
    (parent,) = files - {f"counter_{child}.db"}
    assert requests_in(tmp_path / parent) == 1


def test_each_request_stage_is_recorded_under_its_own_label() -> None:
    from prometheus_client import CollectorRegistry

    from serving.observe.metrics import ServingMetrics

    metrics = ServingMetrics(CollectorRegistry())
    metrics.observe_stages(
        "m", "1", True, compute_input=1.0, queue=2.0, compute_infer=3.0, compute_output=4.0
    )
    metrics.observe_stages(
        "m", "1", False, compute_input=0.5, queue=0.0, compute_infer=0.0, compute_output=0.0
    )

    def total(stage: str) -> float | None:
        labels = {"model": "m", "version": "1", "stage": stage}
        return metrics.registry.get_sample_value("inference_request_stage_seconds_total", labels)

    def requests(outcome: str) -> float | None:
        labels = {"model": "m", "version": "1", "outcome": outcome}
        return metrics.registry.get_sample_value("inference_requests_total", labels)

    # As Triton counts them: the stages of the successful request; the failed one whole.
    assert [requests(s) for s in ("success", "fail")] == [1.0, 1.0]
    assert [total(s) for s in ("compute_input", "queue", "compute_infer", "compute_output")] == [
        1.0, 2.0, 3.0, 4.0,
    ]  # fmt: skip
    assert (total("success"), total("fail")) == (None, 0.5)


def test_a_predict_call_counts_the_stages_of_every_request_it_answered_at_once() -> None:
    from prometheus_client import CollectorRegistry

    from serving.batching.batcher import FlushStats
    from serving.context import Timing
    from serving.observe.metrics import ServingMetrics

    metrics = ServingMetrics(CollectorRegistry())
    observe = metrics.flush_observer("m", "1")
    # Arrived at 10 and 11, checked by 12 and 13.5; the call ran from 13 to 15 (the second
    # request joined while it ran: no queue wait counts before its check ended).
    first, second = Timing(10.0, conformed=12.0), Timing(11.0, conformed=13.5)
    tags = (first, "not a data plane request", second)
    observe(FlushStats(4, 3, 2.0, 0, None, called_at=13.0, tags=tags))

    def total(stage: str) -> float:
        labels = {"model": "m", "version": "1", "stage": stage}
        value = metrics.registry.get_sample_value("inference_request_stage_seconds_total", labels)
        assert value is not None, stage
        return value

    labels = {"model": "m", "version": "1", "outcome": "success"}
    assert metrics.registry.get_sample_value("inference_requests_total", labels) == 2.0
    assert total("compute_input") == (12.0 - 10.0) + (13.5 - 11.0)
    assert total("queue") == (13.0 - 12.0) + 0.0
    assert total("compute_infer") == 2 * 2.0
    assert total("compute_output") >= 0.0
    assert first.counted and second.counted
    observe(FlushStats(1, 1, 0.5, 0, RuntimeError("failed"), called_at=20.0, tags=(first,)))
    assert metrics.registry.get_sample_value("inference_requests_total", labels) == 2.0


def test_queue_depth_is_written_only_when_it_changes() -> None:
    from prometheus_client import CollectorRegistry

    from serving.observe.metrics import ServingMetrics

    metrics = ServingMetrics(CollectorRegistry())
    writes: list[float] = []
    value = metrics.queue_depth.labels("m", "1")._value  # what the gauge's writes reach
    real = value.set
    value.set = lambda depth, timestamp=None: (writes.append(depth), real(depth))
    observe = metrics.queue_observer("m", "1")

    for depth in (3, 3, 0, 0, 5):
        observe(depth)

    assert writes == [3, 0, 5]
    labels = {"model": "m", "version": "1"}
    assert metrics.registry.get_sample_value("inference_queue_depth", labels) == 5


def test_multiprocess_metric_files_have_their_blocks_reserved(tmp_path: Path) -> None:
    """Found by the attack: the metric files of the multiprocess mode were sparse (grown
    with truncate()), so with PROMETHEUS_MULTIPROC_DIR full (a small tmpfs) the first write
    to a new page through the mapping raised SIGBUS and killed the worker; the blocks are
    now reserved first, and a full directory is an OSError the server survives."""
    from prometheus_client import values

    import serving.observe.metrics  # noqa: F401  (installs the file class)

    path = tmp_path / "counter_1.db"
    metric_file = values.MmapedDict(str(path))
    for index in range(2000):  # ~300 KB of keys: the file grows several times
        metric_file.write_value(f"requests_total-{index:06d}-" + "x" * 100, 1.0, 0.0)
    metric_file.close()

    size, blocks = path.stat().st_size, path.stat().st_blocks
    assert size > 1 << 16
    assert blocks * 512 >= size  # every block allocated: no page left to fault on
    assert len(list(values.MmapedDict.read_all_values_from_file(str(path)))) == 2000


SAME_WRITES = """
import sys, threading
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary, values
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.openmetrics.exposition import generate_latest
if sys.argv[1] == "serving":
    from serving.observe.metric_files import MultiProcessValue
    values.ValueClass = MultiProcessValue
else:
    values.ValueClass = values.MultiProcessValue()
from serving.observe import writes

registry = CollectorRegistry()
counter = Counter("c", "c", ["k"], registry=registry).labels("a")
gauge = Gauge("g", "g", ["k"], multiprocess_mode="max", registry=registry).labels("a")
summary = Summary("s", "s", ["k"], registry=registry).labels("a")
histogram = Histogram("h", "h", ["k"], buckets=(1, 2, 4), registry=registry).labels("a")
inc, put = writes.counter_inc(counter), writes.gauge_set(gauge)
observe, bucket = writes.summary_observe(summary), writes.histogram_observe(histogram)
stages = Counter("d", "d", ["k"], registry=registry)
each = writes.counters_inc([stages.labels("a"), stages.labels("b")])

def hammer():
    for _ in range(2000):
        inc(1)
threads = [threading.Thread(target=hammer) for _ in range(4)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
for amount in (0.0, 0.5, 1.0, 1.5, 2.0, 3.9, 4.0, 4.1, 1e9, -1.0):
    inc(1); put(amount); observe(amount); bucket(amount); each([1, abs(amount)])
print(generate_latest(MultiProcessCollector(CollectorRegistry())).decode())
"""


def test_metric_writes_in_multiprocess_mode_read_back_as_the_librarys(tmp_path: Path) -> None:
    """The request path's writes (serving.observe.writes) through the service's value class
    (serving.observe.metric_files) expose exactly what prometheus-client's own value class
    exposes for the same writes: the same files, keys, buckets (a bound is in its own
    bucket, above the last in +Inf), no increment lost between four threads."""
    exposed = {}
    for kind in ("serving", "library"):
        directory = tmp_path / kind
        directory.mkdir()
        env = {"PROMETHEUS_MULTIPROC_DIR": str(directory), "PYTHONPATH": str(Path.cwd())}
        out = subprocess.run(
            [sys.executable, "-c", SAME_WRITES, kind], env=env, capture_output=True,
            text=True, timeout=60, check=True,
        )  # fmt: skip
        exposed[kind] = sorted(out.stdout.splitlines())  # metric order follows file names
        assert sorted(p.name.split("_")[0] for p in directory.iterdir()) == [
            "counter", "gauge", "histogram", "summary",
        ]  # fmt: skip
    assert exposed["serving"] == exposed["library"]
    assert 'c_total{k="a"} 8010.0' in exposed["serving"]
    assert 'h_bucket{k="a",le="1.0"} 4.0' in exposed["serving"]  # -1, 0, 0.5, 1.0
    assert 'h_bucket{k="a",le="+Inf"} 10.0' in exposed["serving"]
    assert 'd_total{k="a"} 10.0' in exposed["serving"]


def test_metric_writes_in_one_process_equal_the_librarys_methods() -> None:
    """Without PROMETHEUS_MULTIPROC_DIR (tests, one process), each write of
    serving.observe.writes leaves a registry as the library's own method does."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Summary

    from serving.observe import writes

    def registry_after(fast: bool) -> dict[tuple[str, str], float]:
        registry = CollectorRegistry()
        c = Counter("c", "c", ["k"], registry=registry).labels("a")
        g = Gauge("g", "g", ["k"], registry=registry).labels("a")
        s = Summary("s", "s", ["k"], registry=registry).labels("a")
        h = Histogram("h", "h", ["k"], buckets=(1, 2, 4), registry=registry).labels("a")
        d = Counter("d", "d", ["k"], registry=registry)
        if fast:
            calls = [writes.counter_inc(c), writes.gauge_set(g)]
            calls += [writes.summary_observe(s), writes.histogram_observe(h)]
            each = writes.counters_inc([d.labels("a"), d.labels("b")])
            calls.append(lambda amount: each([amount, 2 * amount]))
        else:
            calls = [c.inc, g.set, s.observe, h.observe]
            calls.append(lambda amount: (d.labels("a").inc(amount), d.labels("b").inc(2 * amount)))
        for amount in (0.0, 1.0, 1.5, 4.0, 4.5, 7.0):
            for call in calls:
                call(amount)
        return {
            (sample.name, str(sample.labels)): sample.value
            for metric in registry.collect()
            for sample in metric.samples
            if not sample.name.endswith("_created")
        }

    library = registry_after(fast=False)
    assert registry_after(fast=True) == library
    assert library[("h_bucket", "{'k': 'a', 'le': '4.0'}")] == 4.0
    assert library[("c_total", "{'k': 'a'}")] == 18.0


def test_a_metric_file_that_cannot_be_reserved_is_not_left_behind_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the attack: on a full PROMETHEUS_MULTIPROC_DIR a worker's new metric file
    was created, then its blocks could not be reserved (ENOSPC), and the empty file stayed:
    every /metrics scrape failed on it (struct.error), and so did the master's fold of the
    dead worker's files, which killed the master (exit 1 on the next SIGTERM)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    from serving.observe.metric_files import ReservedMmapedDict

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    path = tmp_path / "counter_1.db"
    with pytest.raises(OSError, match="No space left"):
        ReservedMmapedDict(str(path))

    assert not path.exists()
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(tmp_path))  # type: ignore[no-untyped-call]
    generate_latest(registry)  # raised struct.error on the empty file


def test_a_metric_file_that_cannot_be_reserved_is_named_in_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the attack: a worker forked onto a full PROMETHEUS_MULTIPROC_DIR logged
    only ``worker N: [Errno 28] No space left on device; retrying in 1 s`` (or ``stopping
    the server`` at the first boot), which named neither the directory nor the file."""
    from serving.observe.metric_files import ReservedMmapedDict

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    path = tmp_path / "counter_1.db"
    with pytest.raises(OSError) as refused:
        ReservedMmapedDict(str(path))

    assert refused.value.errno == errno.ENOSPC
    assert str(path) in str(refused.value)


def test_a_scrape_skips_a_metric_file_not_yet_sized(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the attack: a worker creating its file (or failing to, the directory full)
    leaves it empty for a moment; a scrape then raised struct.error and /metrics answered
    500. The other workers' samples are still read."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.mmap_dict import MmapedDict

    from serving.observe.metrics import ServingMetrics

    written = MmapedDict(str(tmp_path / "counter_1.db"))  # type: ignore[no-untyped-call]
    key = '["http_requests_total", "http_requests_total", {"route": "/predict"}, ""]'
    written.write_value(key, 7.0, 0.0)  # type: ignore[no-untyped-call]
    written.close()  # type: ignore[no-untyped-call]
    (tmp_path / "counter_2.db").write_bytes(b"")
    (tmp_path / "histogram_3.db").write_bytes(b"\x00\x00")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))

    text = ServingMetrics(CollectorRegistry()).render().decode()

    assert 'http_requests_total{route="/predict"} 7.0' in text


FULL_DIRECTORY = """
import errno, logging, os
logging.basicConfig(level=logging.WARNING, format="%(message)s")
from prometheus_client import CollectorRegistry, Counter, values
from serving.observe.metric_files import MultiProcessValue
values.ValueClass = MultiProcessValue

def full(fd, offset, length):
    raise OSError(errno.ENOSPC, "No space left on device")

os.posix_fallocate = full  # the directory is full: no file can be made or grown
counter = Counter("requests", "r", ["k"], registry=CollectorRegistry())
for key in ("a", "b"):
    child = counter.labels(key)
    for _ in range(3):
        child.inc()
print(counter.labels("a")._value.get(), counter.labels("b")._value.get())
"""


def test_a_metric_whose_file_cannot_be_made_counts_in_memory_and_says_so_once(
    tmp_path: Path,
) -> None:
    """Found by the attack: with PROMETHEUS_MULTIPROC_DIR full, every new or respawned
    worker failed its load on creating its metric file ([Errno 28] histogram_N.db;
    retrying), so a full metrics disk blocked every rollout and respawn, and the first
    start exited. Metrics are a side channel: the series go unexported, said once."""
    env = {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path), "PYTHONPATH": str(Path.cwd())}
    result = subprocess.run(
        [sys.executable, "-c", FULL_DIRECTORY], env=env, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3.0", "3.0"]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "not exported" in lines[0] and "No space left on device" in lines[0]
    assert str(tmp_path) in lines[0]
