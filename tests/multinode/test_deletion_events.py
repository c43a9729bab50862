"""The deletion queue's events across nodes (catalog/deletion_events.py): two real
catalogs on one PostgreSQL (nodes a and b), real local tiers and a real S3 tier on
SeaweedFS. What one node's transaction changes in the queue wakes the other node's
listener at the commit, so its uploader and its deleter wait for no timer:

* node a's claim of a remote deletion ends: node b's upload job held by it runs at once
  (before, b looked again every 2 s);
* node b queues a deletion of a frame on node a's local tier: a's deleter deletes it at
  once (before, it looked every 2 s), and b's settle on that row returns when a's
  deletion ended;
* a NOTIFY sent while a's listener was disconnected (a PostgreSQL restart) is not lost:
  the reconnection makes the deleter read the queue again.
"""

from __future__ import annotations

import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import trio

from tests.support.catalog_conformance import lease_end
from tests.support.pgserver import PgServer

from ckptfs.catalog import PostgresCatalog, SqliteCatalog
from ckptfs.catalog.deletion_events import Listener
from ckptfs.catalog.pglisten import PgListener
from ckptfs.catalog.rows import ROOT_INODE, ChunkRef
from ckptfs.catalog.sql import SqlCatalog
from ckptfs.chunks.guard import ChunkGuard
from ckptfs.chunks.room import Room
from ckptfs.chunks.store import stats_for
from ckptfs.codec import frame
from ckptfs.config import TierConfig, UploadConfig
from ckptfs.errors import TransientTierError
from ckptfs.testing.tiers import FaultyTier
from ckptfs.tiers.base import Tier
from ckptfs.tiers.local import LocalTier
from ckptfs.tiers.s3 import S3Tier
from ckptfs.upload.deleter import Deleter
from ckptfs.upload.uploader import Uploader

R = ROOT_INODE
F = stat.S_IFREG | 0o644
BODY = b"bytes held on one node, wanted by another" * 100
X = frame.digest_of(BODY)
CHUNK = 1 << 20
# No timed assertions: nothing but the event can act within these tests' bounds (no
# period is left; the only deadline, a claim's lease end, is 10 minutes away).


@pytest.fixture
def bucket(s3_tier_factory: Callable[..., S3Tier]) -> S3Tier:
    return s3_tier_factory(name="remote0")


def local_tier(tmp_path: Path, name: str) -> LocalTier:
    tier = LocalTier(TierConfig(name, "local", tmp_path / name, create=True))
    tier.open()
    return tier


def commit_x(c: SqlCatalog, name: bytes, tiers: tuple[str, ...],
             uploads: dict[bytes, list[str]] | None = None) -> int:
    f = c.create(R, name, F, 0, 0)
    c.commit_file(f.ino, len(BODY), 1, 1, CHUNK, {0: ChunkRef(X, len(BODY), tiers)},
                  uploads=uploads)
    return f.ino


def drop(c: SqlCatalog, name: bytes, ino: int) -> dict[bytes, list[str]]:
    """The node unlinks the file and collects its chunk (the deletion rows it queues)."""
    c.unlink(R, name)
    assert c.delete_inode(ino) == [X]
    return c.drop_unreferenced([X])


def in_thread(fn: Callable[[], bool]) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except Exception as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


@pytest.fixture
def listeners() -> Iterator[list[Listener]]:
    made: list[Listener] = []
    yield made
    for listener in made:
        listener.close()


def test_one_node_has_nothing_to_hear(tmp_path: Path) -> None:
    """SQLite: no other node, no listener (the deleter and the uploader are kicked in
    the process); the queue's transactions send nothing."""
    c = SqliteCatalog(tmp_path / "c.sqlite")
    try:
        assert c.listen_deletions() is None and c.listen_held_uploads() is None
        ino = commit_x(c, b"a.bin", ("remote0",))
        assert drop(c, b"a.bin", ino) == {X: ["remote0"]}
        until = lease_end()
        assert c.claim_deletions([(X, "remote0")], until) == [(X, "remote0")]
        c.finish_deletions([(X, "remote0")], until)
        assert c.deletion_keys("remote0") == set()
    finally:
        c.close()


