"""How a command judges that no daemon serves a mount (commands/live.py): from the pid
file without blocking (gone, a zombie), and from the kernel where the pid file cannot say
(its number taken by a later process, or the wall clock stepped since it was written).
The real mounts: tests/remote/test_dead_daemon.py."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from ckptfs.commands.live import daemon_gone, process_alive, require_daemon
from ckptfs.errors import NoDaemon
from ckptfs.statedir import PID_FILE


def test_a_running_process_is_alive_and_one_started_after_the_pid_file_is_not() -> None:
    assert process_alive(os.getpid())
    assert process_alive(os.getpid(), since=time.time())
    assert not process_alive(os.getpid(), since=0.0)  # the file predates this process


def test_a_zombie_is_not_alive() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        # Not reaped yet: a zombie, as a killed daemon whose parent does not reap it.
        deadline = time.monotonic() + 10
        while process_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.01)  # polling for the child's exit, with a deadline
        assert not process_alive(pid)
    finally:
        os.waitpid(pid, 0)
    assert not process_alive(pid)  # reaped: gone


def test_the_kernel_decides_when_the_pid_file_cannot(tmp_path: Path) -> None:
    state, mnt = tmp_path / "state", tmp_path / "mnt"
    state.mkdir()
    mnt.mkdir()
    (state / PID_FILE).write_text(f"{os.getpid()}\n")
    assert not daemon_gone(mnt, state)
    # The file is older than the process it names: a reused number, or a clock step. A
    # directory that answers statvfs is no dead FUSE mount: served.
    os.utime(state / PID_FILE, (0, 0))
    assert not daemon_gone(mnt, state)
    require_daemon(mnt, state)
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    (state / PID_FILE).write_text(f"{pid}\n")  # its daemon is gone
    assert daemon_gone(mnt, state)
    with pytest.raises(NoDaemon, match="no daemon serves"):
        require_daemon(mnt, state)
    # A state dir mounted nowhere passes, unless the command needs its daemon.
    require_daemon(None, state)
    with pytest.raises(NoDaemon, match="not mounted"):
        require_daemon(None, state, unmounted_ok=False)
