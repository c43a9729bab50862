"""Two nodes, one chunk, one of them out of local room: node a's local tier is full, so
its writer's *uncommitted* chunk X goes to the remote (ChunkStore._spill: the PUT, then
the local frame dropped), while node b deletes the object of the same digest there (b
dropped its own copy of the same bytes). Two real catalogs on one PostgreSQL, a real S3
tier on SeaweedFS, node a's real store and uploader (the move) and commit
(chunks/commit.py); the move rounds and b's deletion steps (Deleter._remote_one's catalog
and tier calls, or b's real Deleter) are driven by hand in the bad orders, with no sleep.

What every order must reach: after a's commit, X is in the bucket, bit-identical, and no
record of the move is left; a chunk a drops uncommitted has its moved object deleted."""

from __future__ import annotations

import stat
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
import trio

from tests.support.catalog_conformance import lease_end

from ckptfs.catalog import PostgresCatalog
from ckptfs.catalog.rows import ROOT_INODE, ChunkRef
from ckptfs.chunks.commit import FileVersion
from ckptfs.chunks.guard import ChunkGuard
from ckptfs.chunks.room import Room
from ckptfs.chunks.store import ChunkStore, SharedState, StorePolicy, stats_for
from ckptfs.codec import frame
from ckptfs.testing.tiers import FaultyTier, MemoryTier
from ckptfs.tiers.base import Tier
from ckptfs.tiers.s3 import S3Tier
from ckptfs.upload.deleter import Deleter
from ckptfs.upload.uploader import Uploader

R = ROOT_INODE
F = stat.S_IFREG | 0o644
BODY = b"the same bytes on two nodes, one of them full" * 100
X = frame.digest_of_parts([BODY])
KEY = X.hex()
CHUNK = 1 << 20
REMOTE = "remote0"


@pytest.fixture
def bucket(s3_tier_factory: Callable[..., S3Tier]) -> S3Tier:
    return s3_tier_factory(name=REMOTE)


def in_bucket(bucket: S3Tier) -> bytes | None:
    """X's bytes as the bucket serves them (verified), or None if the object is gone."""
    raw = bucket.get(KEY)
    return None if raw is None else bytes(frame.decode_view(raw, X))


@dataclass
class NodeA:
    """Node a's store (its local tier full after X) on catalog a."""

    catalog: PostgresCatalog
    store: ChunkStore
    local: MemoryTier

    async def write_x(self) -> ChunkRef:
        ref = await self.store.write([BODY])
        assert ref.tiers == ("a:l",)
        return ref

    async def move_round(self) -> None:
        """One round of moves, as a writer waiting for room starts it (_make_room)."""
        store = self.store
        picked, _ = store.guard.start_moves(
            1 << 40, frame.HEADER_SIZE, lambda d: store.tier_set.remote_targets(d, 1), True)
        await store.writer._spill(picked)

    async def commit(self, ref: ChunkRef, name: bytes = b"a.bin") -> int:
        """The writer's close: its commit (the chunk where the store has it now)."""
        f = await trio.to_thread.run_sync(self.catalog.create, R, name, F, 0, 0)
        v = FileVersion(f.ino, len(BODY), 5, 5, CHUNK, {}, {0: ref}, [ref])
        assert await self.store.commit(v, synced=False) is not None
        await self.store.moves.end_now()
        return f.ino

    async def drop(self, ref: ChunkRef) -> None:
        """The writer's changes dropped uncommitted (vfs/openfile.py's discard)."""
        await self.store.collect(self.store.release([ref]))
        await self.store.moves.end_now()


