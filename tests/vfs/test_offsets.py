"""Large offsets and arbitrary byte names in the filesystem core, without the kernel.

Offsets up to the largest the kernel accepts (2**63 - 1) either work or fail with EFBIG
(past MAX_FILE_SIZE), and never read back wrong: a float in the chunk count of a commit
once dropped the last chunk of a file larger than 2**53 from the open file's extents
(zeros until a remount). The state machine checks names (any bytes but ``/`` and NUL, up
to 255) and offsets against a reference model after every step, across restarts.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.vfs.test_vfs import CS, RW, make_fs

from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.errors import CkptfsError
from ckptfs.testing.tiers import MemoryTier
from ckptfs.tiers.base import Tier
from ckptfs.vfs.context import ROOT
from ckptfs.vfs.openfile import MAX_FILE_SIZE

T = TypeVar("T")
KERNEL_MAX = 2**63 - 1  # the largest offset + 1 the kernel lets through (MAX_LFS_FILESIZE)
MARK = b"TAIL-MARKER"


async def _errno_of(aw: Awaitable[Any]) -> int:
    try:
        await aw
    except CkptfsError as exc:
        return exc.errno
    return 0


@pytest.mark.parametrize("off", [2**53 + 1, 2**55 + CS - 10, 2**57, 2**59 + CS - 1,
                                 MAX_FILE_SIZE - len(MARK)])
async def test_a_write_at_a_large_offset_reads_back_before_and_after_a_restart(
    tmp_path: Path, off: int
) -> None:
    tiers: list[Tier] = [MemoryTier("a")]
    async with make_fs(tmp_path, tiers) as fs:
        fh, inode = await fs.create(ROOT_INODE, b"f", 0o644, RW, ROOT)
        assert await fs.write(fh, off, MARK) == len(MARK)
        await fs.fsync(fh)
        assert bytes(await fs.read(fh, off, len(MARK))) == MARK  # the same handle
        await fs.release(fh)
        fh = await fs.open(inode.ino, os.O_RDONLY)
        assert bytes(await fs.read(fh, off - 5, 5 + len(MARK) + 5)) == bytes(5) + MARK
        await fs.release(fh)
        assert (await fs.getattr(inode.ino)).size == off + len(MARK)
        # A truncate into the marker keeps what is below the cut, also on a large chunk index.
        await fs.setattr(inode.ino, size=off + 4)
        fh = await fs.open(inode.ino, os.O_RDONLY)
        assert bytes(await fs.read(fh, off, 100)) == MARK[:4]
        await fs.release(fh)
    async with make_fs(tmp_path, tiers) as fs:
        fh = await fs.open(inode.ino, os.O_RDONLY)
        assert bytes(await fs.read(fh, off, 100)) == MARK[:4]
        await fs.release(fh)


async def test_past_the_largest_file_size_writes_and_truncates_fail_with_efbig(
    tmp_path: Path,
) -> None:
    async with make_fs(tmp_path, [MemoryTier("a")]) as fs:
        fh, inode = await fs.create(ROOT_INODE, b"f", 0o644, RW, ROOT)
        for off in (MAX_FILE_SIZE, 2**62, KERNEL_MAX - len(MARK)):
            assert await _errno_of(fs.write(fh, off, MARK)) == errno.EFBIG
        # Across the bound: cut short there, as Linux does at a filesystem's maximum.
        assert await fs.write(fh, MAX_FILE_SIZE - 4, MARK) == 4
        await fs.fsync(fh)
        assert bytes(await fs.read(fh, MAX_FILE_SIZE - 8, 100)) == bytes(4) + MARK[:4]
        assert await _errno_of(fs.setattr(inode.ino, size=MAX_FILE_SIZE + 1)) == errno.EFBIG
        await fs.release(fh)
        assert (await fs.getattr(inode.ino)).size == MAX_FILE_SIZE
        # Without an open writer (a truncate committed at once) it is refused too.
        assert await _errno_of(fs.setattr(inode.ino, size=KERNEL_MAX)) == errno.EFBIG
        assert (await fs.getattr(inode.ino)).size == MAX_FILE_SIZE
