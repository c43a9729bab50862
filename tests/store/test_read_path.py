"""Read-path logic without a mount: tier order from measured speed, remote heal, copy-back."""

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.store.test_local_full import wait_for
from tests.store.test_upload import wait_backlog_empty
from tests.vfs.test_vfs import CS, make_fs, read_file, store_of, write_file

from ckptfs.codec import frame
from ckptfs.config import ReadConfig, TierConfig
from ckptfs.stats import Stats
from ckptfs.testing.tiers import MemoryTier
from ckptfs.tiers.base import Tier
from ckptfs.tiers.local import LocalTier

MiB = 1024 * 1024


def test_read_order_follows_measured_speed_and_health() -> None:
    s = Stats()
    s.add_tier("nvme", "local")
    s.add_tier("slow", "local")
    s.add_tier("s3", "s3")
    assert s.read_order(["s3", "slow", "nvme"], 16 << 20)[-1] == "s3"  # priors: local first
    for _ in range(30):  # "slow" turns out slower than the object store
        s.record_read("slow", 16 << 20, 2.0)
        s.record_read("nvme", 16 << 20, 0.01)
        s.record_read("s3", 16 << 20, 0.2)
    assert s.read_order(["s3", "slow", "nvme"], 16 << 20) == ["nvme", "s3", "slow"]
    s.record_error("nvme", "EIO")
    assert s.read_order(["s3", "slow", "nvme"], 16 << 20)[-1] == "nvme"
    assert s.snapshot()["tiers"][0]["state"] == "degraded"
    s.record_ok("nvme")
    assert s.read_order(["s3", "slow", "nvme"], 16 << 20)[0] == "nvme"


async def saved_and_uploaded(tmp_path: Path, tiers: list[Tier], data: bytes, **opts: Any) -> None:
    """``data`` written as file ``f``, every upload done, the daemon stopped."""
    async with make_fs(tmp_path, tiers, **opts) as fs:
        await write_file(fs, b"f", data)
        await wait_backlog_empty(fs)


def flip_last_byte(tier: MemoryTier, key: str) -> None:
    """Damage one stored frame as a device would (its last byte flipped)."""
    damaged = bytearray(tier.frames[key])
    damaged[-1] ^= 1
    tier.frames[key] = bytes(damaged)


@pytest.mark.allow_log_errors
@pytest.mark.allow_log_warnings("missing; healing it", "corrupt; healing it")
async def test_a_corrupt_remote_copy_is_uploaded_again(tmp_path: Path) -> None:
    """A fresh node reads from two remotes; one copy is corrupt: the read is served from the
    other, a local copy is written, and the bad remote copy is uploaded again from it."""
    local = MemoryTier("l")
    r1, r2 = MemoryTier("r1", kind="remote"), MemoryTier("r2", kind="remote")
    data = os.urandom(2 * CS)
    await saved_and_uploaded(tmp_path, [local, r1, r2], data, remote_copies=2)
    local.frames.clear()  # chunks on the remotes only
    key = sorted(r1.frames)[0]
    flip_last_byte(r1, key)
    async with make_fs(tmp_path, [local, r1, r2], remote_copies=2) as fs:
        assert await read_file(fs, b"f") == data
        await wait_for(lambda: fs.store.stats.get("integrity_failures") >= 1)
        await wait_for(lambda: key in local.frames)
        # Two heals: the local copy written, then the upload to r1 queued again (the
        # backlog was empty until then: waiting for it before the second raced).
        await wait_for(lambda: fs.store.stats.get("heals") >= 2)
        await wait_backlog_empty(fs)
        frame.verify(r1.frames[key], bytes.fromhex(key))


async def test_a_sequential_read_copies_remote_only_chunks_back(tmp_path: Path) -> None:
    local, remote = MemoryTier("l"), MemoryTier("r", kind="remote")
    data = os.urandom(3 * CS)
    async with make_fs(tmp_path, [local, remote]) as fs:
        await write_file(fs, b"f", data)
        await wait_backlog_empty(fs)
        # Evict every local copy: the chunks live on the remote only.
        assert await store_of(fs).evict(1 << 30) > 0
        assert not local.frames
    async with make_fs(tmp_path, [local, remote]) as fs:
        assert await read_file(fs, b"f") == data
        await wait_for(lambda: len(local.frames) == 3)
        await wait_for(lambda: fs.store.stats.get("copy_backs") >= 3)
        refs = await fs.db(fs.catalog.extents, (await fs.lookup(1, b"f")).ino)
        assert all("l" in r.tiers for r in refs.values())
        with trio.fail_after(5):
            assert await read_file(fs, b"f") == data


