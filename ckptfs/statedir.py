"""The state dir on disk: its modes, its lock, the daemon's pid file, the mount serving it.

The state dir is private: it names every file, owner, size and chunk digest of the mount.
The directory is 0700 and every file in it 0600, whatever the umask of whoever started
ckptfs: created with explicit modes, and an existing state dir made so at mount.

One daemon (or one fsck) holds ``STATE_DIR/lock`` (flock) while it uses the catalog; the
daemon writes its pid to ``STATE_DIR/daemon.pid``. Its FUSE mount names the state dir in
its source (``ckptfs:STATE_DIR``), so /proc/mounts alone tells which mount serves which
state dir: the daemon (mount.py) and the commands (ckptfs/commands/) both read it here.

With a shared catalog the state dir names it (``catalog.json``: catalog and node) and the
node's session ids (``session.json``, written by session.py under the lock): the lock is
what proves a recorded session's daemon dead to the next daemon of the state dir.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from .errors import UsageError

DIR_MODE = 0o700
FILE_MODE = 0o600

FSTYPE = "fuse.ckptfs"
LOCK_FILE = "lock"
PID_FILE = "daemon.pid"
# A state dir whose node uses a shared catalog names it here ({"catalog": URI, "node": NAME}),
# so a remount with only --state-dir and every command open the same database as this node.
BINDING_FILE = "catalog.json"
# The node's session ids in that catalog ({"sid": ID, "attempt": ID}): the last session a
# daemon of this state dir registered, and a registration not known to have committed. A
# daemon that holds the lock knows the earlier daemon of its state dir is dead, so a live
# session with either id is its own (catalog/sessions.py, session.py).
SESSION_FILE = "session.json"


def ensure_state_dir(path: Path) -> None:
    """Create the state dir (and missing parents, with the usual modes) as 0700."""
    if path.is_dir():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):  # a racing mount made it: fixed at mount
        os.mkdir(path, DIR_MODE)
        os.chmod(path, DIR_MODE)  # mkdir's mode passes through the umask


def open_private(path: Path, flags: int = os.O_WRONLY | os.O_APPEND) -> int:
    """Open (creating it 0600 if missing) a file of the state dir; returns the fd."""
    fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != FILE_MODE:
            with contextlib.suppress(PermissionError):  # not ours: make_private's job
                os.fchmod(fd, FILE_MODE)
    except OSError:
        os.close(fd)
        raise
    return fd


def touch_private(path: Path) -> None:
    os.close(open_private(path))


def write_private(path: Path, text: str, durable: bool = False) -> None:
    """Replace ``path`` atomically with ``text``, as a 0600 file. ``durable``: on the
    device (the file and its directory entry fsynced) when this returns."""
    tmp = path.with_name(path.name + ".tmp")
    fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, text.encode())
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    if durable:
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def read_binding(state_dir: Path) -> tuple[str, str] | None:
    """(catalog URI, node name) of a state dir bound to a shared catalog, else None."""
    try:
        raw = (state_dir / BINDING_FILE).read_text()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw)
        return str(data["catalog"]), str(data["node"])
    except (ValueError, KeyError, TypeError):
        raise UsageError(f"{state_dir / BINDING_FILE}: damaged (expected catalog and node)") from None


def write_binding(state_dir: Path, catalog: str, node: str) -> None:
    write_private(state_dir / BINDING_FILE, json.dumps({"catalog": catalog, "node": node}) + "\n")


def read_session_ids(state_dir: Path) -> tuple[str, str]:
    """(sid, attempt) of the state dir's session file ("" for none): the last session a
    daemon of this state dir registered, and a registration not known to have committed.
    A missing, unreadable or damaged file names none (a restart then waits for the
    session's expiry; the registration replaces the file)."""
    try:
        data = json.loads((state_dir / SESSION_FILE).read_text())
    except (OSError, ValueError):
        return "", ""
    if not isinstance(data, dict):
        return "", ""
    sid, attempt = data.get("sid", ""), data.get("attempt", "")
    return (sid if isinstance(sid, str) else "", attempt if isinstance(attempt, str) else "")


def write_session_ids(state_dir: Path, sid: str, attempt: str = "") -> None:
    """Record (durably: it must be on disk before the registration's transaction) the
    session ids of ``read_session_ids``. The caller holds the state lock."""
    write_private(state_dir / SESSION_FILE, json.dumps({"sid": sid, "attempt": attempt}) + "\n",
                  durable=True)


def make_private(state_dir: Path) -> list[str]:
    """Make the state dir 0700, its files 0600 and its directories 0700 (the top level:
    inside a 0700 dir nothing deeper can be reached by others). Returns what changed, e.g.
    ``["catalog.sqlite 0644->0600"]``."""
    fixed = []

    def fix(p: Path, mode: int, label: str) -> None:
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode) or stat.S_IMODE(st.st_mode) == mode:
            return
        os.chmod(p, mode)
        fixed.append(f"{label} {stat.S_IMODE(st.st_mode):04o}->{mode:04o}")

    fix(state_dir, DIR_MODE, ".")
    for entry in sorted(os.scandir(state_dir), key=lambda e: e.name):
        if entry.is_dir(follow_symlinks=False):
            fix(Path(entry.path), DIR_MODE, entry.name + "/")
        elif entry.is_file(follow_symlinks=False):
            fix(Path(entry.path), FILE_MODE, entry.name)
    return fixed


