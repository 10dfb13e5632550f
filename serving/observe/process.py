"""This process's id without a system call: ``os.getpid()`` is one (~0.4 us, more in a
VM), and the request path asks for it to tell a forked worker from its parent (the
multiprocess metrics on every write, tracing on every request). An at-fork hook keeps the
id current; every fork of this process (Gunicorn's, multiprocessing's) runs it.

Boundary: standard library only.
"""

from __future__ import annotations

import os

__all__ = ["pid"]

_pid = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))


def pid() -> int:
    """This process's id, as ``os.getpid()`` returns it."""
    return _pid[0]
