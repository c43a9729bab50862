"""A chunk another node waits for goes to the head of its holder's upload queue (issue 14;
docs/multinode.md "Reads of another node's chunks"): real mounts of two nodes on one real
PostgreSQL catalog and one real SeaweedFS bucket; and the same with two daemons without
FUSE on one real PostgreSQL and an in-memory bucket (quicker, the same assertions).

Node a holds its uploads back (``upload_during_save = "defer"``, one upload at a time, and a
save running: a file open for writing with a chunk buffer in memory), then writes several
files; its own order would upload the oldest first, and none before the save ends (or 30 s
into it). Node b reads the file written last: a's uploader hears b's want (NOTIFY) and
uploads that file's chunks at once, before every older job and despite the deferral. The
proof is what the bucket holds when b's read returns: all of the last file's chunks and none
of the older files'."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from tests.multinode.conftest import Cluster, Db
from tests.support.daemons import build_daemon
from tests.support.mountutil import wait_until
from tests.support.s3server import SeaweedServer
from tests.vfs.test_vfs import CS, RW, read_file, write_file

from ckptfs.catalog import ROOT_INODE, PostgresCatalog
from ckptfs.config import ReadConfig, UploadConfig
from ckptfs.daemon.build import Daemon, Wakeups
from ckptfs.daemon.services import running
from ckptfs.session import NodeSession
from ckptfs.testing.tiers import MemoryTier
from ckptfs.tiers.base import Tier
from ckptfs.vfs.context import ROOT

pytestmark = pytest.mark.usefixtures("postgres")

CHUNK = 256 * 1024  # TEST_MOUNT_ARGS' chunk size




def config(tmp_path: Path, name: str, text: str) -> list[str]:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return ["--config", str(path)]


def on_bucket(seaweed: SeaweedServer, prefix: str) -> set[str]:
    """The chunk digests (hex) under the test's prefix of the bucket, listed now."""
    client = seaweed.client()
    try:
        keys: set[str] = set()
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=seaweed.bucket, Prefix=f"{prefix}/chunks/")
        for page in pages:
            keys |= {str(o["Key"]).rsplit("/", 1)[-1] for o in page.get("Contents") or ()}
        return keys
    finally:
        client.close()


def digests_of(cat: PostgresCatalog, path: Path) -> set[str]:
    return {r.digest.hex() for r in cat.extents(os.stat(path).st_ino).values()}


@pytest.mark.slow
def test_a_chunk_another_node_reads_is_uploaded_before_older_jobs(
    cluster: Cluster, db: Db, seaweed: SeaweedServer, remote: tuple[str, str], tmp_path: Path,
) -> None:
    held = 'upload_during_save = "defer"\nupload_concurrency = 1\n'
    a = cluster.node("a", *config(tmp_path, "a", held))
    # Long enough for any expedited upload; shorter than a's 30 s of deferral, so that
    # without the expedite the read fails (EIO) instead of outwaiting the save.
    b = cluster.node("b", *config(tmp_path, "b", "peer_chunk_wait = 20\n"))
    prefix = remote[1]
    (a.mountpoint / "run").mkdir()
    # The save: a chunk buffer in a's memory while this stays open (no writeback cache:
    # the write reached the daemon when it returned).
    save = os.open(a.mountpoint / "run" / "save.part", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(save, b"s" * 4096)
        files = [a.mountpoint / "run" / f"shard{i}.bin" for i in range(4)]
        contents = [os.urandom(3 * CHUNK + 1000 * (i + 1)) for i in range(len(files))]
        for path, data in zip(files, contents, strict=True):
            path.write_bytes(data)  # committed at close: its uploads queue behind the save
        cat = db()
        chunks = [digests_of(cat, p) for p in files]
        assert all(len(c) == 4 for c in chunks) and len(set().union(*chunks)) == 16
        assert not on_bucket(seaweed, prefix) & set().union(*chunks)  # a holds them back
        last = b.mountpoint / "run" / files[-1].name
        wait_until(last.exists, 5, "b sees the last file")

        assert last.read_bytes() == contents[-1]  # b waited for a's upload of its chunks

        there = on_bucket(seaweed, prefix)
        assert chunks[-1] <= there  # the file b read: every chunk uploaded ...
        assert not there & set().union(*chunks[:-1])  # ... and nothing of the older files
        assert cat.chunk_wants() == []  # b's read ended: its wants are gone
    finally:
        os.close(save)
    # The save ended: a uploads the rest in its own order.
    wait_until(lambda: set().union(*chunks) <= on_bucket(seaweed, prefix), 60,
               "a uploads the older files after the save")


@asynccontextmanager
async def daemon(url: str, tiers: list[Tier], upload: UploadConfig = UploadConfig(),
                 peer_wait_s: float = 30) -> AsyncIterator[Daemon]:
    wakeups = Wakeups()
    cat = PostgresCatalog(url, pool_size=2, hooks=wakeups.catalog_hooks())
    # Its session, as a mount has one (a reader waits only for a node that has a live one).
    session = NodeSession(cat, tiers[0].name.split(":", 1)[0], 30)
    try:
        await trio.to_thread.run_sync(session.register)
        d = build_daemon(cat, tiers, wakeups, chunk_size=CS, memory_budget=16 * CS,
                         io_threads=2, upload=upload, session=session,
                         reads=ReadConfig(peer_wait_s=peer_wait_s))
        async with running(d, drain=False):
            yield d
    finally:
        await trio.to_thread.run_sync(session.close_blocking)
        cat.close()


async def test_without_fuse_the_wanted_chunks_are_uploaded_first(pg_url: str) -> None:
    bucket = MemoryTier("r", kind="remote")
    held = UploadConfig(concurrency=1, during_save="defer")
    async with daemon(pg_url, [MemoryTier("a:l"), bucket], held) as a, \
            daemon(pg_url, [MemoryTier("b:l"), bucket], peer_wait_s=10) as b:
        save, _ = await a.fs.create(ROOT_INODE, b"save.part", 0o644, RW, ROOT)
        await a.fs.write(save, 0, b"s" * 4096)  # a save runs on a: its uploads wait
        assert a.uploader.saving()
        contents = [os.urandom(3 * CS + 100 * (i + 1)) for i in range(4)]
        chunks = []
        for i, data in enumerate(contents):
            ino = await write_file(a.fs, f"shard{i}".encode(), data)
            chunks.append({r.digest.hex() for r in a.catalog.extents(ino).values()})
        assert all(len(c) == 4 for c in chunks) and not bucket.frames
        with trio.fail_after(30):
            assert await read_file(b.fs, b"shard3") == contents[-1]
        assert chunks[-1] <= set(bucket.frames)  # the file b read: uploaded first ...
        assert not set(bucket.frames) & set().union(*chunks[:-1])  # ... the older ones wait
        assert a.catalog.chunk_wants() == []
        await a.fs.flush(save)
        await a.fs.release(save)
        with trio.fail_after(30):
            while not set().union(*chunks) <= set(bucket.frames):
                await a.uploader._progress.wait()  # the save ended: the rest in a's order
