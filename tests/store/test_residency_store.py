"""Residency in the daemon's object graph (daemon.build, memory tiers): a chunk that files
of several namespaces share may be only where all of them allow (an upload job made before
the chunk was bound is dropped, not run), and a write whose chunk no local tier may hold
fails with EIO and commits nothing."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import trio

from tests.vfs.test_vfs import CS, RW, make_daemon

from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.codec import frame
from ckptfs.config.model import GovernanceConfig, NamespaceConfig
from ckptfs.errors import CkptfsError
from ckptfs.testing.tiers import FaultyTier, MemoryTier
from ckptfs.tiers.base import Tier
from ckptfs.vfs.context import ROOT
from ckptfs.vfs.filesystem import Filesystem


def ns(path: str, *locations: str) -> NamespaceConfig:
    return NamespaceConfig(path=path, uids=(0,), allowed_locations=locations,
                           origin=f"namespace[{path}]")


async def save(fs: Filesystem, parent: int, name: bytes, data: bytes) -> None:
    fh, _ = await fs.create(parent, name, 0o644, RW, ROOT)
    try:
        await fs.write(fh, 0, data)
        await fs.flush(fh)
    finally:
        await fs.release(fh)


async def load(fs: Filesystem, parent: int, name: bytes) -> bytes:
    ino = (await fs.lookup(parent, name)).ino
    fh = await fs.open(ino, os.O_RDONLY)
    try:
        return bytes(await fs.read(fh, 0, 1 << 30))
    finally:
        await fs.release(fh)


def chunk_striped_to(index: int, of: int) -> bytes:
    """One chunk of random bytes whose digest stripes to remote ``index`` of ``of``."""
    while True:
        data = os.urandom(CS)
        if int.from_bytes(frame.digest_of(data)[:4], "big") % of == index:
            return data


@pytest.mark.allow_log_warnings("residency:", "upload to tier rus failed")
async def test_an_upload_made_before_its_chunk_was_bound_is_dropped(tmp_path: Path) -> None:
    """/other/x commits bytes X (job: remote rus, location us) while rus fails; then
    /proj/y (bound to eu) commits the same bytes: once rus works, its job is dropped, not
    run; reu (eu) holds the chunk; both files read back."""
    rus = FaultyTier(MemoryTier("rus", kind="remote", location="us"))
    reu = MemoryTier("reu", kind="remote", location="eu")
    tiers: list[Tier] = [MemoryTier("eu0", location="eu"), MemoryTier("us0", location="us"), reu,
                         rus]
    data = chunk_striped_to(1, 2)  # remotes in name order: reu, rus
    digest = frame.digest_of(data)
    key = digest.hex()
    gov = GovernanceConfig(namespaces=(ns("/proj", "eu"),))
    rus.fail_puts = True
    async with make_daemon(tmp_path, tiers, governance=gov) as d:
        fs, cat = d.fs, d.catalog
        proj = (await fs.mkdir(ROOT_INODE, b"proj", 0o777, ROOT)).ino
        other = (await fs.mkdir(ROOT_INODE, b"other", 0o777, ROOT)).ino
        await save(fs, other, b"x", data)
        assert (digest, "rus") in await fs.db(cat.upload_job_pairs)
        await save(fs, proj, b"y", data)
        rus.fail_puts = False
        await fs.db(cat.retry_uploads_now, "rus")
        d.uploader.kick()
        with trio.fail_after(10):
            while await fs.db(cat.upload_job_pairs):
                await trio.sleep(0.01)  # polling the catalog for the condition, with a deadline
        assert key in reu.frames
        assert key not in rus.inner.frames  # type: ignore[attr-defined]
        assert "rus" not in await fs.db(cat.replica_tiers, digest)
        assert d.store.stats.get("residency_refused_upload") >= 1
        assert await load(fs, proj, b"y") == data
        assert await load(fs, other, b"x") == data


@pytest.mark.allow_log_errors  # the refused chunk write is logged at ERROR by the open file
@pytest.mark.allow_log_warnings("residency:")
async def test_a_write_no_local_tier_may_hold_fails_with_eio_and_commits_nothing(
    tmp_path: Path,
) -> None:
    """/a (eu) and /b (us) write the same bytes: the chunk may be only where both allow,
    nowhere. The second write fails with EIO and its file stays empty; /a is intact."""
    us0 = MemoryTier("us0", location="us")
    tiers: list[Tier] = [MemoryTier("eu0", location="eu"), us0]
    gov = GovernanceConfig(namespaces=(ns("/a", "eu"), ns("/b", "us")))
    data = os.urandom(2 * CS)
    async with make_daemon(tmp_path, tiers, governance=gov) as d:
        fs = d.fs
        a = (await fs.mkdir(ROOT_INODE, b"a", 0o777, ROOT)).ino
        b = (await fs.mkdir(ROOT_INODE, b"b", 0o777, ROOT)).ino
        await save(fs, a, b"x", data)
        with pytest.raises(CkptfsError) as info:
            await save(fs, b, b"y", data)
        assert info.value.errno == errno.EIO
        assert await load(fs, b, b"y") == b""
        assert await load(fs, a, b"x") == data
        assert not us0.frames, "a copy landed on the us tier"
        assert d.store.stats.get("residency_refused_write") >= 1


@pytest.mark.allow_log_warnings("residency:")
async def test_a_bound_write_does_not_share_another_files_uncommitted_copy_outside_it(
    tmp_path: Path,
) -> None:
    """/other/x has stored bytes X on us0 and not committed; /proj/y (eu) writes X too: it
    puts its own copy on eu0 instead of sharing the us0 one, and reads it from there."""
    us0, eu0 = MemoryTier("us0", location="us"), MemoryTier("eu0", location="eu")
    gov = GovernanceConfig(namespaces=(ns("/proj", "eu"),))
    data = os.urandom(CS)
    key = frame.digest_of(data).hex()
    async with make_daemon(tmp_path, [us0, eu0], governance=gov) as d:
        fs = d.fs
        proj = (await fs.mkdir(ROOT_INODE, b"proj", 0o777, ROOT)).ino
        other = (await fs.mkdir(ROOT_INODE, b"other", 0o777, ROOT)).ino
        fh, _ = await fs.create(other, b"x", 0o644, RW, ROOT)
        try:
            await fs.write(fh, 0, data)  # a full chunk: stored now, committed at the flush
            with trio.fail_after(10):
                while key not in us0.frames:
                    await trio.sleep(0.01)  # polling the tier for the condition, with a deadline
            assert key not in eu0.frames
            await save(fs, proj, b"y", data)
            assert key in eu0.frames
            await fs.flush(fh)
        finally:
            await fs.release(fh)
        assert await load(fs, proj, b"y") == data
        assert await load(fs, other, b"x") == data