@asynccontextmanager
async def node_a(catalog: PostgresCatalog, remote: Tier) -> AsyncIterator[NodeA]:
    local = MemoryTier("a:l", capacity=len(BODY) + frame.HEADER_SIZE)  # X fills it
    tiers: list[Tier] = [local, remote]
    guard, stats, room = ChunkGuard(["a:l"]), stats_for(tiers), Room()
    limiter = trio.CapacityLimiter(4)
    uploader = Uploader(catalog, tiers, limiter, guard=guard, stats=stats, room=room)
    store = ChunkStore(tiers, catalog, limiter, StorePolicy(io_threads=2, cache_bytes=8 * CHUNK),
                       shared=SharedState(guard=guard, stats=stats, room=room),
                       spill_copy=uploader.copy_uncommitted, node="a")
    async with trio.open_nursery() as n:
        store.attach(n)
        yield NodeA(catalog, store, local)
        n.cancel_scope.cancel()


def b_drops_x(b: PostgresCatalog, bucket: S3Tier) -> None:
    """Node b wrote the same bytes (uploaded: a valid replica on the remote), then
    unlinked its only file: the object is in b's deletion queue."""
    f = b.create(R, b"b.bin", F, 0, 0)
    bucket.put(KEY, frame.encode([BODY], X))
    b.commit_file(f.ino, len(BODY), 1, 1, CHUNK, {0: ChunkRef(X, len(BODY), (REMOTE,))})
    b.unlink(R, b"b.bin")
    assert b.delete_inode(f.ino) == [X]
    assert b.drop_unreferenced([X]) == {X: [REMOTE]}


def b_deleter(b: PostgresCatalog, remote: Tier) -> Deleter:
    return Deleter(b, [remote], trio.CapacityLimiter(2), guard=ChunkGuard([]),
                   stats=stats_for([remote]), room=Room(), listener=b.listen_deletions())


def assert_committed_and_readable(a: NodeA, b: PostgresCatalog, bucket: S3Tier, ino: int) -> None:
    [tiers] = [r.tiers for r in b.extents(ino).values()]
    assert tiers == (REMOTE,)  # moved: recorded on the remote only, no local copy
    assert in_bucket(bucket) == BODY, "a committed X on the remote, its object is gone"
    assert a.catalog.chunk_moves() == []  # committed: the replica row protects it now
    assert not b.deletion_keys(REMOTE)


async def test_a_deletion_claimed_before_the_move_is_done_before_its_put(
    nodes: tuple[PostgresCatalog, PostgresCatalog], bucket: S3Tier
) -> None:
    """b claims its deletion of (X, remote0); a's writer needs room and moves X while the
    DELETE is in flight; the DELETE lands; a commits. A PUT made during the claim would
    be the one deleted: the move must wait for the claim's end and PUT after it."""
    a_cat, b = nodes
    b_drops_x(b, bucket)
    assert b.claim_deletions([(X, REMOTE)], lease_end()) == [(X, REMOTE)]  # b's deleter, step 1
    async with node_a(a_cat, bucket) as a:
        ref = await a.write_x()
        await a.move_round()  # a's writer needs room while b's DELETE is in flight
        bucket.delete(KEY)  # b's DELETE lands
        b.finish_deletions([(X, REMOTE)])
        await a.move_round()  # the writer still waits for room: the next round
        ino = await a.commit(ref)
        assert_committed_and_readable(a, b, bucket, ino)
        assert KEY not in a.local.frames  # the move made its room
        assert a.store.spilled_bytes > 0


async def test_a_move_held_by_a_claim_keeps_its_local_frame_until_the_claim_ends(
    nodes: tuple[PostgresCatalog, PostgresCatalog], bucket: S3Tier
) -> None:
    """The round during b's claim puts nothing: X stays local (served from there) and the
    writer is told to look again soon (a claim ends in seconds), not at the failed
    move's backoff."""
    a_cat, b = nodes
    b_drops_x(b, bucket)
    assert b.claim_deletions([(X, REMOTE)], lease_end()) == [(X, REMOTE)]
    async with node_a(a_cat, bucket) as a:
        ref = await a.write_x()
        bucket.delete(KEY)  # b's DELETE landed (its row is still claimed)
        await a.move_round()
        assert a.store.guard.current(X) == ("a:l",) and KEY in a.local.frames
        assert in_bucket(bucket) is None and a_cat.chunk_moves() == []
        assert await a.store.read(a.store.pins.current(ref)) == BODY
        b.finish_deletions([(X, REMOTE)])
        await a.move_round()
        assert a.store.guard.current(X) == (REMOTE,) and KEY not in a.local.frames
        assert a_cat.chunk_moves() == [(X, REMOTE, "a")]
        ino = await a.commit(ref)
        assert_committed_and_readable(a, b, bucket, ino)


