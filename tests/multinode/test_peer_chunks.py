"""Reads on one node of chunks another node committed but has not uploaded yet: two
daemons (without FUSE) on one real PostgreSQL catalog, each with its own local tier, one
shared in-memory bucket; and two real mounts with a real SeaweedFS. The read waits up to
peer_chunk_wait for the other node's upload (once per holder, not per chunk), then fails
with EIO naming that node; at once if that node's session has ended. Never wrong bytes."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.conftest import CkptFactory
from tests.multinode.conftest import Cluster
from tests.support.daemons import build_daemon
from tests.support.freeze import freeze
from tests.support.mountutil import wait_until
from tests.support.s3server import SeaweedServer
from tests.vfs.test_vfs import CS, read_file, write_file

from ckptfs.catalog import PostgresCatalog
from ckptfs.config import ReadConfig
from ckptfs.daemon.build import Daemon, Wakeups
from ckptfs.daemon.services import running
from ckptfs.errors import CkptfsError
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
    wakeups = Wakeups()
    cat = PostgresCatalog(url, pool_size=2, hooks=wakeups.catalog_hooks())
    options: dict[str, Any] = {"chunk_size": CS, "memory_budget": 8 * CS, "io_threads": 2}
    session = NodeSession(cat, tiers[0].name.split(":", 1)[0], session_timeout_s)
    reads = ReadConfig(peer_wait_s=peer_wait_s)
    if readahead is not None:
        reads = ReadConfig(peer_wait_s=peer_wait_s, readahead=readahead)
    try:
        await trio.to_thread.run_sync(session.register)
        daemon = build_daemon(cat, tiers, wakeups, session=session, reads=reads, **options)
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


# -- real mounts: node a killed with its chunks on its own tiers only ------------------------

READER = """
import errno, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
try:
    while os.read(fd, 1 << 20):
        pass
except OSError as exc:
    print(errno.errorcode[exc.errno])
else:
    print("read")
"""


@pytest.mark.slow
@pytest.mark.usefixtures("postgres")
@pytest.mark.allow_log_errors("is only on node a")
@pytest.mark.allow_log_warnings()  # the frozen bucket's uploads and snapshots; b's cleanup
def test_a_read_on_a_mount_fails_at_once_for_a_killed_node(
    ckpt_factory: CkptFactory, pg_url: str, own_seaweed: SeaweedServer, tmp_path: Path,
) -> None:
    """Issue 33, item 7, as reported: a 32 MiB file whose chunks only the killed node a
    held (the bucket hung while a saved) took node b 60 s to fail, a peer_chunk_wait per
    chunk, although a's session had expired long before. peer_chunk_wait is 300 s here:
    the read must fail with EIO because a's session has ended, not at a deadline."""
    url = f"s3://{own_seaweed.bucket}/pc-{uuid.uuid4().hex[:10]}?endpoint={own_seaweed.endpoint}"
    conf = tmp_path / "node.toml"
    conf.write_text("session_timeout = 2\npeer_chunk_wait = 300\n")
    cluster = Cluster(ckpt_factory, pg_url, url)
    a = cluster.node("a", "--config", str(conf))
    b = cluster.node("b", "--config", str(conf))
    assert own_seaweed.proc is not None
    freeze(own_seaweed.proc.pid)  # a's uploads cannot finish
    try:
        (a.mountpoint / "big.bin").write_bytes(os.urandom(32 << 20))
        a.kill9()
        cat = PostgresCatalog(pg_url, pool_size=1, readonly=True)
        try:
            wait_until(lambda: not any(s.live for s in cat.sessions() if s.node == "a"),
                       timeout=30, what="a's session expired")
        finally:
            cat.close()
        # Only a hang (a wait for the dead node) reaches this bound.
        res = subprocess.run([sys.executable, "-c", READER, str(b.mountpoint / "big.bin")],
                             capture_output=True, text=True, timeout=120)
        assert res.stdout.strip() == "EIO", res.stdout + res.stderr
        assert "only on node a" in b.log and "session has ended" in b.log
    finally:
        os.kill(own_seaweed.proc.pid, signal.SIGCONT)
