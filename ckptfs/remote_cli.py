"""`ckptfs sync` and `ckptfs status`: read a live catalog beside its daemon (read-only)."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

from .catalog import Catalog
from .catalog.catalog import Backlog
from .config import default_state_dir
from .errors import CkptfsError, InvalidArgument
from .progress import progress
from .statedir import FSTYPE, find_mount, read_pid
from .stats import read_stats

SYNC_POLL_S = 0.1


def mount_of(path: Path) -> tuple[Path, Path] | None:
    """The ckptfs mount holding ``path`` and its state dir, if any."""
    p = path.absolute()
    for candidate in (p, *p.parents):
        found = find_mount(candidate)
        if found is not None:
            source, fstype = found
            if fstype == FSTYPE and source.startswith("ckptfs:"):
                return candidate, Path(source.split(":", 1)[1])
            return None
    return None


def resolve_state_dir(path: Path | None, state_dir: str | None) -> Path:
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
    db = state_dir / "catalog.sqlite"
    if state_dir.is_dir() and not state_dir_readable(state_dir):
        raise CkptfsError(
            f"cannot read the state dir {state_dir}: it is private to the user the daemon "
            "runs as (mode 0700); run this as that user or root"
        )
    if not db.exists():
        raise CkptfsError(f"no catalog at {db}")
    return Catalog(db, readonly=True)


def files_under(path: Path) -> list[int]:
    """Inode numbers (ckptfs reports its own) of the files at or under ``path``."""
    st = os.lstat(path)
    if not os.path.isdir(path):
        return [st.st_ino]
    inos = []
    for root, _dirs, files in os.walk(path):
        for name in files:
            inos.append(os.lstat(os.path.join(root, name)).st_ino)
    return inos


def remote_tier_names(catalog: Catalog) -> list[str]:
    return [t["name"] for t in catalog.recorded_tiers() if t.get("kind", "local") != "local"]


def upload_rate(catalog: Catalog) -> tuple[float, float] | None:
    """(bytes/s, age in s) of the last upload rate the daemon published."""
    raw = catalog.get_meta("upload_rate")
    if raw is None:
        return None
    rate, at_ns = raw.split()
    return float(rate), (time.time_ns() - int(at_ns)) / 1e9


def describe(b: Backlog, rate: tuple[float, float] | None = None) -> str:
    if not b.chunks:
        return "backlog: empty (everything committed is durable on the remote)"
    age = (time.time_ns() - (b.oldest_enqueued_ns or time.time_ns())) / 1e9
    text = (f"backlog: {b.chunks} chunk(s), {b.bytes / 2**20:.1f} MiB, oldest pending "
            f"{age:.0f} s")
    if rate is not None and rate[0] > 0 and rate[1] < 60:
        text += f", uploading at {rate[0] / 1e6:.1f} MB/s, ETA {b.bytes / rate[0]:.0f} s"
    if b.blocked:
        text += f", {b.blocked} blocked by a permanent error"
    if b.last_error:
        text += f"; last error: {b.last_error}"
    return text


def cmd_sync(path: Path | None, state_dir: str | None, timeout: float | None) -> int:
    sd = resolve_state_dir(path, state_dir)
    catalog = open_catalog(sd)
    bars = contextlib.ExitStack()
    try:
        if not remote_tier_names(catalog):
            print("ckptfs sync: no remote tier is configured: nothing is durable remotely",
                  file=sys.stderr)
            return 1
        inos = files_under(path) if path is not None else None
        deadline = None if timeout is None else time.monotonic() + timeout
        uploaded_ns: int | None = None  # when every chunk under PATH was seen uploaded
        update = bars.enter_context(progress("chunks uploaded", None))  # on a terminal only
        most = 0
        while True:
            pending = (catalog.pending_uploads_for(inos) if inos is not None
                       else catalog.backlog().chunks)
            most = max(most, pending)
            update(most - pending, most)
            if pending:
                uploaded_ns = None
            elif uploaded_ns is None:
                uploaded_ns = time.time_ns()
            # Durable means recoverable: the chunks, and a catalog snapshot taken after they
            # were uploaded (the daemon retakes it within seconds even under steady writes).
            snap = catalog.snapshot_of_ns()
            if uploaded_ns is not None and (
                catalog.snapshot_is_current() or (snap is not None and snap >= uploaded_ns)
            ):
                print(f"ckptfs sync: {path or sd} is durable on the remote tier(s)")
                return 0
            if deadline is not None and time.monotonic() >= deadline:
                print(f"ckptfs sync: {pending} chunk(s) (and the catalog snapshot) still pending "
                      f"after {timeout:.0f} s; "
                      + describe(catalog.backlog()), file=sys.stderr)
                return 1
            time.sleep(SYNC_POLL_S)  # the daemon commits in its own process: poll the catalog
    finally:
        bars.close()
        catalog.close()


def live_stats(state_dir: Path) -> dict[str, Any] | None:
    """The running daemon's statistics (None if no daemon runs for this state dir)."""
    stats = read_stats(state_dir)
    if stats is None or read_pid(state_dir) != stats.get("pid"):
        return None
    return stats


def describe_tier(t: dict[str, str], live: dict[str, Any] | None) -> str:
    where = t.get("path") or t.get("url") or ""
    text = f"tier {t['name']}: {t.get('kind', 'local')} {where}"
    if live is None:
        return text
    s = live.get(t["name"])
    if s is None:
        return text
    text += f" - {s['state']}"
    if s.get("degraded_reason"):
        text += f" ({s['degraded_reason']})"
    speed = f"{s['read_mb_s']} MB/s" if s.get("read_mb_s") else "?"
    text += f"; reads {s['reads']} ({s['read_bytes'] / 2**20:.0f} MiB), {speed}, latency {s['latency_ms']} ms"
    if s.get("errors"):
        text += f", {s['errors']} error(s)"
    return text
