"""Chunks staged in place (codec/staged.py) through the filesystem core: a save's chunks
are assembled in reused buffers, every buffer comes back, and what is read (before and
after the commit) is what was written, whatever the write pattern."""

import os
from pathlib import Path

import pytest

from tests.vfs.test_vfs import CS, RW, make_fs, read_file, write_file

from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.config import TierConfig
from ckptfs.errors import CkptfsError
from ckptfs.testing.tiers import FaultyTier, MemoryTier
from ckptfs.tiers.base import Tier
from ckptfs.tiers.local import LocalTier
from ckptfs.vfs.context import ROOT


def local_tiers(tmp_path: Path, direct_io: bool = True) -> list[Tier]:
    tiers: list[Tier] = []
    for name in ("a", "b"):
        t = LocalTier(TierConfig(name, "local", tmp_path / name, direct_io=direct_io))
        t.open()
        tiers.append(t)
    return tiers


async def test_a_save_reuses_its_chunk_buffers(tmp_path: Path) -> None:
    # Three files of four chunks each, written one after the other in whole-chunk requests
    # (as a save arrives): the chunks are staged, and the buffers of the first file serve
    # the next ones instead of new memory for every chunk.
    async with make_fs(tmp_path, local_tiers(tmp_path), memory_budget=8 * CS) as fs:
        files = {f"f{i}".encode(): os.urandom(4 * CS) for i in range(3)}
        for name, data in files.items():
            await write_file(fs, name, data, step=CS)
            assert fs.stages.in_use == 0  # every buffer came back at the commit
        assert 1 <= fs.stages.made <= 4
        for name, data in files.items():
            assert await read_file(fs, name) == data


async def test_small_writes_do_not_stage(tmp_path: Path) -> None:
    async with make_fs(tmp_path, local_tiers(tmp_path)) as fs:
        await write_file(fs, b"small", os.urandom(3 * CS), step=1000)
        assert fs.stages.made == 0


@pytest.mark.parametrize("direct_io", [True, False])
@pytest.mark.parametrize("step", [CS, CS + 4096, 3 * CS // 2 + 17])
async def test_staged_writes_read_back_exactly(tmp_path: Path, step: int, direct_io: bool) -> None:
    # Requests that straddle chunk boundaries, an overwrite inside a chunk still being
    # assembled, a hole, reads before the commit (from the staged buffers and from chunks
    # in flight) and after it; frames written with O_DIRECT or through the page cache.
    async with make_fs(tmp_path, local_tiers(tmp_path, direct_io)) as fs:
        data = bytearray(os.urandom(5 * CS + 999))
        fh, inode = await fs.create(ROOT_INODE, b"f", 0o644, RW, ROOT)
        for off in range(0, len(data), step):
            await fs.write(fh, off, bytes(data[off : off + step]))
        patch = os.urandom(CS)
        at = len(data) - CS // 2  # inside the last, partial chunk: staged, not yet stored
        await fs.write(fh, at, patch)
        data[at : at + len(patch)] = patch
        hole_at = len(data) + 3 * CS + 5
        tail = os.urandom(CS)
        await fs.write(fh, hole_at, tail)
        data.extend(bytes(hole_at - len(data)))
        data.extend(tail)
        assert bytes(await fs.read(fh, 0, len(data) + 10)) == bytes(data)
        await fs.flush(fh)
        await fs.release(fh)
        assert await read_file(fs, b"f") == bytes(data)
        assert fs.stages.in_use == 0
    async with make_fs(tmp_path, local_tiers(tmp_path, direct_io)) as fs:
        assert await read_file(fs, b"f") == bytes(data)


async def test_truncate_and_rewrite_of_staged_chunks(tmp_path: Path) -> None:
    async with make_fs(tmp_path, local_tiers(tmp_path)) as fs:
        first = os.urandom(2 * CS + CS // 2)
        fh, inode = await fs.create(ROOT_INODE, b"f", 0o644, RW, ROOT)
        await fs.write(fh, 0, first)
        await fs.setattr(inode.ino, size=CS + 100)  # cuts the staged partial chunk
        second = os.urandom(CS)
        await fs.write(fh, CS + 4096, second)  # the gap reads as zeros, not as old bytes
        expect = first[: CS + 100] + bytes(4096 - 100) + second
        assert bytes(await fs.read(fh, 0, 4 * CS)) == expect
        await fs.flush(fh)
        await fs.release(fh)
        assert await read_file(fs, b"f") == expect
        assert fs.stages.in_use == 0


@pytest.mark.allow_log_errors
async def test_a_failed_chunk_write_gives_its_buffer_back(tmp_path: Path) -> None:
    bad = FaultyTier(MemoryTier("bad"))
    bad.fail_puts = True
    async with make_fs(tmp_path, [bad]) as fs:
        fh, _ = await fs.create(ROOT_INODE, b"f", 0o644, RW, ROOT)
        await fs.write(fh, 0, os.urandom(2 * CS))
        with pytest.raises(CkptfsError):
            await fs.flush(fh)
        await fs.release(fh)
        assert fs.stages.in_use == 0


@pytest.mark.parametrize("direct_io", [True, False])
async def test_large_staged_frames_round_trip(tmp_path: Path, direct_io: bool) -> None:
    # Chunks of 2 MiB: their frames are large enough for O_DIRECT (tiers/direct.py), so
    # with direct_io each goes to the device from its staged buffer itself.
    big = 2 * 1024 * 1024
    data = os.urandom(3 * big + 12345)
    opts = {"chunk_size": big, "memory_budget": 4 * big}
    async with make_fs(tmp_path, local_tiers(tmp_path, direct_io), **opts) as fs:
        await write_file(fs, b"f", data, step=512 * 1024)
        assert fs.stages.made >= 1 and fs.stages.in_use == 0
        assert await read_file(fs, b"f") == data
    async with make_fs(tmp_path, local_tiers(tmp_path, direct_io), **opts) as fs:
        assert await read_file(fs, b"f") == data
