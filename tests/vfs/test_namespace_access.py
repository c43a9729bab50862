"""Namespace access in the filesystem core (no kernel), built through the composition root
from a config with ``[[namespace]]`` tables: every entry point asks vfs/access.py; the
daemon's own work (ROOT) is exempt; the listing for callers who cannot read the state dir
shows only their namespaces."""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from tests.support.daemons import build_daemon, hooked_sqlite

from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.config import config_from_dict
from ckptfs.daemon.build import build_for_config
from ckptfs.daemon.services import running
from ckptfs.errors import CkptfsError
from ckptfs.testing.tiers import MemoryTier
from ckptfs.vfs.context import ROOT, RequestContext
from ckptfs.vfs.filesystem import Filesystem

CS = 64 * 1024
OWNER, STRANGER = 1001, 1003
CONFIG = {"namespace": [{"path": "/proj-a", "uids": [OWNER]}], "chunk_size": "64KiB"}


def who(uid: int) -> RequestContext:
    return RequestContext(uid=uid, gid=uid, pid=0)  # pid 0: no /proc to read


@asynccontextmanager
async def ns_fs(tmp_path: Path) -> AsyncIterator[Filesystem]:
    cfg = config_from_dict(CONFIG)
    cat, wakeups = hooked_sqlite(tmp_path / "catalog.sqlite")
    try:
        # The composition root hands the config's rules to the filesystem ...
        assert build_for_config(cfg, cat, [MemoryTier("l")], CS).fs.access.gov is cfg.governance
        # ... and this one runs without a kernel (no invalidations, no stats file).
        d = build_daemon(cat, [MemoryTier("l")], wakeups, chunk_size=CS,
                         memory_budget=8 * CS, io_threads=2, governance=cfg.governance)
        async with running(d, drain=False):
            yield d.fs
    finally:
        cat.close()


async def errno_of(fn: object, *args: object) -> int:
    try:
        await fn(*args)  # type: ignore[operator]
    except CkptfsError as exc:
        return exc.errno
    return 0


async def test_every_entry_point_asks(tmp_path: Path) -> None:
    async with ns_fs(tmp_path) as fs:
        s = who(STRANGER)
        assert await errno_of(fs.mkdir, ROOT_INODE, b"proj-a", 0o777, s) == errno.EACCES
        root = await fs.mkdir(ROOT_INODE, b"proj-a", 0o777, who(OWNER))
        fh, f = await fs.create(root.ino, b"f", 0o666, os.O_RDWR, who(OWNER))
        await fs.write(fh, 0, b"secret")
        await fs.flush(fh)
        await fs.release(fh)
        shared = await fs.mkdir(ROOT_INODE, b"shared", 0o777, s)

        denied: list[tuple[Any, ...]] = [
            (fs.lookup, root.ino, b"f", s), (fs.getattr, f.ino, s), (fs.opendir, root.ino, s),
            (fs.open, f.ino, os.O_RDONLY, s), (fs.create, root.ino, b"g", 0o666, os.O_RDWR, s),
            (fs.mknod, root.ino, b"n", stat.S_IFREG | 0o666, 0, s),
            (fs.symlink, root.ino, b"l", b"x", s), (fs.mkdir, root.ino, b"d", 0o777, s),
            (fs.unlink, root.ino, b"f", s), (fs.rmdir, ROOT_INODE, b"proj-a", s),
            (fs.rename, root.ino, b"f", shared.ino, b"f", 0, s),
            (fs.rename, shared.ino, b"x", root.ino, b"x", 0, s),
            (fs.link, f.ino, shared.ino, b"l", s),
            (fs.getxattr, f.ino, b"user.x", s), (fs.listxattr, f.ino, s),
            (fs.setxattr, f.ino, b"user.x", b"1", s), (fs.removexattr, f.ino, b"user.x", s),
            (fs.setxattr, root.ino, b"user.ckptfs.gc", b"1", s),
            (fs.getxattr, root.ino, b"user.ckptfs.checkpoints", s),
            (fs.readlink, f.ino, s),
        ]
        for fn, *args in denied:
            assert await errno_of(fn, *args) == errno.EACCES, fn.__name__
        assert await errno_of(lambda: fs.setattr(f.ino, mode=0o600, ctx=s)) == errno.EACCES
        # The namespace root is visible in its parent; the daemon's own work is exempt.
        assert (await fs.lookup(ROOT_INODE, b"proj-a", s)).ino == root.ino
        assert (await fs.getattr(root.ino, s)).is_dir
        assert (await fs.lookup(root.ino, b"f", ROOT)).size == 6
        # Across namespaces: EXDEV for the owner (a copy), whatever it owns.
        assert await errno_of(fs.rename, root.ino, b"f", shared.ino, b"f", 0, who(OWNER)) == errno.EXDEV
        assert await errno_of(fs.rename, ROOT_INODE, b"proj-a", ROOT_INODE, b"b", 0,
                              who(OWNER)) == errno.EXDEV


async def test_listing_shows_a_caller_only_its_namespaces(tmp_path: Path) -> None:
    async with ns_fs(tmp_path) as fs:
        await fs.mkdir(ROOT_INODE, b"proj-a", 0o777, who(OWNER))
        await fs.mkdir(ROOT_INODE, b"shared", 0o777, who(STRANGER))
        for root in ("/proj-a/c1", "/shared/c2"):
            await fs.db(fs.catalog.checkpoint_commit, root, "pattern", 1, 1, "test")

        async def roots(ctx: RequestContext) -> list[str]:
            raw = await fs.getxattr(ROOT_INODE, b"user.ckptfs.checkpoints", ctx)
            assert raw is not None
            page = json.loads(raw)
            assert page["next"] is None
            return sorted(c["root"] for c in page["checkpoints"])

        assert await roots(who(STRANGER)) == ["/shared/c2"]
        assert await roots(who(OWNER)) == ["/proj-a/c1", "/shared/c2"]
        assert await roots(RequestContext(uid=0, gid=0, pid=0)) == ["/shared/c2"]


async def test_a_long_listing_comes_in_pages_that_fit_an_xattr(tmp_path: Path) -> None:
    async with ns_fs(tmp_path) as fs:
        await fs.mkdir(ROOT_INODE, b"shared", 0o777, who(STRANGER))
        want = [f"/shared/run/checkpoint-{i}" for i in range(400)]

        def commit_all() -> None:
            for i, root in enumerate(want):
                fs.catalog.checkpoint_commit(root, "hf", i, i + 1, "test")

        await fs.db(commit_all)
        got: list[str] = []
        name, pages = b"user.ckptfs.checkpoints", 0
        while True:
            raw = await fs.getxattr(ROOT_INODE, name, who(STRANGER))
            assert raw is not None and len(raw) <= 65536  # what an xattr value may hold
            page = json.loads(raw)
            got += [c["root"] for c in page["checkpoints"]]
            pages += 1
            if page["next"] is None:
                break
            name = b"user.ckptfs.checkpoints.%d" % page["next"]
        assert got == want and pages > 1
        assert await errno_of(fs.getxattr, ROOT_INODE, b"user.ckptfs.checkpoints.x",
                              who(STRANGER)) == errno.EINVAL