def test_the_end_of_a_claim_wakes_the_held_uploads_listener_of_another_node(
    nodes: tuple[PostgresCatalog, PostgresCatalog], bucket: S3Tier, listeners: list[Listener]
) -> None:
    """Events only: b's listener returns when a's finish_deletions commits, not at a's
    claim; b's held job is due at the lease's end (a deadline should a's node die), not
    at a re-check two seconds on."""
    a, b = nodes
    ino = commit_x(a, b"a.bin", ("remote0",))
    assert drop(a, b"a.bin", ino) == {X: ["remote0"]}
    held = b.listen_held_uploads()
    assert isinstance(held, PgListener)
    listeners.append(held)
    assert held.wait() is True and held.connects == 1  # connected: look now
    until = lease_end()
    assert a.claim_deletions([(X, "remote0")], until) == [(X, "remote0")]
    commit_x(b, b"b.bin", ("b-local",), uploads={X: ["remote0"]})  # a job held by a's claim
    assert b.due_uploads(2**62, 10, set(), ["b-local"]) == []
    assert b.next_upload_due_ns(set(), ["b-local"]) == until
    t, out = in_thread(held.wait)
    t.join(0.5)
    assert t.is_alive() and not out  # a claim is no end: nothing announced
    a.finish_deletions([(X, "remote0")], until)  # NOTIFY at the commit
    t.join(10)
    assert out == [True]
    [job] = b.due_uploads(2**62, 10, set(), ["b-local"])
    assert (job.digest, job.tier) == (X, "remote0")


def test_a_claim_that_ends_with_no_job_held_does_not_wake_uploaders(
    nodes: tuple[PostgresCatalog, PostgresCatalog], listeners: list[Listener]
) -> None:
    """Only a claim some upload job waited for is announced to the uploaders (every
    remote deletion on any node would otherwise wake every node's uploader); the
    deleters hear every end (a settle may wait for it)."""
    a, b = nodes
    ino = commit_x(a, b"a.bin", ("remote0",))
    drop(a, b"a.bin", ino)
    held, queue = b.listen_held_uploads(), b.listen_deletions()
    assert held is not None and queue is not None
    listeners += [held, queue]
    assert held.wait() is True and queue.wait() is True
    until = lease_end()
    assert a.claim_deletions([(X, "remote0")], until) == [(X, "remote0")]
    t_held, out_held = in_thread(held.wait)
    t_queue, out_queue = in_thread(queue.wait)
    a.finish_deletions([(X, "remote0")], until)
    t_queue.join(10)
    assert out_queue == [True]
    t_held.join(0.5)
    assert t_held.is_alive() and not out_held


async def test_node_b_upload_held_by_node_a_claim_runs_when_the_claim_ends(
    nodes: tuple[PostgresCatalog, PostgresCatalog], bucket: S3Tier, tmp_path: Path,
    listeners: list[Listener],
) -> None:
    """Node b's real Uploader, its job of X held by a's claim: a's finish wakes it, and
    the upload is recorded well within the old 2 s re-check, counted from the finish
    right after b's last pass (the old poll would have woken it ~2 s after that pass)."""
    a, b = nodes
    b_local = local_tier(tmp_path, "b-local")
    b_local.put(X.hex(), frame.encode([BODY], X))
    ino = commit_x(a, b"a.bin", ("remote0",))
    drop(a, b"a.bin", ino)
    until = lease_end()
    assert a.claim_deletions([(X, "remote0")], until) == [(X, "remote0")]
    b_ino = commit_x(b, b"b.bin", ("b-local",), uploads={X: ["remote0"]})
    held = b.listen_held_uploads()
    assert isinstance(held, PgListener)
    tiers: list[Tier] = [b_local, bucket]
    uploader = Uploader(b, tiers, trio.CapacityLimiter(2), UploadConfig(during_save="overlap"),
                        guard=ChunkGuard(["b-local"]), stats=stats_for(tiers), room=Room(),
                        held=held)
    async with trio.open_nursery() as n:
        n.start_soon(uploader.run)
        with trio.fail_after(30):
            while held.connects < 1 or not uploader._sleeping:
                await trio.sleep(0.01)  # polling the uploader's start (its listener's LISTEN)
            # One more pass, after the listeners' first wake-ups: the job is held.
            uploader.kick()
            while uploader._sleeping:
                await trio.sleep(0)
            while not uploader._sleeping:
                await trio.sleep(0.01)  # polling for the end of that pass
        assert b.extents(b_ino)[0].tiers == ("b-local",)  # held
        a.finish_deletions([(X, "remote0")], until)
        with trio.fail_after(30):
            while b.extents(b_ino)[0].tiers != ("b-local", "remote0"):
                await uploader._progress.wait()
        n.cancel_scope.cancel()
    assert bucket.get(X.hex()) is not None


