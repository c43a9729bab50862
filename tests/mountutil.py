"""Start and stop real ckptfs mounts for tests, through the real command line.

Every mount made here is unmounted again (fusermount3 -u) and its daemon, which this
module started, is killed by PID if it did not exit by itself.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FUSE_AVAILABLE = os.path.exists("/dev/fuse") and any(
    os.access(os.path.join(d, "fusermount3"), os.X_OK) for d in os.environ.get("PATH", "").split(":")
)
SKIP_REASON = "FUSE is not available here (/dev/fuse or fusermount3 missing)"


def ckptfs_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "ckptfs", *args]


def run_cli(*args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ckptfs_cmd(*args), capture_output=True, text=True, timeout=timeout, check=check
    )


def is_mounted(path: Path) -> bool:
    real = os.path.realpath(path)
    with open("/proc/mounts") as f:
        return any(line.split()[1] == real for line in f)


@dataclass
class Mount:
    mountpoint: Path
    state_dir: Path
    locals: list[Path]
    extra_args: Sequence[str] = ()
    pid: int | None = None
    _started: list[int] = field(default_factory=list)

    @property
    def log(self) -> str:
        p = self.state_dir / "ckptfs.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def args(self) -> list[str]:
        # Every test tier is a directory on this machine's one disk: say that sharing a
        # device is meant (ckptfs refuses it otherwise).
        a = ["--state-dir", str(self.state_dir), "--allow-shared-device"]
        for d in self.locals:
            a += ["--local", str(d)]
        extra = list(self.extra_args)
        if "--metrics-address" not in extra and "--config" not in extra:
            # Each test daemon serves metrics on a port of its own (never the default 9464,
            # which a demo or a real daemon on this machine may hold). A test's config file
            # says what it wants itself.
            extra += ["--metrics-address", "127.0.0.1:0"]
        return a + extra

    def start(self) -> None:
        try:
            self.mountpoint.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a dead mount left by kill9(): the mount command cleans it up
            if exc.errno not in (errno.ENOTCONN, errno.ECONNABORTED):
                raise
        res = run_cli("mount", str(self.mountpoint), *self.args(), timeout=60)
        if res.returncode != 0:
            raise RuntimeError(f"ckptfs mount failed ({res.returncode}): {res.stderr}\n{self.log}")
        self.pid = int((self.state_dir / "daemon.pid").read_text().strip())
        self._started.append(self.pid)

    def stop(self) -> None:
        """Unmount cleanly; fails the test if the daemon does not exit by itself."""
        res = run_cli("umount", str(self.mountpoint), timeout=120)
        if res.returncode != 0:
            raise RuntimeError(f"ckptfs umount failed ({res.returncode}): {res.stderr}")
        self._forget_pid()

    def kill9(self) -> None:
        """Simulate a crash: SIGKILL the daemon this test started. The mount goes stale."""
        assert self.pid is not None
        os.kill(self.pid, signal.SIGKILL)
        _wait_pid_gone(self.pid, 30)
        self._forget_pid()

    def _forget_pid(self) -> None:
        if self.pid in self._started:
            self._started.remove(self.pid)
        self.pid = None

    def cleanup(self) -> None:
        """Best effort, for teardown after failures: unmount, then kill our daemons by PID."""
        if is_mounted(self.mountpoint):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True)
        for pid in self._started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
                if not _wait_pid_gone(pid, 10):
                    os.kill(pid, signal.SIGKILL)
                    _wait_pid_gone(pid, 10)
        self._started.clear()


def wait_until(cond: Callable[[], Any], timeout: float = 20, what: str = "condition") -> Any:
    """Poll ``cond`` until it returns something truthy (returned); fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what} not reached in {timeout} s"
        time.sleep(0.05)  # polling a condition, with a deadline


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs. A zombie counts as gone (PID 1 here does not reap orphans)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait_pid_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        # Reap it if it is our child; otherwise it is gone once kill(0) fails.
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def mounted(
    base: Path, n_local: int = 2, extra_args: Sequence[str] = (), name: str = "mnt"
) -> Iterator[Mount]:
    """A live ckptfs mount under ``base`` with ``n_local`` local tiers; always cleaned up."""
    locals_ = [base / f"tier{i}" for i in range(n_local)]
    for d in locals_:
        d.mkdir(parents=True, exist_ok=True)
    m = Mount(base / name, base / "state", locals_, extra_args)
    try:
        m.start()
        yield m
        if m.pid is not None:
            m.stop()
    finally:
        m.cleanup()
