"""`ckptfs ls | show | latest | tag | verify | gc`: checkpoints of a live mount.

They are named by paths inside the mount (like `ckptfs sync PATH`). ls, show and latest
read the catalog read-only beside the daemon; tag goes through the mount (an extended
attribute the daemon records); verify reads every file of a checkpoint through the mount,
so the daemon serves it from the tier a restore would use and checks every digest.

Each shows only the namespaces the user running it may reach (commands/namespaces.py): a
user who cannot read the state dir gets the daemon's answer through the mount.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from ..catalog import CheckpointRow, CheckpointState
from ..checkpoints.reach import Reach
from ..checkpoints.retention import RetentionPolicy, plan_all, to_ckpts, under
from ..checkpoints.summary import CheckpointSummary, RunsCatalog, files_of, summarize
from ..errors import CkptfsError
from . import live
from .live import open_catalog, state_dir_readable
from .namespaces import Viewer, denied, listed
from .progress import progress

READ_BLOCK = 8 << 20


def _table(infos: list[CheckpointSummary]) -> str:
    head = ("CHECKPOINT", "FRAMEWORK", "STEP", "STATE", "FILES", "SIZE", "DURABLE ON", "TAGS",
            "WHY")
    rows = [head] + [
        (i.root, i.framework, "" if i.step is None else str(i.step), i.state, str(i.files),
         f"{i.logical_bytes / 2**20:.1f} MiB", ",".join(i.durable_on) or "-", ",".join(i.tags),
         # Why a checkpoint is not (or no longer) committed: partial, expired, deleted.
         "" if i.state in ("committed", "writing") else (i.reason or ""))
        for i in infos
    ]
    widths = [max(len(r[k]) for r in rows) for k in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


def _summary(info: dict[str, Any]) -> CheckpointSummary:
    """A summary from the daemon's listing (vfs/listing.py; it adds keys of its own)."""
    return CheckpointSummary(**{f.name: info[f.name] for f in fields(CheckpointSummary)})


def _summaries(mnt: Path, state_dir: Path, inner: str, shown: Path,
               keep: Callable[[str], bool] = lambda root: True) -> list[dict[str, Any]]:
    """The checkpoints under ``inner`` this user may see (summaries, with ``id`` and
    ``commit_ns``): from the catalog, or from the daemon through the mount when the state
    dir is private to the daemon's user."""
    if not state_dir_readable(state_dir):
        return [i for i in listed(mnt, inner) if keep(i["root"])]
    catalog = open_catalog(state_dir)
    try:
        viewer = Viewer.of(catalog)
        viewer.require(inner, shown)
        reach = Reach.of(catalog)
        out = []
        for r in catalog.checkpoint_rows(inner):
            if viewer.may_see(r.root) and keep(r.root):
                info = asdict(summarize(catalog, mnt, r, reach))
                info.update(id=r.id, begin_ns=r.begin_ns, commit_ns=r.commit_ns)
                out.append(info)
        return out
    finally:
        catalog.close()


def cmd_ls(path: Path, as_json: bool) -> int:
    mnt, state_dir, inner = live.inside_mount(path)
    infos = [_summary(i) for i in _summaries(mnt, state_dir, inner, path)]
    if as_json:
        print(json.dumps([asdict(i) for i in infos], indent=1))
    elif infos:
        print(_table(infos))
    else:
        print(f"no checkpoints under {path}")
    return 0


def cmd_show(path: Path, as_json: bool) -> int:
    mnt, state_dir, inner = live.inside_mount(path)
    rows = _summaries(mnt, state_dir, inner, path, keep=lambda root: root == inner)
    if not rows:
        print(f"ckptfs show: {path} is not a known checkpoint", file=sys.stderr)
        return 1
    info = _summary(rows[0])
    if as_json:
        print(json.dumps(asdict(info), indent=1))
    else:
        for k, v in asdict(info).items():
            print(f"{k:>18}: {v}")
    return 0


