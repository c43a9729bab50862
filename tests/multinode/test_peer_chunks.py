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
from ckptfs.session import NodeSession
from ckptfs.testing.tiers import FaultyTier, MemoryTier
from ckptfs.tiers.base import Tier


@asynccontextmanager
async def node(
    url: str, tiers: list[Tier], peer_wait_s: float, *, session_timeout_s: float = 30.0,
    crash: bool = False, readahead: int | None = None,
) -> AsyncIterator[Daemon]:
    """A daemon of node NAME (its tiers are named ``NAME:...``) with its session, as a
    mount has one; ``crash``: it stops as kill -9 would (its session is left to expire)."""
    cat = PostgresCatalog(url, pool_size=2)
    options: dict[str, Any] = {"chunk_size": CS, "memory_budget": 8 * CS, "io_threads": 2}
    session = NodeSession(cat, tiers[0].name.split(":", 1)[0], session_timeout_s)
    reads = ReadConfig(peer_wait_s=peer_wait_s)
    if readahead is not None:
        reads = ReadConfig(peer_wait_s=peer_wait_s, readahead=readahead)
    try:
        await trio.to_thread.run_sync(session.register)
        daemon = build(cat, tiers, shared=True, catalog_slots=cat.concurrency, session=session,
                       reads=reads, **options)
        async with running(daemon, drain=False):
            yield daemon
    finally:
        if not crash:
            await trio.to_thread.run_sync(session.close_blocking)
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


async def read_error(fs: Any, name: bytes) -> CkptfsError:
    with pytest.raises(CkptfsError) as info:
        await read_file(fs, name)
    assert info.value.errno == errno.EIO
    return info.value


@pytest.mark.allow_log_errors("is only on node a")
@pytest.mark.allow_log_warnings("session expired")
async def test_a_read_fails_at_once_once_the_holders_session_has_ended(
    pg_url: str, tmp_path: Path
) -> None:
    """Issue 33, item 7: node b waited peer_chunk_wait for each chunk only the killed
    node a held, though a's session had expired long before: nothing would upload them."""
    bucket = MemoryTier("r", kind="remote")
    data = os.urandom(4 * CS)
    async with node(pg_url, [MemoryTier("b:l"), bucket], 600) as b:
        # Node a has no remote tier: its chunks are on its own local tier only.
        async with node(pg_url, [MemoryTier("a:l")], 30, session_timeout_s=1.0,
                        crash=True) as a:
            await write_file(a.fs, b"f", data)
        # Node a is gone (its daemon stopped as a crash does): its session expires.
        while any(r.node == "a" and r.live
                  for r in await trio.to_thread.run_sync(b.catalog.sessions)):
            await trio.sleep(0.1)  # polling a condition (the session's expiry)
        # peer_chunk_wait is 600 s: only a hang reaches this bound.
        with trio.fail_after(120):
            err = await read_error(b.fs, b"f")
        assert "only on node a" in str(err) and "session has ended" in str(err), err
        assert not bucket.frames


@pytest.mark.allow_log_errors("is only on node a")
async def test_a_read_waits_once_for_a_node_that_uploads_nothing_not_once_per_chunk(
    pg_url: str, tmp_path: Path
) -> None:
    """Issue 33, item 7: with the holder alive but uploading nothing, the first chunk's
    read waits peer_chunk_wait; the file's next chunks fail at once, not after a wait each."""
    bucket = MemoryTier("r", kind="remote")
    # Node a has no remote tier: its chunks stay on its own local tier.
    async with node(pg_url, [MemoryTier("a:l")], 30) as a, \
            node(pg_url, [MemoryTier("b:l"), bucket], 0.5, readahead=0) as b:
        # No readahead: each chunk is fetched by the read that asks for it.
        await write_file(a.fs, b"f", os.urandom(4 * CS))
        inode = await b.fs.lookup(1, b"f")
        fh = await b.fs.open(inode.ino, os.O_RDONLY)
        try:
            with pytest.raises(CkptfsError) as first:
                await b.fs.read(fh, 0, CS)  # the first chunk: one wait
            assert "not uploaded within 0.5 s" in str(first.value)
            for i in (1, 2, 3):  # every next chunk of the file: no wait of its own
                with pytest.raises(CkptfsError) as nxt:
                    await b.fs.read(fh, i * CS, CS)
                assert nxt.value.errno == errno.EIO
                assert "only on node a" in str(nxt.value), nxt.value
                assert "not waiting again" in str(nxt.value), nxt.value
        finally:
            await b.fs.release(fh)