# -- the lock and the pid file ----------------------------------------------------------------


def busy(state_dir: Path, holder: int | None) -> UsageError:
    return UsageError(
        f"state dir {state_dir} is in use by another ckptfs process"
        + (f" (pid {holder})" if holder else "")
    )


@contextlib.contextmanager
def state_lock(state_dir: Path) -> Iterator[None]:
    """Exclusive lock on the state dir: one daemon (or one fsck) per catalog. A state dir
    in use is refused with UsageError (exit 2)."""
    ensure_state_dir(state_dir)
    fd = open_private(state_dir / LOCK_FILE, os.O_RDWR)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise busy(state_dir, read_pid(state_dir)) from None
        yield
    finally:
        os.close(fd)


def check_free(state_dir: Path) -> None:
    """Refuse (UsageError) a state dir whose lock another process holds."""
    try:
        fd = os.open(state_dir / LOCK_FILE, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UsageError(f"state dir {state_dir}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise busy(state_dir, read_pid(state_dir)) from None
    finally:
        os.close(fd)


def wait_unlocked(state_dir: Path, timeout: float) -> bool:
    """Wait until no process holds the state dir's lock (the daemon has exited; a zombie
    counts as exited). Returns False on timeout."""
    deadline = time.monotonic() + timeout
    fd = open_private(state_dir / LOCK_FILE, os.O_RDWR)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
                return True
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.05)  # flock has no timeout; poll the condition itself
    finally:
        os.close(fd)


def read_pid(state_dir: Path) -> int | None:
    try:
        return int((state_dir / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def write_pid(state_dir: Path) -> Path:
    """Record this process as the state dir's daemon; returns the pid file."""
    path = state_dir / PID_FILE
    write_private(path, f"{os.getpid()}\n")
    return path


# -- the mount serving it (/proc/mounts) ------------------------------------------------------


def fsname(state_dir: Path) -> str:
    # The state dir is part of the mount source, so `ckptfs umount` finds the daemon
    # from /proc/mounts alone.
    return f"ckptfs:{state_dir}"


def state_dir_of(source: str) -> Path | None:
    """The state dir a ckptfs mount source (``ckptfs:STATE_DIR``) names."""
    return Path(source.split(":", 1)[1]) if ":" in source else None


def unescape_mounts(field: str) -> str:
    """A field of /proc/mounts or mountinfo (spaces and the like are octal escapes)."""
    return field.encode().decode("unicode_escape") if "\\" in field else field


def real_mountpoint(mountpoint: Path) -> str:
    """The mount point as /proc/mounts spells it."""
    # Resolve the parent only: resolving the mountpoint itself would stat it, and a stat
    # of our own mount from the daemon waits for the loop that should answer it.
    mountpoint = mountpoint.absolute()
    return os.path.join(os.path.realpath(mountpoint.parent), mountpoint.name)


def find_mount(mountpoint: Path) -> tuple[str, str] | None:
    """Return (source, fstype) of the topmost mount at ``mountpoint``, if any."""
    real = real_mountpoint(mountpoint)
    found = None
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and unescape_mounts(parts[1]) == real:
                found = (unescape_mounts(parts[0]), parts[2])
    return found


def mountpoint_of(state_dir: Path) -> str | None:
    """Where the daemon of ``state_dir`` is mounted (from /proc/mounts)."""
    want = fsname(state_dir)
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[2] == FSTYPE and unescape_mounts(parts[0]) == want:
                    return unescape_mounts(parts[1])
    except OSError:
        return None
    return None


_DEAD_MOUNT_ERRNOS = {errno.ENOTCONN, errno.ECONNABORTED}


def is_stale(mountpoint: Path) -> bool:
    """True if a FUSE mount at ``mountpoint`` has lost its daemon. statvfs always goes to
    the daemon (stat may be answered from the kernel's cache)."""
    try:
        os.statvfs(mountpoint)
    except OSError as exc:
        return exc.errno in _DEAD_MOUNT_ERRNOS
    return False
