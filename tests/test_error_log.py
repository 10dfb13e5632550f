"""serving/server/error_log.py: Gunicorn's error log on a stderr nobody reads drops lines
instead of blocking the process (the master then ignored SIGTERM: found by the attack)."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from serving.server.error_log import NonBlockingLogger, NonBlockingStreamHandler


def _record(message: str) -> logging.LogRecord:
    return logging.LogRecord("gunicorn.error", logging.INFO, __file__, 1, message, None, None)


def test_a_full_pipe_drops_lines_and_a_drained_one_says_how_many() -> None:
    read, write = os.pipe()
    stream = os.fdopen(write, "w")
    handler = NonBlockingStreamHandler(stream)
    line = "x" * 200
    finished = threading.Event()

    def flood() -> None:
        for _ in range(2000):  # ~400 KB into a 64 KB pipe nobody reads
            handler.emit(_record(line))
        finished.set()

    threading.Thread(target=flood, daemon=True).start()
    assert finished.wait(10), "a write blocked on the full pipe"
    assert handler.dropped > 0

    dropped = handler.dropped
    os.set_blocking(read, False)
    written = b""
    while True:  # drain what got in
        try:
            written += os.read(read, 65536)
        except BlockingIOError:
            break
    handler.emit(_record("after"))
    tail = os.read(read, 65536).decode()
    assert tail == f"log lines dropped: stderr was full ({dropped} lines)\nafter\n"
    assert set(written.decode().splitlines()) == {line}  # whole lines only
    assert len(written) // 201 + dropped == 2000
    stream.close()
    os.close(read)


def test_a_stream_without_a_file_descriptor_is_written_as_by_logging() -> None:
    import io

    stream = io.StringIO()
    handler = NonBlockingStreamHandler(stream)
    handler.emit(_record("kept"))
    assert stream.getvalue() == "kept\n"


def test_gunicorns_logger_class_puts_the_handler_on_stderr_not_on_a_file(tmp_path: Any) -> None:
    from gunicorn.config import Config

    config = Config()
    config.set("errorlog", "-")
    on_stderr = NonBlockingLogger(config)  # both hold logging's one "gunicorn.error" logger
    assert [type(h) for h in on_stderr.error_log.handlers] == [NonBlockingStreamHandler]
    config.set("errorlog", str(tmp_path / "error.log"))
    on_file = NonBlockingLogger(config)
    assert [type(h) for h in on_file.error_log.handlers] == [logging.FileHandler]
    on_file.error_log.handlers[0].close()


def test_gunicorns_warning_per_invalid_request_is_said_once_a_minute_with_the_count(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """Gunicorn warns "Invalid request from ip=..." for every request it refuses (a bad
    request line, oversized headers), quoting what it refused: a client could flood the
    log, while each such answer is already in the access log and /metrics. The first is
    said, then at most one line a minute with how many more; other warnings as before."""
    from gunicorn.config import Config

    from serving.server import error_log

    config = Config()
    config.set("errorlog", str(tmp_path / "error.log"))
    logger = NonBlockingLogger(config)
    clock = [1000.0]
    monkeypatch.setattr(error_log.time, "monotonic", lambda: clock[0])

    for n in range(50):
        logger.warning(f"Invalid request from ip=127.0.0.1: Invalid HTTP method: {'X' * 500}{n}")
    logger.warning("another warning")
    clock[0] += 61
    logger.warning("Invalid request from ip=10.0.0.1: Invalid header")
    for handler in logger.error_log.handlers:
        handler.flush()
    lines = (tmp_path / "error.log").read_text().splitlines()
    logger.error_log.handlers[0].close()

    invalid = [line for line in lines if "nvalid request" in line]
    assert len(invalid) == 2, lines
    assert "ip=127.0.0.1" in invalid[0] and len(invalid[0]) < 400
    assert "49 more" in invalid[1] and "ip=10.0.0.1" in invalid[1]
    assert sum("another warning" in line for line in lines) == 1