@pytest.mark.allow_log_warnings("deleting chunks on tier remote0 failed")
async def test_node_b_upload_held_by_a_delete_in_doubt_runs_when_node_a_ends_the_grace(
    nodes: tuple[PostgresCatalog, PostgresCatalog], bucket: S3Tier, tmp_path: Path,
    listeners: list[Listener],
) -> None:
    """Node a's real Deleter: its DELETE of X fails in doubt, so its claim is kept for the
    grace and node b's real Uploader holds its job of X (the lease's end is b's deadline).
    At the grace's end (a's clock moved there by the test, then a's deadline: a kick) a's
    deleter releases the claim: the NOTIFY wakes b's uploader, which uploads X before b's
    own clock reaches that deadline: the release, not b's deadline, let it go."""
    a, b = nodes
    b_local = local_tier(tmp_path, "b-local")
    b_local.put(X.hex(), frame.encode([BODY], X))
    ino = commit_x(a, b"a.bin", ("remote0",))
    bucket.put(X.hex(), frame.encode([BODY], X))
    drop(a, b"a.bin", ino)
    remote = FaultyTier(bucket)
    remote.delete_error = TransientTierError("delete: read timeout", in_doubt=True)
    shift = [0]
    deleter = Deleter(a, [remote], trio.CapacityLimiter(2), guard=ChunkGuard([]),
                      stats=stats_for([remote]), room=Room(),
                      clock=lambda: time.time_ns() + shift[0])
    pair = (X, "remote0")
    held = b.listen_held_uploads()
    assert isinstance(held, PgListener)
    listeners.append(held)
    tiers: list[Tier] = [b_local, bucket]
    uploader = Uploader(b, tiers, trio.CapacityLimiter(2), UploadConfig(during_save="overlap"),
                        guard=ChunkGuard(["b-local"]), stats=stats_for(tiers), room=Room(),
                        held=held)
    async with trio.open_nursery() as n:
        n.start_soon(deleter.run)
        deleter.kick()
        with trio.fail_after(30):
            while pair not in deleter._graced:
                await deleter._progress.wait()
        lease = deleter._graced[pair]
        assert lease > time.time_ns()  # the grace runs (about 24 s: 2 x (2 s + 10 s))
        b_ino = commit_x(b, b"b.bin", ("b-local",), uploads={X: ["remote0"]})
        assert b.next_upload_due_ns(set(), ["b-local"]) == lease
        n.start_soon(uploader.run)
        with trio.fail_after(30):
            while held.connects < 1 or not uploader._sleeping:
                await trio.sleep(0.01)  # polling the uploader's start (its listener's LISTEN)
            uploader.kick()  # one more pass, after the listener's first wake-up
            while uploader._sleeping:
                await trio.sleep(0)
            while not uploader._sleeping:
                await trio.sleep(0.01)  # polling for the end of that pass
        assert b.extents(b_ino)[0].tiers == ("b-local",)  # held by a's kept claim
        bucket.delete(X.hex())  # a's DELETE lands late, inside the grace
        shift[0] = lease - time.time_ns()  # a's clock reaches the grace's end
        deleter.kick()
        with trio.fail_after(20):
            while b.extents(b_ino)[0].tiers != ("b-local", "remote0"):
                await uploader._progress.wait()
        assert time.time_ns() < lease  # b's own deadline had not come
        n.cancel_scope.cancel()
    assert bucket.get(X.hex()) is not None
    assert deleter.failures == 1 and deleter.deleted == 0


