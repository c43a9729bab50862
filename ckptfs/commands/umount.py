"""`ckptfs umount MOUNTPOINT`: flush, unmount and wait for the daemon to exit."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from .. import statedir
from ..errors import EXIT_USAGE


def cmd_umount(mountpoint: Path, timeout: float) -> int:
    """`ckptfs umount`: unmount, then wait until the daemon released its state dir and exited."""
    mp = mountpoint.absolute()
    found = statedir.find_mount(mp)
    if found is None:
        print(f"ckptfs: {mp} is not mounted", file=sys.stderr)
        return EXIT_USAGE
    source, fstype = found
    if fstype != statedir.FSTYPE:
        print(f"ckptfs: {mp} is a {fstype} mount, not ckptfs", file=sys.stderr)
        return EXIT_USAGE
    state_dir = statedir.state_dir_of(source)
    pid = statedir.read_pid(state_dir) if state_dir else None
    flags = ["-u", "-z"] if statedir.is_stale(mp) else ["-u"]  # a dead daemon cannot answer a plain -u
    res = subprocess.run(["fusermount3", *flags, str(mp)], capture_output=True, text=True)
    if res.returncode != 0:
        print(f"ckptfs: unmount of {mp} failed: {res.stderr.strip()}", file=sys.stderr)
        return 1
    if state_dir is None or not (state_dir / statedir.LOCK_FILE).exists():
        return 0
    deadline = time.monotonic() + timeout
    # The daemon releases its state lock last, then its process exits: wait for both, so
    # that a caller may start a new daemon on this state dir (or stop the machine) at once.
    if statedir.wait_unlocked(state_dir, timeout) and (
        pid is None or _wait_exit(pid, max(0.0, deadline - time.monotonic()))
    ):
        return 0
    print(f"ckptfs: daemon (pid {pid}) still running after {timeout:.0f}s", file=sys.stderr)
    return 1


def _wait_exit(pid: int, timeout: float) -> bool:
    """Wait until process ``pid`` is gone (a zombie counts as gone)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)  # the daemon is not our child: poll its /proc entry
