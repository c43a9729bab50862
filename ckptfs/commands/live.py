"""A live mount seen from a command: which mount holds a path, its state dir, its catalog
(opened read-only, beside the daemon) and what its daemon publishes (stats.json, the
upload rate)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from ..catalog import Catalog, SqliteCatalog
from ..catalog.engines import open_state_dir_catalog, shared_binding
from ..catalog.protocols import MetaCatalog
from ..config import CATALOG_FILE, default_state_dir
from ..errors import CkptfsError, InvalidArgument, NoDaemon
from ..statedir import (
    FSTYPE,
    PID_FILE,
    find_mount,
    is_stale,
    mountpoint_of,
    read_pid,
    state_dir_of,
)
from ..stats import read_stats


def mount_of(path: Path) -> tuple[Path, Path] | None:
    """The ckptfs mount holding ``path`` and its state dir, if any."""
    p = path.absolute()
    for candidate in (p, *p.parents):
        found = find_mount(candidate)
        if found is not None:
            source, fstype = found
            state_dir = state_dir_of(source)
            if fstype == FSTYPE and source.startswith("ckptfs:") and state_dir is not None:
                return candidate, state_dir
            return None
    return None


def inside_mount(path: Path) -> tuple[Path, Path, str]:
    """(mount point, state dir, path inside the mount) of ``path``; InvalidArgument if it
    is not inside a ckptfs mount."""
    found = mount_of(path)
    if found is None:
        raise InvalidArgument(f"{path} is not inside a ckptfs mount")
    mnt, state_dir = found
    require_daemon(mnt, state_dir)
    rel = os.path.relpath(path.absolute(), mnt)
    return mnt, state_dir, "/" if rel == "." else "/" + rel


def resolve_state_dir(path: Path | None, state_dir: str | None) -> Path:
    """``--state-dir``, else the state dir of the mount holding ``path``, else the default."""
    if state_dir:
        return Path(state_dir).absolute()
    if path is not None:
        found = mount_of(path)
        if found is None:
            raise InvalidArgument(f"{path} is not inside a ckptfs mount")
        return found[1]
    return default_state_dir()


def state_dir_readable(state_dir: Path) -> bool:
    return os.access(state_dir, os.R_OK | os.X_OK)


def open_catalog(state_dir: Path) -> Catalog:
    """The state dir's catalog, read-only (the daemon may be writing it)."""
    db = state_dir / CATALOG_FILE
    if state_dir.is_dir() and not state_dir_readable(state_dir):
        raise CkptfsError(
            f"cannot read the state dir {state_dir}: it is private to the user the daemon "
            "runs as (mode 0700); run this as that user or root"
        )
    if shared_binding(state_dir) is not None:
        return open_state_dir_catalog(state_dir, readonly=True)  # the shared database
    if not db.exists():
        raise CkptfsError(f"no catalog at {db}")
    return SqliteCatalog(db, readonly=True)


def daemon_stats(state_dir: Path) -> dict[str, Any] | None:
    """The running daemon's statistics (None if no daemon runs for this state dir: a
    daemon killed with -9 leaves its pid file and stats.json behind)."""
    stats = read_stats(state_dir)
    found = daemon_pid(state_dir)
    if stats is None or found is None or found[0] != stats.get("pid") or daemon_gone(None, state_dir):
        return None
    return stats


def process_alive(pid: int, since: float | None = None) -> bool:
    """Whether ``pid`` runs: not gone, not a zombie (a killed daemon whose parent does not
    reap it) and, with ``since`` (when its pid file was written), started before then: a
    later one got the number of a dead daemon. Reads /proc only: never blocks."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return False
    if fields[0] in ("Z", "X"):
        return False
    if since is None:
        return True
    try:
        boot = next(int(ln.split()[1]) for ln in Path("/proc/stat").read_text().splitlines()
                    if ln.startswith("btime "))
    except (OSError, StopIteration, ValueError):
        return True
    started = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    return started <= since + 2  # (btime is in whole seconds)


def daemon_pid(state_dir: Path) -> tuple[int, float] | None:
    """The pid in the state dir's pid file and when the file was written (None if it
    cannot be read: absent, or a state dir private to the daemon's user)."""
    pid = read_pid(state_dir) if state_dir_readable(state_dir) else None
    if pid is None:
        return None
    try:
        return pid, (state_dir / PID_FILE).stat().st_mtime
    except OSError:
        return None


def daemon_gone(mountpoint: Path | None, state_dir: Path) -> bool:
    """True when no daemon serves the state dir's mount (``mountpoint``; None: looked up):
    the pid file names a process that is gone (a kill -9 leaves the pid file). Where the
    pid file cannot be read (a state dir private to the daemon's user), or names a process
    that seems to have started after it was written (its number reused, or the wall clock
    stepped forward since), the kernel says: a dead FUSE mount answers ENOTCONN."""
    found = daemon_pid(state_dir)
    if found is not None and not process_alive(found[0]):
        return True
    if found is not None and process_alive(*found):
        return False
    where = mountpoint if mountpoint is not None else mountpoint_of(state_dir)
    if where is None:
        return found is not None  # a later process has its number, and nothing is mounted
    return is_stale(Path(where))


def require_daemon(mountpoint: Path | None, state_dir: Path, *, unmounted_ok: bool = True
                   ) -> None:
    """NoDaemon (exit 1) at once when the mount of ``state_dir`` has lost its daemon,
    instead of a command that waits for a daemon that will never answer, or reads a
    catalog nobody keeps up to date any more. ``mountpoint``: None to look it up. A state
    dir mounted nowhere passes if ``unmounted_ok`` (the command can do without a daemon)."""
    where = mountpoint if mountpoint is not None else mountpoint_of(state_dir)
    if where is None:
        found = daemon_pid(state_dir)
        if unmounted_ok or (found is not None and process_alive(found[0])):  # still mounting
            return
        raise NoDaemon(f"no daemon serves {state_dir}: it is not mounted")
    if daemon_gone(Path(where), state_dir):
        raise NoDaemon(
            f"no daemon serves {where} (it was killed or crashed; its mount point is left "
            f"dead): mount it again (`ckptfs mount`), which recovers from {state_dir}")


def remote_tier_names(catalog: MetaCatalog) -> list[str]:
    return [t["name"] for t in catalog.recorded_tiers() if t.get("kind", "local") != "local"]


def upload_rate(catalog: MetaCatalog) -> tuple[float, float] | None:
    """(bytes/s, age in s) of the last upload rate the daemon published."""
    raw = catalog.get_meta("upload_rate")
    if raw is None:
        return None
    rate, at_ns = raw.split()
    return float(rate), (time.time_ns() - int(at_ns)) / 1e9