async def wait_for(predicate: Callable[[], bool], timeout: float = 30) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)  # polling a condition, with a deadline


@pytest.mark.allow_log_warnings("local tiers full; writers wait", "local tiers have room again")
async def test_a_writer_waiting_for_room_moves_its_chunk_once_the_claim_ends(
    nodes: tuple[PostgresCatalog, PostgresCatalog], bucket: S3Tier
) -> None:
    """The whole path: a's writer writes X (the local tier is full then) and another
    chunk, which needs room: its store moves X, held by b's claim; the writer waits (it is
    not refused) and goes on once b's DELETE is done: its claim's end is heard (a NOTIFY
    through a's deleter), with no period that would retry the move."""
    a_cat, b = nodes
    b_drops_x(b, bucket)
    assert b.claim_deletions([(X, REMOTE)], lease_end()) == [(X, REMOTE)]
    other = b"another chunk of a's file" * 100
    async with node_a(a_cat, bucket) as a:
        ref = await a.write_x()
        done: list[ChunkRef] = []

        async def write_other() -> None:
            done.append(await a.store.write([other]))

        # a's deleter (its local tier only: it takes none of b's rows) hears b's claim end.
        hearing = Deleter(a_cat, [a.local], trio.CapacityLimiter(2), guard=a.store.guard,
                          stats=a.store.stats, room=a.store.room,
                          listener=a_cat.listen_deletions())
        async with trio.open_nursery() as n:
            n.start_soon(hearing.run)
            n.start_soon(write_other)
            await wait_for(lambda: a.store.stats.get("moves_held") > 0)
            await wait_for(lambda: a.store.waiting_for_room == 1)  # the writer waits
            assert not done and KEY in a.local.frames  # X was not moved during the claim
            bucket.delete(KEY)  # b's DELETE lands
            b.finish_deletions([(X, REMOTE)])  # its NOTIFY: no timer would start the move
            with trio.fail_after(10):
                await wait_for(lambda: bool(done))
            n.cancel_scope.cancel()
        assert a.store.guard.current(X) == (REMOTE,)
        ino = await a.commit(ref)
        assert_committed_and_readable(a, b, bucket, ino)
        a.store.release(done)


async def test_a_deletion_claimed_after_the_move_is_cancelled(
    nodes: tuple[PostgresCatalog, PostgresCatalog], bucket: S3Tier
) -> None:
    """a moves X (the object is a's now, uncommitted); then b drops its copy of the same
    bytes and b's real deleter runs its row before a commits: the row is cancelled (the
    move wants the pair), nothing is deleted, and a's commit is readable."""
    a_cat, b = nodes
    async with node_a(a_cat, bucket) as a:
        ref = await a.write_x()
        await a.move_round()
        assert a.store.guard.current(X) == (REMOTE,)
        b_drops_x(b, bucket)  # queued after the move, before a's commit
        deleter = b_deleter(b, bucket)
        async with trio.open_nursery() as n:
            n.start_soon(deleter.run)
            await deleter.settle([X], 30)  # every row of X tried: done or cancelled
            n.cancel_scope.cancel()
        assert not b.deletions_pending([X])
        assert in_bucket(bucket) == BODY
        ino = await a.commit(ref)
        assert_committed_and_readable(a, b, bucket, ino)


