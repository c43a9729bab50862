"""The state dir is private: it names every file, owner, size and chunk digest of the mount.

The directory is 0700 and every file in it 0600, whatever the umask of whoever started
ckptfs: created with explicit modes, and an existing state dir made so at mount.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


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


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` atomically with ``text``, as a 0600 file."""
    tmp = path.with_name(path.name + ".tmp")
    fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


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