def latest(catalog: RunsCatalog, inner: str,
           visible: Callable[[str], bool] = lambda root: True) -> CheckpointRow | None:
    """The newest committed checkpoint under ``inner`` whose every chunk has a valid copy
    some live node can read, with no file open for writing on any node (checkpoints/
    reach.py: the same answer on every node): highest step, then latest commit; never a
    partial or writing one."""
    candidates = sorted(
        (r for r in catalog.checkpoint_rows(inner)
         if r.state is CheckpointState.COMMITTED and r.root != inner and visible(r.root)),
        key=lambda r: (-1 if r.step is None else r.step, r.commit_ns or 0),
        reverse=True,
    )
    if not candidates:
        return None
    reach = Reach.of(catalog)
    for row in candidates:
        if reach.writers_under(row.root):
            continue  # a node writes it again (or still): not complete now
        files = files_of(catalog, row.root)
        if files and all(reach.readable(ref.tiers)
                         for ino, _, _ in files for ref in catalog.extents(ino).values()):
            return row
    return None


def latest_of(infos: list[dict[str, Any]], inner: str) -> str | None:
    """``latest`` over the daemon's listing (summaries): the same rule, from the facts
    the summaries carry (every chunk readable, no writer, some file)."""
    ok = [i for i in infos if i["state"] == CheckpointState.COMMITTED.value and i["root"] != inner
          and i["files"] and not i["missing_chunks"] and not i["open_writers"]]
    if not ok:
        return None
    best = max(ok, key=lambda i: (-1 if i["step"] is None else i["step"], i["commit_ns"] or 0))
    return str(best["root"])


def cmd_latest(path: Path) -> int:
    mnt, state_dir, inner = live.inside_mount(path)
    root: str | None
    if not state_dir_readable(state_dir):
        root = latest_of(listed(mnt, inner), inner)
    else:
        catalog = open_catalog(state_dir)
        try:
            viewer = Viewer.of(catalog)
            viewer.require(inner, path)
            row = latest(catalog, inner, viewer.may_see)
            root = None if row is None else row.root
        finally:
            catalog.close()
    if root is None:
        print(f"ckptfs latest: no committed checkpoint under {path}", file=sys.stderr)
        return 1
    print(str(mnt) + root)
    return 0


def cmd_tag(path: Path, tag: str) -> int:
    live.inside_mount(path)
    try:
        os.setxattr(path, "user.ckptfs.tag", tag.encode())
    except OSError as exc:
        if exc.errno == errno.EACCES:
            raise denied(path, None, os.getuid()) from None
        print(f"ckptfs tag: {path}: {exc.strerror} (is it a checkpoint? see `ckptfs ls`)",
              file=sys.stderr)
        return 1
    print(f"tagged {path}: {tag}")
    return 0


