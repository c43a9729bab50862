"""SIGSTOP a server and wait until it is stopped.

``kill`` returns once the signal is pending, not once the process has stopped: a thread
running on another CPU stops at its next entry into the kernel, which on a loaded VM (its
vCPU descheduled by the host) can come after the test's next request was served. A test
that means "the server no longer answers" waits until every thread of it is in state T.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.support.mountutil import wait_until


def thread_states(pid: int) -> list[str]:
    """The state letter of each thread of ``pid`` (/proc/PID/task/*/stat); [] if gone."""
    states = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return []
    for task in tasks:
        try:
            stat = (task / "stat").read_text()
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        states.append(stat.rsplit(")", 1)[1].split()[0])
    return states


def freeze(pid: int, timeout: float = 20) -> None:
    """SIGSTOP ``pid`` and return once each of its threads is stopped."""
    os.kill(pid, signal.SIGSTOP)
    wait_until(lambda: (s := thread_states(pid)) and all(x in "tT" for x in s), timeout,
               f"every thread of process {pid} stopped")
