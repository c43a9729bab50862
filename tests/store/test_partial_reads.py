"""A warm page-cache reader's hole is served from the blocks it covers, each checked
against the block digests of a chunk verified whole earlier; never wrong bytes."""

import os
from pathlib import Path

import pytest

from tests.vfs.test_vfs import make_fs, write_file

from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.chunks.blocks import BLOCK
from ckptfs.config import ReadConfig, TierConfig
from ckptfs.errors import CkptfsError
from ckptfs.tiers.base import Tier
from ckptfs.tiers.local import LocalTier
from ckptfs.vfs.filesystem import Filesystem

MiB = 1024 * 1024
CS = 4 * MiB
# No readahead: the first request of a warm reader (at 0) would fetch chunk 1 whole.
OPTS = {"chunk_size": CS, "memory_budget": 8 * CS, "reads": ReadConfig(readahead=0)}


def local(tmp_path: Path, name: str) -> LocalTier:
    t = LocalTier(TierConfig(name, "local", tmp_path / name))
    t.open()
    return t


async def read_all_then_forget(fs: Filesystem, ino: int, size: int) -> bytes:
    """A cold sequential read (every chunk fetched whole and verified), then the chunks
    leave the daemon's memory as they would under other files' reads."""
    fh = await fs.open(ino, os.O_RDONLY)
    try:
        got = bytes(await fs.read(fh, 0, size))
    finally:
        await fs.release(fh)
    fs.store._cache.clear()
    return got


async def warm_hole(fs: Filesystem, ino: int, off: int, size: int) -> bytes:
    """What a reader whose page cache holds the file but [off, off + size) sends: the
    start, then a jump over what the kernel had (the daemon sees the reader warm)."""
    fh = await fs.open(ino, os.O_RDONLY)
    try:
        await fs.read(fh, 0, 4096)
        return bytes(await fs.read(fh, off, size))
    finally:
        await fs.release(fh)


async def test_a_hole_reads_only_its_blocks_and_each_is_checked(tmp_path: Path) -> None:
    tiers: list[Tier] = [local(tmp_path, "l0"), local(tmp_path, "l1")]
    data = os.urandom(3 * CS - 12345)
    async with make_fs(tmp_path, tiers, **OPTS) as fs:
        ino = await write_file(fs, b"f", data, step=MiB)
        refs = await fs.db(fs.catalog.extents, ino)
    async with make_fs(tmp_path, tiers, **OPTS) as fs:
        assert await read_all_then_forget(fs, ino, len(data)) == data
        assert fs.store.stats.get("partial_reads") == 0
        for off, size in [(CS + 3 * BLOCK // 2, 128 * 1024), (2 * CS + 5, 2 * BLOCK),
                          (2 * CS + BLOCK, CS)]:  # the last runs past the file's end
            assert await warm_hole(fs, ino, off, size) == data[off:off + size]
        assert fs.store.stats.get("partial_reads") == 3
        # Chunks 1 and 2 were not read whole (chunk 0 was: the reader's first request).
        assert not fs.store.cached(refs[1].digest) and not fs.store.cached(refs[2].digest)


@pytest.mark.allow_log_errors
async def test_a_damaged_block_is_never_served_and_the_whole_read_decides(
    tmp_path: Path,
) -> None:
    only = local(tmp_path, "l0")
    data = os.urandom(2 * CS)
    async with make_fs(tmp_path, [only], **OPTS) as fs:
        ino = await write_file(fs, b"f", data, step=MiB)
        refs = await fs.db(fs.catalog.extents, ino)
    async with make_fs(tmp_path, [only], **OPTS) as fs:
        assert await read_all_then_forget(fs, ino, len(data)) == data
        # One bit of chunk 1's third block flips on the device after it was verified.
        victim = next(p for p in (tmp_path / "l0" / "chunks").glob("*/*")
                      if p.name == refs[1].key)
        raw = bytearray(victim.read_bytes())
        raw[len(raw) - CS + 2 * BLOCK + 77] ^= 0x10
        victim.write_bytes(bytes(raw))
        # A hole in the first two blocks: those blocks still match; served.
        assert await warm_hole(fs, ino, CS + 10, BLOCK) == data[CS + 10:CS + 10 + BLOCK]
        assert fs.store.stats.get("partial_reads") == 1
        # A hole over the damaged block: refused, and the whole chunk's check fails: EIO.
        with pytest.raises(CkptfsError):
            await warm_hole(fs, ino, CS + 2 * BLOCK, 4096)
        assert fs.store.stats.get("partial_reads_refused") == 1
        assert fs.store.stats.get("integrity_failures") >= 1
        inode = await fs.lookup(ROOT_INODE, b"f")
        assert inode.size == len(data)