def cmd_verify(path: Path) -> int:
    """Read every file of the checkpoint through the mount (page cache dropped first), so
    the daemon verifies each chunk from the tier a restore would use; report throughput."""
    mnt, state_dir, inner = live.inside_mount(path)
    if not state_dir_readable(state_dir):
        # The daemon lists what this user may see; the files are found through the mount.
        states = [i["state"] for i in listed(mnt, inner) if i["root"] == inner]
        sizes = _sizes_through_mount(mnt, path) if states else {}
    else:
        catalog = open_catalog(state_dir)
        try:
            Viewer.of(catalog).require(inner, path)
            states = [r.state.value for r in catalog.checkpoint_rows(inner) if r.root == inner]
            sizes = {catalog.path_of(ino): size for ino, size, _ in files_of(catalog, inner)}
        finally:
            catalog.close()
    if not states:
        print(f"ckptfs verify: {path} is not a known checkpoint", file=sys.stderr)
        return 1
    problems = []
    total = 0
    started = time.perf_counter()
    with progress("verified", sum(sizes.values()), unit="bytes") as update:  # terminal only
        for rel, size in sorted(sizes.items()):
            p = Path(str(mnt) + rel)
            n = 0
            try:
                fd = os.open(p, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # read from the tiers
                    while chunk := os.read(fd, READ_BLOCK):
                        n += len(chunk)
                        update(total + n, None)
                finally:
                    os.close(fd)
            except OSError as exc:
                problems.append(f"{rel}: {exc.strerror} after {n} bytes")
                continue
            if n != size:
                problems.append(f"{rel}: read {n} bytes, the catalog says {size}")
            total += n
    elapsed = time.perf_counter() - started
    if states[0] != CheckpointState.COMMITTED.value:
        problems.append(f"state is {states[0]}, not committed")
    rate = total / elapsed / 1e6 if elapsed > 0 else 0.0
    print(f"ckptfs verify: {path}: {len(sizes)} file(s), {total / 2**20:.1f} MiB read and "
          f"verified in {elapsed:.2f} s ({rate:.0f} MB/s)")
    for problem in problems:
        print(f"  problem: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _sizes_through_mount(mnt: Path, path: Path) -> dict[str, int]:
    """The regular files under ``path`` and their sizes, by walking the mount."""

    def fail(exc: OSError) -> None:
        if exc.errno == errno.EACCES:
            raise denied(path, None, os.getuid())
        raise CkptfsError(f"{exc.filename}: {exc.strerror}")

    sizes: dict[str, int] = {}
    for root, _dirs, names in os.walk(path, onerror=fail):
        for name in names:
            p = Path(root) / name
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                sizes["/" + os.path.relpath(p, mnt)] = st.st_size
    return sizes


def _gc_through_mount(path: Path) -> int:
    """Ask the daemon to apply retention under ``path``; returns when it is done."""
    try:
        with progress("applying retention", None):  # a spinner on a terminal
            # The set asks for the pass and returns; the get waits for it. A set that waited
            # would hold PATH's inode locked in the kernel (ls, create) meanwhile.
            os.setxattr(str(path), "user.ckptfs.gc", b"1")
            os.getxattr(str(path), "user.ckptfs.gc")
    except OSError as exc:
        if exc.errno == errno.EACCES:
            raise denied(path, None, os.getuid()) from None
        hint = " (only the owner of PATH or root may run gc there)" if exc.errno == errno.EPERM else ""
        print(f"ckptfs gc: {path}: {exc.strerror}{hint}", file=sys.stderr)
        return 1
    return 0


def cmd_gc(path: Path, dry_run: bool) -> int:
    """Apply retention now to the checkpoints under ``path`` (through the mount: the daemon
    applies it and returns when done; the owner of ``path`` or root only), or with
    ``dry_run`` print what it would do, from the policies the daemon recorded."""
    mnt, state_dir, inner = live.inside_mount(path)
    if not dry_run and not state_dir_readable(state_dir):
        # A user other than the daemon's, on an allow_other mount: the state dir is
        # private, so no report of what changed; the daemon still checks the owner.
        return _gc_through_mount(path)
    catalog = open_catalog(state_dir)
    try:
        viewer = Viewer.of(catalog)
        viewer.require(inner, path)
        before = {r.root: r.state.value for r in catalog.checkpoint_rows(inner)}
        raw = catalog.get_meta("retention")
        policies = tuple(RetentionPolicy(**p) for p in json.loads(raw)) if raw else ()
        # Each run planned whole (as the daemon does), shown for what lies under PATH.
        plans = plan_all(to_ckpts(catalog.checkpoint_rows("/")), policies, time.time_ns())
    finally:
        catalog.close()
    if not policies:
        print("ckptfs gc: no [[retention]] policy is configured: nothing expires")
    if dry_run:
        for run, plan in sorted(plans.items()):
            lines = [
                f"  {label:<12} {r}  ({plan.why.get(r, '')})"
                for label, roots in (("keep local", plan.keep_local),
                                     ("remote only", plan.evict_local),
                                     ("expire", plan.expire), ("skip upload", plan.skip_upload))
                for r in roots if under(r, inner) and viewer.may_see(r)
            ]
            if lines:
                print(f"run {run}:")
                print("\n".join(lines))
        return 0
    if _gc_through_mount(path):
        return 1
    catalog = open_catalog(state_dir)
    try:
        after = {r.root: r.state.value for r in catalog.checkpoint_rows(inner)
                 if viewer.may_see(r.root)}
    finally:
        catalog.close()
    changed = [(r, before.get(r), s) for r, s in after.items() if before.get(r) != s]
    for root, old, new in changed:
        print(f"{root}: {old} -> {new}")
    print(f"ckptfs gc: done, {len(changed)} checkpoint(s) changed state")
    return 0
