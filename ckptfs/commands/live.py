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
from ..config import CATALOG_FILE, default_state_dir
from ..errors import CkptfsError, InvalidArgument
from ..statedir import FSTYPE, find_mount, read_pid, state_dir_of
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
    """The running daemon's statistics (None if no daemon runs for this state dir)."""
    stats = read_stats(state_dir)
    if stats is None or read_pid(state_dir) != stats.get("pid"):
        return None
    return stats


def remote_tier_names(catalog: Catalog) -> list[str]:
    return [t["name"] for t in catalog.recorded_tiers() if t.get("kind", "local") != "local"]


def upload_rate(catalog: Catalog) -> tuple[float, float] | None:
    """(bytes/s, age in s) of the last upload rate the daemon published."""
    raw = catalog.get_meta("upload_rate")
    if raw is None:
        return None
    rate, at_ns = raw.split()
    return float(rate), (time.time_ns() - int(at_ns)) / 1e9
