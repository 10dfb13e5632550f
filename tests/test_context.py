"""serving.context: the request id a request gets when its caller sent none."""

from __future__ import annotations

import os
import re

from serving.context import new_request_id


def test_new_request_ids_are_32_hex_digits_and_never_repeat() -> None:
    ids = [new_request_id() for _ in range(10_000)]

    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_new_request_ids_of_a_forked_worker_differ_from_its_parents() -> None:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # a Gunicorn worker, forked from the master after import
        os.close(read_end)
        os.write(write_end, "\n".join(new_request_id() for _ in range(100)).encode())
        os._exit(0)
    os.close(write_end)
    ours = {new_request_id() for _ in range(100)}
    with os.fdopen(read_end, "rb") as pipe:
        theirs = set(pipe.read().decode().split("\n"))
    os.waitpid(pid, 0)

    assert len(theirs) == 100
    assert not ours & theirs