async def test_a_deletion_queued_before_the_move_and_claimed_after_it_is_cancelled(
    nodes: tuple[PostgresCatalog, PostgresCatalog], bucket: S3Tier
) -> None:
    """b's row is queued (unclaimed) when a moves X: the move cancels it; b queues it
    again (a second drop) before a's commit, and b's claim finds the pair wanted."""
    a_cat, b = nodes
    b_drops_x(b, bucket)
    async with node_a(a_cat, bucket) as a:
        ref = await a.write_x()
        await a.move_round()
        assert not b.deletion_keys(REMOTE)  # cancelled by the move: nothing was deleted
        b.queue_deletions([(X, REMOTE)])
        assert b.claim_deletions([(X, REMOTE)], lease_end()) == []  # b's deleter: wanted
        ino = await a.commit(ref)
        assert_committed_and_readable(a, b, bucket, ino)


async def test_a_moved_chunk_dropped_uncommitted_has_its_object_deleted(
    nodes: tuple[PostgresCatalog, PostgresCatalog], bucket: S3Tier
) -> None:
    """a moves X, then its file is dropped before any commit (unlinked, or the write
    failed): the move's record ends, the object is queued for deletion and a deleter
    (here b's: any node's) deletes it."""
    a_cat, b = nodes
    async with node_a(a_cat, bucket) as a:
        ref = await a.write_x()
        await a.move_round()
        assert a_cat.chunk_moves() == [(X, REMOTE, "a")] and in_bucket(bucket) == BODY
        await a.drop(ref)
        assert a_cat.chunk_moves() == []
        assert a_cat.deletion_keys(REMOTE) == {X}
    deleter = b_deleter(b, bucket)
    async with trio.open_nursery() as n:
        n.start_soon(deleter.run)
        await deleter.settle([X], 30)
        n.cancel_scope.cancel()
    assert deleter.deleted == 1 and not bucket.has(KEY)
    assert not b.deletions_pending([X])


async def test_a_chunk_dropped_while_it_moves_has_its_object_deleted_after_the_put(
    nodes: tuple[PostgresCatalog, PostgresCatalog], bucket: S3Tier
) -> None:
    """The drop comes while the PUT is in flight: the record ends only after the round
    (the PUT may still land), and then the object is queued and deleted."""
    a_cat, b = nodes
    remote = FaultyTier(bucket)
    remote.put_gate = gate = threading.Event()
    try:
        async with node_a(a_cat, remote) as a:
            ref = await a.write_x()
            async with trio.open_nursery() as n:
                n.start_soon(a.move_round)
                await trio.to_thread.run_sync(remote.put_entered.wait, 30)
                a.store.release([ref])  # dropped while its PUT is held
                assert a_cat.chunk_moves() == [(X, REMOTE, "a")]  # the PUT may land yet
                gate.set()
            await a.store.moves.end_now()
            assert in_bucket(bucket) == BODY  # landed after the drop ...
            assert a_cat.chunk_moves() == [] and a_cat.deletion_keys(REMOTE) == {X}  # ... queued
    finally:
        gate.set()
    deleter = b_deleter(b, bucket)
    async with trio.open_nursery() as n:
        n.start_soon(deleter.run)
        await deleter.settle([X], 30)
        n.cancel_scope.cancel()
    assert not bucket.has(KEY)


async def test_the_moves_of_a_node_whose_session_ends_are_released(
    nodes: tuple[PostgresCatalog, PostgresCatalog], bucket: S3Tier
) -> None:
    """a dies with X moved and uncommitted: when its session ends (b's cleanup of an
    expired session; here its close), the object is queued for deletion."""
    a_cat, b = nodes
    sid = a_cat.register_session("a", 30).sid
    async with node_a(a_cat, bucket) as a:
        await a.write_x()
        await a.move_round()
        assert in_bucket(bucket) == BODY
    # a's store is gone without ending its record (a crash): only its session's end does.
    assert b.chunk_moves() == [(X, REMOTE, "a")]
    b.close_session(sid)
    assert b.chunk_moves() == [] and b.deletion_keys(REMOTE) == {X}