async def test_copy_back_never_leaves_chunks_on_the_remote_only(tmp_path: Path) -> None:
    local, remote = MemoryTier("l"), MemoryTier("r", kind="remote")
    data = os.urandom(4 * CS)
    async with make_fs(tmp_path, [local, remote], reads=ReadConfig(copy_back="never")) as fs:
        await write_file(fs, b"f", data)
        await wait_backlog_empty(fs)
        assert await store_of(fs).evict(1 << 30) > 0
    async with make_fs(tmp_path, [local, remote], reads=ReadConfig(copy_back="never")) as fs:
        assert await read_file(fs, b"f") == data
        assert fs.store.stats.get("copy_backs") == 0 and not local.frames


@pytest.mark.allow_log_errors
@pytest.mark.allow_log_warnings("corrupt; healing it")
async def test_local_frames_land_in_reused_buffers_and_a_corrupt_one_is_never_served(
    tmp_path: Path,
) -> None:
    """Large local frames are read (O_DIRECT) into the store's reused receive buffers
    (chunks/bufpool.py) instead of a new zeroed bytearray each; a corrupt local copy read
    into one is detected, never served, given back, and healed from the good copy."""
    cs = 2 * MiB
    opts = {"chunk_size": cs, "memory_budget": 8 * cs}
    local = LocalTier(TierConfig("l", "local", tmp_path / "l"))
    local.open()
    remote = MemoryTier("r", kind="remote")
    data = os.urandom(3 * cs)
    async with make_fs(tmp_path, [local, remote], **opts) as fs:
        await write_file(fs, b"f", data, step=MiB)
        await wait_backlog_empty(fs)
    on_disk = sorted((tmp_path / "l" / "chunks").glob("*/*"))
    assert len(on_disk) == 3
    victim = on_disk[0]
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0x40  # one bit of the payload
    victim.write_bytes(bytes(raw))
    async with make_fs(tmp_path, [local, remote], **opts) as fs:
        assert await read_file(fs, b"f") == data  # the damaged chunk came from the remote
        assert fs.store.stats.get("integrity_failures") == 1
        # Every local read went into a pool buffer (the damaged one's was given back).
        assert store_of(fs).frames.made + store_of(fs).frames.reused >= 3
        await wait_for(lambda: fs.store.stats.get("heals") >= 1)
        frame.verify(victim.read_bytes(), bytes.fromhex(victim.name))  # healed on disk


async def test_buffers_of_chunks_leaving_the_cache_together_are_reused(tmp_path: Path) -> None:
    """Several chunks leaving the read cache at once (several readers' files ending
    together) give back more receive buffers than the pool keeps for the GETs in flight:
    while the cache has room for them they are held, and the next local reads land in them
    (no new buffers mapped), the bytes verified as ever."""
    cs = 2 * MiB
    local = LocalTier(TierConfig("l", "local", tmp_path / "l"))
    local.open()
    first = [os.urandom(cs) for _ in range(10)]
    second = [os.urandom(cs) for _ in range(10)]
    async with make_fs(tmp_path, [local], chunk_size=cs, memory_budget=64 * cs,
                       io_threads=2) as fs:
        for i, data in enumerate(first + second):
            await write_file(fs, f"f{i}".encode(), data, step=MiB)
    async with make_fs(tmp_path, [local], chunk_size=cs, memory_budget=64 * cs,
                       io_threads=2) as fs:
        store = store_of(fs)
        assert store.frames.keep < len(first)
        for i, data in enumerate(first):
            assert await read_file(fs, f"f{i}".encode()) == data
        made = store.frames.made
        assert made >= len(first) - 1  # one buffer per chunk cached (a few reused at most)
        for digest in list(store.cache.entries):  # every chunk leaves the cache at once
            store.cache.uncache(digest)
        assert store.frames.idle == made
        for i, data in enumerate(second, start=len(first)):
            assert await read_file(fs, f"f{i}".encode()) == data
        assert store.frames.made == made  # all ten read into the buffers given back


class BuggyPuts(MemoryTier):
    """A local tier whose puts raise an unexpected exception (a bug, not a TierError)
    once ``buggy`` is set."""

    buggy = False

    def put(self, key: str, parts: Sequence[frame.Buffer],
            expected_sha256: str | None = None) -> int:
        if self.buggy:
            raise ValueError("an unexpected bug in a put")
        return super().put(key, parts, expected_sha256)


@pytest.mark.allow_log_errors
@pytest.mark.allow_log_warnings("corrupt; healing it")
async def test_a_heal_that_fails_unexpectedly_leaves_the_daemon_serving(tmp_path: Path) -> None:
    # A heal runs in the mount's nursery: an exception escaping it would end the daemon.
    local, remote = BuggyPuts("l"), MemoryTier("r", kind="remote")
    data = os.urandom(2 * CS)
    await saved_and_uploaded(tmp_path, [local, remote], data)
    flip_last_byte(local, sorted(local.frames)[0])
    local.buggy = True
    async with make_fs(tmp_path, [local, remote]) as fs:
        assert await read_file(fs, b"f") == data  # the damaged chunk came from the remote
        await wait_for(lambda: fs.store.stats.get("heal_failures") >= 1)
        store_of(fs).cache.entries.clear()
        assert await read_file(fs, b"f") == data  # still serving, still verified
