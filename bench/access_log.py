"""What the JSON access log costs the request thread: written in place vs queued.

    python bench/access_log.py [--lines 20000]

Times ``serving.access`` ``info`` calls with the access record's fields, as
``serving.app`` makes them, through (a) the handler the service used before: python-json-logger
formatting and a write to a file on the calling thread, and (b) ``hooks.configure_access_log``:
the record put on a queue, formatted and written by a ``QueueListener`` thread. Prints the
microseconds per line on the calling thread, and the total CPU time per line (both
threads) measured until the listener has written everything. Both write to a temporary
file, not a terminal.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pythonjsonlogger.orjson import OrjsonFormatter

from serving import hooks
from serving.settings import Settings

FIELDS = {
    "request_id": "0123456789abcdef0123456789abcdef",
    "method": "POST",
    "route": "/predict",
    "status": 200,
    "latency_ms": 1.234,
    "model": "breast_cancer",
    "model_version": "1",
    "instances": 1,
    "batch_size": 7,
}


def in_place(stream: object) -> None:
    """The handler before the listener: format and write on the calling thread."""
    handler = logging.StreamHandler(stream)  # type: ignore[arg-type]
    handler.setFormatter(
        OrjsonFormatter(
            "{asctime}{levelname}{message}",
            style="{",
            rename_fields={"asctime": "time", "levelname": "level"},
        )
    )
    access = logging.getLogger("serving.access")
    access.handlers = [handler]
    access.setLevel(logging.INFO)
    access.propagate = False


def run(label: str, lines: int, queued: bool) -> None:
    access = logging.getLogger("serving.access")
    with tempfile.TemporaryFile("w") as out:
        sys.stdout = out
        try:
            if queued:
                hooks.configure_access_log(Settings(access_log=True))
            else:
                in_place(out)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            for _ in range(lines):
                access.info("request", extra=FIELDS)
            caller = time.perf_counter() - wall0
            hooks.stop_access_log()  # waits until every queued line is written
            cpu = time.process_time() - cpu0
        finally:
            sys.stdout = sys.__stdout__
    print(
        f"{label:>28}: {caller / lines * 1e6:6.1f} us per line on the request thread, "
        f"{cpu / lines * 1e6:6.1f} us CPU per line in all"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=20000)
    args = parser.parse_args()
    for _ in range(2):  # alternate, so drift in the machine's load hits both
        run("in place (before)", args.lines, queued=False)
        run("queued, QueueListener", args.lines, queued=True)


if __name__ == "__main__":
    main()
