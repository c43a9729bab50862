"""Reads on one node of chunks another node committed but has not uploaded yet: two
daemons (without FUSE) on one real PostgreSQL catalog, each with its own local tier, one
shared in-memory bucket. The read waits up to peer_chunk_wait for the other node's upload,
then fails with EIO naming that node; never wrong bytes."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.vfs.test_vfs import CS, read_file, write_file

from ckptfs.catalog import PostgresCatalog
from ckptfs.config import ReadConfig
from ckptfs.errors import CkptfsError
from ckptfs.mount import Daemon, build, running
from ckptfs.testing.tiers import FaultyTier, MemoryTier
from ckptfs.tiers.base import Tier


@asynccontextmanager
async def node(url: str, tiers: list[Tier], peer_wait_s: float) -> AsyncIterator[Daemon]:
    cat = PostgresCatalog(url, pool_size=2)
    options: dict[str, Any] = {"chunk_size": CS, "memory_budget": 8 * CS, "io_threads": 2}
    try:
        daemon = build(cat, tiers, shared=True, catalog_slots=cat.concurrency,
                       reads=ReadConfig(peer_wait_s=peer_wait_s), **options)
        async with running(daemon, drain=False):
            yield daemon
    finally:
        cat.close()


def held_bucket(bucket: MemoryTier) -> tuple[FaultyTier, threading.Event]:
    """Node a's view of the bucket, with its puts held until the gate opens."""
    gate = threading.Event()
    held = FaultyTier(bucket)
    held.put_gate = gate
    return held, gate


async def test_a_read_waits_for_the_other_nodes_upload(pg_url: str, tmp_path: Path) -> None:
    bucket = MemoryTier("r", kind="remote")
    a_remote, gate = held_bucket(bucket)
    data = os.urandom(2 * CS + 17)
    try:
        async with node(pg_url, [MemoryTier("a:l"), a_remote], 30) as a, \
                node(pg_url, [MemoryTier("b:l"), bucket], 30) as b:
            await write_file(a.fs, b"f", data)
            with trio.fail_after(10):
                await trio.to_thread.run_sync(a_remote.put_entered.wait)  # its upload is held
            got: list[bytes] = []

            async def reader() -> None:
                got.append(await read_file(b.fs, b"f"))

            async with trio.open_nursery() as n:
                n.start_soon(reader)
                await trio.sleep(0)  # let it start: it cannot finish, the only copy is on a
                assert not got and not bucket.frames
                gate.set()  # node a's uploads go ahead
            assert got == [data]
            assert bucket.frames  # read from the bucket: nothing was on b's own tier
    finally:
        gate.set()


@pytest.mark.allow_log_errors("is only on node a")
async def test_without_an_upload_the_read_fails_with_eio_naming_the_node(
    pg_url: str, tmp_path: Path
) -> None:
    bucket = MemoryTier("r", kind="remote")
    # Node a has no remote tier: its chunks stay on its own local tier.
    async with node(pg_url, [MemoryTier("a:l")], 30) as a, \
            node(pg_url, [MemoryTier("b:l"), bucket], 0.3) as b:
        await write_file(a.fs, b"f", os.urandom(CS))
        with pytest.raises(CkptfsError) as info:
            with trio.fail_after(20):
                await read_file(b.fs, b"f")
        assert info.value.errno == errno.EIO
        assert "only on node a" in str(info.value) and "a:l" in str(info.value)
