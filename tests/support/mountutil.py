"""Start and stop real ckptfs mounts for tests, through the real command line.

Every mount made here is unmounted again (fusermount3 -u) and its daemon, which this
module started, is killed by PID if it did not exit by itself.

Every ``ckptfs mount`` command built here (``ckptfs_cmd``, so also ``run_cli``) and every
``Mount`` registers its state dir's ``ckptfs.log`` in ``DAEMON_LOGS``; tests/conftest.py
checks, after every test, the lines each of those logs gained during the test.
Daemons a test builds in its own process (``make_daemon``, ``make_fs``, ``daemon.build``)
log through the ``ckptfs`` loggers instead: ``InProcessLog`` collects those records, as
lines in the daemon log's format, so that the same rules judge them.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptfs.logsetup import FILE_FORMAT

FUSE_AVAILABLE = os.path.exists("/dev/fuse") and any(
    os.access(os.path.join(d, "fusermount3"), os.X_OK) for d in os.environ.get("PATH", "").split(":")
)
SKIP_REASON = "FUSE is not available here (/dev/fuse or fusermount3 missing)"


class DaemonLogs:
    """The daemon logs tests produced, and how much of each the log check has read.

    ``take_new()`` returns, per log, the lines written since the last call; ``snapshot()``
    reads a log before a test deletes its state dir, so those lines are checked too.
    """

    def __init__(self) -> None:
        self._offset: dict[Path, int] = {}
        self._pending: dict[Path, list[str]] = {}

    def register(self, state_dir: Path) -> None:
        log = Path(os.path.abspath(state_dir)) / "ckptfs.log"
        self._offset.setdefault(log, 0)
        self._pending.setdefault(log, [])

    def snapshot(self, state_dir: Path) -> None:
        log = Path(os.path.abspath(state_dir)) / "ckptfs.log"
        if log in self._offset:
            self._read(log)

    def _read(self, log: Path) -> None:
        try:
            with open(log, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < self._offset[log]:  # a new log in a state dir made again
                    self._offset[log] = 0
                f.seek(self._offset[log])
                data = f.read()
        except FileNotFoundError:
            return
        # Only whole lines: a line still being written is read by the next call.
        end = data.rfind(b"\n") + 1
        self._offset[log] += end
        self._pending[log] += data[:end].decode(errors="replace").splitlines()

    def take_new(self) -> dict[Path, list[str]]:
        """Lines new since the last call, by log path (logs with no new line left out).
        Logs whose file is gone and fully read are forgotten."""
        got: dict[Path, list[str]] = {}
        for log in list(self._offset):
            self._read(log)
            if self._pending[log]:
                got[log] = self._pending[log]
                self._pending[log] = []
            if not log.exists():
                del self._offset[log], self._pending[log]
        return got


DAEMON_LOGS = DaemonLogs()

_LOG_ERROR_MARKERS = ("ERROR", "CRITICAL", "Traceback")
# The level field of a log line (``DATE TIME LEVEL LOGGER: message``), not a word in a message.
_LOG_WARNING = re.compile(r"^\S+ \S+ WARNING ")


def disallowed_log_lines(
    lines: Sequence[str], allow_errors: bool, allowed_warnings: tuple[str, ...] | None
) -> list[str]:
    """Daemon log lines a test does not allow: ERROR/CRITICAL/Traceback lines unless
    ``allow_errors``; WARNING lines unless ``allowed_warnings`` is given (empty: any
    warning, else only warnings containing one of these substrings)."""

    def allowed(line: str) -> bool:
        if any(m in line for m in _LOG_ERROR_MARKERS):
            return allow_errors
        if not _LOG_WARNING.match(line):
            return True
        if allowed_warnings is None:
            return False
        return not allowed_warnings or any(s in line for s in allowed_warnings)

    return [line for line in lines if not allowed(line)]


class InProcessLog(logging.Handler):
    """The records of the ``ckptfs`` logger hierarchy in this process while attached, as
    the lines the daemon would have written to ``ckptfs.log`` (a traceback as its lines).

    ``attach()`` also lets INFO records through (the daemon's default level), so that an
    INFO record with a traceback is seen as it would be in the file."""

    LOGGER = "ckptfs"
    LABEL = "in-process ckptfs loggers (make_daemon, make_fs, daemon.build)"

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.setFormatter(logging.Formatter(FILE_FORMAT))
        self.lines: list[str] = []
        self._old_level: int | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:  # a record whose message does not format: show it raw
            text = f"{record.levelname} {record.name}: {record.msg!r} % {record.args!r}"
        self.lines += text.splitlines()

    def attach(self) -> None:
        logger = logging.getLogger(self.LOGGER)
        if logger.getEffectiveLevel() > logging.INFO:
            self._old_level = logger.level
            logger.setLevel(logging.INFO)
        logger.addHandler(self)

    def detach(self) -> None:
        logger = logging.getLogger(self.LOGGER)
        logger.removeHandler(self)
        if self._old_level is not None:
            logger.setLevel(self._old_level)
            self._old_level = None


def _config_sets(args: Sequence[str], key: str) -> bool:
    """Whether the ``--config FILE`` among ``args`` sets ``key``."""
    if "--config" not in args or args.index("--config") + 1 >= len(args):
        return False
    path = Path(args[args.index("--config") + 1])
    try:
        return key in tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return False


def _mount_state_dir(args: Sequence[str]) -> Path | None:
    """The state dir a ``ckptfs mount ARGS`` command uses (None: the user's default)."""
    config: str | None = None
    for i, a in enumerate(args):
        for flag in ("--state-dir", "--config"):
            value = None
            if a == flag and i + 1 < len(args):
                value = args[i + 1]
            elif a.startswith(flag + "="):
                value = a.split("=", 1)[1]
            if value is not None and flag == "--state-dir":
                return Path(value)
            if value is not None:
                config = value
    if config is not None:
        with contextlib.suppress(OSError, tomllib.TOMLDecodeError):
            state = tomllib.loads(Path(config).read_text()).get("state_dir")
            if isinstance(state, str):
                return Path(state)
    return None


def ckptfs_cmd(*args: str) -> list[str]:
    if args and args[0] == "mount":
        state_dir = _mount_state_dir(args[1:])
        if state_dir is not None:
            DAEMON_LOGS.register(state_dir)
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

    def __post_init__(self) -> None:
        # Also a daemon the test starts another way (the mount(8) helper) and wraps in a
        # Mount has its log checked.
        DAEMON_LOGS.register(self.state_dir)

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
        if "--metrics-address" not in extra and not _config_sets(extra, "metrics_address"):
            # Each test daemon serves metrics on a port of its own (never the default 9464,
            # which a demo or a real daemon on this machine may hold: the daemon would warn
            # that it is taken). A test's config file that names an address keeps it.
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
        DAEMON_LOGS.snapshot(self.state_dir)  # tests may delete a stopped node's state dir

    def kill9(self) -> None:
        """Simulate a crash: SIGKILL the daemon this test started. The mount goes stale."""
        assert self.pid is not None
        os.kill(self.pid, signal.SIGKILL)
        _wait_pid_gone(self.pid, 30)
        self._forget_pid()
        DAEMON_LOGS.snapshot(self.state_dir)

    def crashed(self) -> None:
        """The daemon died by itself (a test's crash point): forget it. The mount is
        stale, as after kill9()."""
        assert self.pid is not None and not pid_alive(self.pid)
        self._forget_pid()
        DAEMON_LOGS.snapshot(self.state_dir)

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
        DAEMON_LOGS.snapshot(self.state_dir)


def wait_until(cond: Callable[[], Any], timeout: float = 20, what: str = "condition") -> Any:
    """Poll ``cond`` until it returns something truthy (returned); fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what} not reached in {timeout} s"
        time.sleep(0.05)  # polling a condition, with a deadline


def drop_cached_pages(*paths: Path) -> None:
    """Best effort: make the next read of each file come from the daemon, not the kernel's
    page cache (POSIX_FADV_DONTNEED drops its clean pages). Only these files': a write to
    /proc/sys/vm/drop_caches would also drop the pages of the tests running beside this one
    (pytest-xdist), e.g. the pushed pages tests/mount/test_page_push.py waits for."""
    for path in paths:
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


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
