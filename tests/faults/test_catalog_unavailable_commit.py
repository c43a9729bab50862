"""A catalog that becomes unreachable (a shared catalog's database stopped: every call
fails with CatalogUnavailable, EIO) around a file's commit, on the daemon's object graph
without FUSE. Found by tests/multinode/test_outage_under_load.py; here deterministic:

* the commit transaction went through, the collection of what it replaced did not: the
  close succeeds (the version is committed), and the pins of its chunks are dropped once
  (an identical chunk another open file is writing stays pinned);
* the commit itself failed: the close fails with EIO; then the release (which collects the
  discarded chunks, and fails too) still tells the kernel to drop its cached pages and
  forgets the open state, so the next open reads the last committed version.
"""

from __future__ import annotations

import errno
import os
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.support.daemons import build_daemon
from tests.vfs.test_vfs import CS, RW, read_file, write_file

from ckptfs.catalog import SqliteCatalog
from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.daemon.build import Daemon, Wakeups
from ckptfs.daemon.services import running
from ckptfs.errors import CatalogUnavailable, CkptfsError
from ckptfs.testing.tiers import MemoryTier
from ckptfs.vfs.context import ROOT

pytestmark = pytest.mark.allow_log_warnings("not collected")


class DownCatalog(SqliteCatalog):
    """A SQLite catalog whose commit or collection fails as an unreachable database's."""

    fail_commit = False
    fail_collect = False

    def commit_file(self, *args: Any, **kw: Any) -> Any:
        if self.fail_commit:
            raise CatalogUnavailable("catalog down (test)")
        return super().commit_file(*args, **kw)

    def drop_unreferenced(self, digests: Iterable[bytes], extra_tiers: Any = None) -> Any:
        if self.fail_collect:
            raise CatalogUnavailable("catalog down (test)")
        return super().drop_unreferenced(digests, extra_tiers)


@asynccontextmanager
async def daemon(path: Path, invalidated: list[int]) -> AsyncIterator[tuple[Daemon, DownCatalog]]:
    wakeups = Wakeups()
    cat = DownCatalog(path / "catalog.sqlite", hooks=wakeups.catalog_hooks())
    try:
        d = build_daemon(cat, [MemoryTier("local0")], wakeups, chunk_size=CS,
                         memory_budget=8 * CS, io_threads=2, invalidate=invalidated.append)
        async with running(d, drain=False):
            yield d, cat
    finally:
        cat.close()


async def test_a_commit_whose_collection_fails_succeeds_and_releases_its_pins_once(
    tmp_path: Path,
) -> None:
    async with daemon(tmp_path, []) as (d, cat):
        fs = d.fs
        old, new = os.urandom(2 * CS), os.urandom(2 * CS)
        await write_file(fs, b"f", old)
        # Another open file writes the same bytes as the new version, not committed yet.
        other, _ = await fs.create(ROOT_INODE, b"g", 0o644, RW, ROOT)
        await fs.write(other, 0, new)
        gfile = fs.handles[other].file
        with trio.fail_after(10):
            while gfile.inflight:
                await trio.sleep(0.01)  # its chunk writes (and pins) land in threads
        ino = (await fs.lookup(ROOT_INODE, b"f")).ino
        fh = await fs.open(ino, os.O_WRONLY | os.O_TRUNC)
        await fs.write(fh, 0, new)
        cat.fail_collect = True  # the old version's chunks cannot be collected
        await fs.flush(fh)  # committed: no error
        await fs.release(fh)
        cat.fail_collect = False
        assert await read_file(fs, b"f") == new
        pinned = [r.digest for r in gfile.written]
        assert pinned and all(d.store.guard.pinned(dg) for dg in pinned)  # g's, still
        await fs.flush(other)
        await fs.release(other)
        assert await read_file(fs, b"g") == new


async def test_a_failed_commit_and_collection_drop_the_kernels_pages_and_the_open_state(
    tmp_path: Path,
) -> None:
    invalidated: list[int] = []
    async with daemon(tmp_path, invalidated) as (d, cat):
        fs = d.fs
        old, new = os.urandom(CS + 5), os.urandom(3 * CS)
        ino = await write_file(fs, b"f", old)
        fh = await fs.open(ino, os.O_WRONLY | os.O_TRUNC)
        await fs.write(fh, 0, new)
        cat.fail_commit = cat.fail_collect = True
        with pytest.raises(CkptfsError) as info:
            await fs.flush(fh)
        assert info.value.errno == errno.EIO
        invalidated.clear()
        await fs.release(fh)  # the discard's collection fails too: no error, pages dropped
        assert ino in invalidated and ino not in fs.open_files
        cat.fail_commit = cat.fail_collect = False
        assert await read_file(fs, b"f") == old
        assert (await fs.getattr(ino)).size == len(old)
