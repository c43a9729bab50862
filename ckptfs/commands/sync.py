"""`ckptfs sync [PATH]`: wait until everything under PATH (or the whole state dir) is
durable on the remote tiers (catalog/durability.py: its uploads done, then a catalog
snapshot covering them), watching the live catalog read-only beside the daemon."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

from ..catalog.catalog import Backlog
from ..catalog.durability import snapshot_covers
from .live import mount_of, open_catalog, remote_tier_names, require_daemon, resolve_state_dir
from .progress import progress

SYNC_POLL_S = 0.1
# How often the wait looks whether the daemon still runs (a process table read).
DAEMON_CHECK_S = 1.0


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


def backlog_line(b: Backlog, rate: tuple[float, float] | None = None) -> str:
    """The upload backlog in one line (with an ETA when ``rate``, (bytes/s, age), is fresh)."""
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
    found = None if path is None else mount_of(path)
    mnt = None if found is None else found[0]
    # Only the daemon uploads and takes the snapshot: without one, say so now rather than
    # wait out the timeout (a kill -9 leaves the mount point dead and the backlog as it was).
    require_daemon(mnt, sd, unmounted_ok=False)
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
        checked = time.monotonic()
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
            if uploaded_ns is not None and snapshot_covers(catalog, uploaded_ns):
                print(f"ckptfs sync: {path or sd} is durable on the remote tier(s)")
                return 0
            if time.monotonic() - checked >= DAEMON_CHECK_S:
                checked = time.monotonic()
                require_daemon(mnt, sd, unmounted_ok=False)  # it died while we waited
            if deadline is not None and time.monotonic() >= deadline:
                print(f"ckptfs sync: {pending} chunk(s) (and the catalog snapshot) still pending "
                      f"after {timeout:.0f} s; "
                      + backlog_line(catalog.backlog()), file=sys.stderr)
                return 1
            time.sleep(SYNC_POLL_S)  # the daemon commits in its own process: poll the catalog
    finally:
        bars.close()
        catalog.close()