async def test_a_deletion_node_b_queues_on_node_a_local_tier_runs_at_once(
    nodes: tuple[PostgresCatalog, PostgresCatalog], tmp_path: Path,
) -> None:
    """Node b drops a chunk only node a's local tier holds: a's deleter, idle with nothing
    due (no timer at all), hears b's NOTIFY and deletes the frame; b's deleter settling on
    that row returns when a's deletion ended, not at its timeout."""
    a, b = nodes
    a_local, b_local = local_tier(tmp_path, "a-local"), local_tier(tmp_path, "b-local")
    a_local.put(X.hex(), frame.encode([BODY], X))
    ino = commit_x(a, b"shared.bin", ("a-local",))
    a_listener, b_listener = a.listen_deletions(), b.listen_deletions()
    assert isinstance(a_listener, PgListener) and isinstance(b_listener, PgListener)
    a_deleter = Deleter(a, [a_local], trio.CapacityLimiter(2), guard=ChunkGuard(["a-local"]),
                        stats=stats_for([a_local]), room=Room(), listener=a_listener)
    b_deleter = Deleter(b, [b_local], trio.CapacityLimiter(2), guard=ChunkGuard(["b-local"]),
                        stats=stats_for([b_local]), room=Room(), listener=b_listener)
    async with trio.open_nursery() as n:
        n.start_soon(a_deleter.run)
        n.start_soon(b_deleter.run)
        with trio.fail_after(30):
            while a_listener.connects < 1 or b_listener.connects < 1:
                await trio.sleep(0.01)  # polling the listeners' first LISTEN
        assert a.next_deletion_due_ns(set(), ["a-local"]) is None  # nothing to wait for
        assert drop(b, b"shared.bin", ino) == {X: ["a-local"]}  # b's unlink: a's frame
        with trio.fail_after(20):  # b's settle would wait 60 s for the timeout
            await b_deleter.settle([X], 60)
        assert a_deleter.deleted == 1 and b_deleter.deleted == 0
        n.cancel_scope.cancel()
    assert not a_local.has(X.hex())
    assert b.deletions_pending([X]) == set()


class GatedListener:
    """A real listener whose wait after a failure (the reconnection) waits for ``gate``:
    the test sends its NOTIFY while no LISTEN is active."""

    def __init__(self, inner: PgListener) -> None:
        self.inner = inner
        self.gate = threading.Event()
        self.failed = threading.Event()

    def wait(self) -> bool:
        if self.failed.is_set():
            self.gate.wait()
        try:
            return self.inner.wait()
        except Exception:
            self.failed.set()
            raise

    def close(self) -> None:
        self.gate.set()
        self.inner.close()


@pytest.mark.allow_log_warnings("not hearing other nodes' changes of the deletion queue")
async def test_a_notification_sent_while_the_listener_was_away_is_not_lost(
    nodes: tuple[PostgresCatalog, PostgresCatalog], tmp_path: Path, postgres: PgServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PostgreSQL restarts: a's listener loses its LISTEN; b queues a deletion of a's
    frame before a's listener is back (its NOTIFY reaches nobody). The reconnection
    itself makes a's deleter read the queue: the frame is deleted, no timer involved."""
    a, b = nodes
    # The deleter's passes (each ends with this call): it must be idle when PostgreSQL
    # stops, or its pass meets the outage and its retry reads the queue (the right thing,
    # but not what this test is about).
    passes: list[int | None] = []
    due = a.next_deletion_due_ns

    def counted(skip: set[tuple[bytes, str]], tiers: Sequence[str]) -> int | None:
        passes.append(got := due(skip, tiers))
        return got

    monkeypatch.setattr(a, "next_deletion_due_ns", counted)
    a_local = local_tier(tmp_path, "a-local")
    a_local.put(X.hex(), frame.encode([BODY], X))
    ino = commit_x(a, b"shared.bin", ("a-local",))
    inner = a.listen_deletions()
    assert isinstance(inner, PgListener)
    listener = GatedListener(inner)
    deleter = Deleter(a, [a_local], trio.CapacityLimiter(2), guard=ChunkGuard(["a-local"]),
                      stats=stats_for([a_local]), room=Room(), listener=listener)
    async with trio.open_nursery() as n:
        n.start_soon(deleter.run)
        with trio.fail_after(30):
            # The first pass, and the one the first LISTEN asks for; then it waits.
            while inner.connects < 1 or len(passes) < 2 or deleter._wake.is_set():
                await trio.sleep(0.01)  # polling the deleter's start
        assert passes == [None, None]  # nothing due: no deadline, no timer
        await trio.to_thread.run_sync(postgres.stop)
        try:
            await trio.to_thread.run_sync(listener.failed.wait, 30)
            assert listener.failed.is_set()
        finally:
            await trio.to_thread.run_sync(postgres.start)
        progress = deleter._progress
        assert await trio.to_thread.run_sync(drop, b, b"shared.bin", ino) == {X: ["a-local"]}
        assert inner.connects == 1 and not progress.is_set()  # sent to nobody: unheard
        assert a_local.has(X.hex())
        listener.gate.set()  # the listener reconnects: "look now"
        with trio.fail_after(30):
            while deleter.deleted < 1:
                await deleter._progress.wait()
        n.cancel_scope.cancel()
    assert inner.connects == 2
    assert not a_local.has(X.hex())
