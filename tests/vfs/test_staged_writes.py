"""Chunks staged in place (codec/staged.py) through the filesystem core: a save's chunks
are assembled in reused buffers, every buffer comes back, and what is read (before and
after the commit) is what was written, whatever the write pattern."""

import ctypes
import os
from pathlib import Path
from typing import Any

import pytest

from tests.vfs.test_vfs import CS, RW, make_fs, read_file, store_of, write_file

from ckptfs.catalog import ChunkRef
from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.codec import frame
from ckptfs.config import TierConfig
from ckptfs.errors import CkptfsError
from ckptfs.testing.tiers import FaultyTier, MemoryTier
from ckptfs.tiers import direct
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
    # Three files of four chunks each, written one after the other in requests of a
    # quarter chunk (as a save arrives), each chunk's start overwritten before it fills:
    # those chunks are staged, and the buffers of the first file serve the next ones
    # instead of new memory for every chunk.
    cs = 1024 * 1024
    async with make_fs(tmp_path, local_tiers(tmp_path), chunk_size=cs, memory_budget=8 * cs) as fs:
        files = {f"f{i}".encode(): bytearray(os.urandom(4 * cs)) for i in range(3)}
        for name, data in files.items():
            fh, _ = await fs.create(ROOT_INODE, name, 0o644, RW, ROOT)
            for off in range(0, len(data), cs // 4):
                await fs.write(fh, off, bytes(data[off : off + cs // 4]))
                if off % cs == cs // 4:  # two requests in: rewrite the chunk's first bytes
                    patch = os.urandom(4096)
                    await fs.write(fh, off - cs // 4, patch)
                    data[off - cs // 4 : off - cs // 4 + 4096] = patch
            await fs.flush(fh)
            await fs.release(fh)
            assert fs.stages.in_use == 0  # every buffer came back at the commit
        assert 1 <= fs.stages.made <= 8
        for name, data in files.items():
            assert await read_file(fs, name) == bytes(data)


async def test_a_sequential_save_stages_nothing(tmp_path: Path) -> None:
    # Whole chunks in one request, or a chunk in several: the parts go to the store.
    async with make_fs(tmp_path, local_tiers(tmp_path)) as fs:
        data = os.urandom(4 * CS)
        await write_file(fs, b"whole", data, step=CS)
        await write_file(fs, b"halves", data, step=CS // 2)
        assert fs.stages.made == 0
        assert await read_file(fs, b"whole") == await read_file(fs, b"halves") == data


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
        fh, _ = await fs.create(ROOT_INODE, b"f", 0o644, RW, ROOT)
        for off in range(0, len(data), 512 * 1024):
            await fs.write(fh, off, data[off : off + 512 * 1024])
            if off == big:  # chunk 1 is staged (overwritten while it is assembled)
                await fs.write(fh, off, data[off : off + 4096])
        await fs.flush(fh)
        await fs.release(fh)
        assert fs.stages.made >= 1 and fs.stages.in_use == 0
        assert await read_file(fs, b"f") == data
    async with make_fs(tmp_path, local_tiers(tmp_path, direct_io), **opts) as fs:
        assert await read_file(fs, b"f") == data


async def test_the_trio_thread_hands_a_save_bytes_over_uncopied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A save's requests stay the bytes objects the FUSE layer handed over: the chunk's
    # parts before it fills, and then exactly what the store is given to hash and write
    # in its worker thread. No buffer is staged (written) on the trio thread.
    cs = 1024 * 1024  # requests of 256 KiB: a save's (STAGE_MIN)
    async with make_fs(tmp_path, local_tiers(tmp_path), chunk_size=cs, memory_budget=4 * cs) as fs:
        fh, inode = await fs.create(ROOT_INODE, b"f", 0o644, RW, ROOT)
        f = fs.open_files[inode.ino]
        store = f.svc.store
        handed: list[list[Any]] = []
        real_write = store.write

        async def write(data: Any, *args: Any) -> ChunkRef:
            handed.append(list(data))  # on the trio thread, before the worker runs
            return await real_write(data, *args)

        monkeypatch.setattr(store, "write", write)  # the real write, watched
        requests = [os.urandom(cs // 4) for _ in range(4)]
        for i, r in enumerate(requests[:3]):
            await fs.write(fh, i * len(r), r)
        assert f.dirty[0].staged is None and f.dirty[0].pool is fs.stages
        assert all(p is r for p, r in zip(f.dirty[0].parts, requests[:3], strict=True))
        await fs.write(fh, 3 * cs // 4, requests[3])  # fills the chunk: dispatched
        await fs.flush(fh)
        await fs.release(fh)
        assert len(handed) == 1 and len(handed[0]) == 4
        assert all(p is r for p, r in zip(handed[0], requests, strict=True))
        assert fs.stages.made == 0
        assert await read_file(fs, b"f") == b"".join(requests)


async def test_a_save_chunk_reaches_the_device_from_the_buffer_it_was_hashed_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The store's worker copies a save's parts into a reused page-aligned buffer in the
    # pass that hashes them (Staged.fill), so the tier writes that buffer with O_DIRECT
    # as it lies: one frame buffer per chunk, no copy in the tier (which read the cold
    # parts a second time), and the buffers come back for the next chunks.
    cs = 2 * 1024 * 1024  # frames large enough for O_DIRECT (tiers/direct.py)
    frames: list[list[Any]] = []
    copies: list[int] = []
    real_write, real_copy = direct.write_checked, direct._copy

    def write_checked(fd: int, parts: Any, *args: Any) -> None:
        frames.append([(type(p), len(p), _address(p) % direct.ALIGN) for p in parts])
        real_write(fd, parts, *args)

    def copy(base: int, at: int, part: Any, view: memoryview) -> None:
        copies.append(len(part))
        real_copy(base, at, part, view)

    monkeypatch.setattr(direct, "write_checked", write_checked)
    monkeypatch.setattr(direct, "_copy", copy)
    opts = {"chunk_size": cs, "memory_budget": 4 * cs}
    files = {f"f{i}".encode(): os.urandom(4 * cs) for i in range(3)}
    async with make_fs(tmp_path, local_tiers(tmp_path), **opts) as fs:
        for name, data in files.items():
            await write_file(fs, name, data, step=256 * 1024)  # a save's requests
        assert len(frames) == 12
        assert all(f == [(memoryview, frame.HEADER_SIZE + cs, 0)] for f in frames)
        assert copies == []
        # At most the chunks the memory budget lets be in flight at once.
        assert 1 <= store_of(fs).frames.made <= 4
        for name, data in files.items():
            assert await read_file(fs, name) == data
    async with make_fs(tmp_path, local_tiers(tmp_path), **opts) as fs:
        for name, data in files.items():
            assert await read_file(fs, name) == data


def _address(buf: Any) -> int:
    view = memoryview(buf)
    if view.readonly:
        return 1  # bytes (a header, a part): not a buffer O_DIRECT can write from
    return ctypes.addressof((ctypes.c_char * view.nbytes).from_buffer(view))
