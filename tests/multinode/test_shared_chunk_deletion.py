"""Two nodes, one chunk: node a deletes the last copy's object of a digest while node b
commits the same bytes again and uploads them. Two real catalogs on one PostgreSQL and a
real S3 tier on SeaweedFS; the deleter's and the uploader's steps (their catalog calls and
tier calls, in the order Deleter._remote_one and Uploader._upload make them) are driven
by hand in the bad orders, so each interleaving runs exactly, with no sleep.

The end state every order must reach: each chunk an extent names has, for every replica
row marked valid, its object in the bucket, bit-identical."""

from __future__ import annotations

import hashlib
import stat
import threading
import time
from collections.abc import Callable

import pytest
import trio
import trio.testing

from tests.support.catalog_conformance import lease_end
from tests.support.pgserver import PgServer

from ckptfs.catalog import PostgresCatalog
from ckptfs.catalog.rows import ROOT_INODE, ChunkRef
from ckptfs.chunks.guard import ChunkGuard
from ckptfs.chunks.room import Room
from ckptfs.chunks.store import stats_for
from ckptfs.errors import AccessDenied, TransientTierError
from ckptfs.testing.tiers import FaultyTier
from ckptfs.tiers.s3 import S3Tier
from ckptfs.upload.deleter import Deleter

R = ROOT_INODE
F = stat.S_IFREG | 0o644
BODY = b"the same bytes on two nodes" * 100
X = hashlib.sha256(BODY).digest()
CHUNK = 1 << 20


@pytest.fixture
def bucket(s3_tier_factory: Callable[..., S3Tier]) -> S3Tier:
    return s3_tier_factory(name="remote0")


def put(tier: S3Tier | FaultyTier) -> None:
    tier.put(X.hex(), [BODY])


def a_drops_x(a: PostgresCatalog, bucket: S3Tier | FaultyTier) -> None:
    """Node a wrote X (uploaded: a valid remote replica), then unlinked the only file."""
    f = a.create(R, b"a0.bin", F, 0, 0)
    put(bucket)
    a.commit_file(f.ino, len(BODY), 1, 1, CHUNK, {0: ChunkRef(X, len(BODY), ("remote0",))})
    a.unlink(R, b"a0.bin")
    assert a.delete_inode(f.ino) == [X]
    assert a.drop_unreferenced([X]) == {X: ["remote0"]}


def b_commits_x(b: PostgresCatalog) -> int:
    """Node b commits a file of the same bytes: its local replica, an upload job."""
    f = b.create(R, b"b0-3.bin", F, 0, 0)
    b.commit_file(f.ino, len(BODY), 2, 2, CHUNK, {0: ChunkRef(X, len(BODY), ("b-local",))},
                  uploads={X: ["remote0"]})
    return f.ino


def b_uploads(b: PostgresCatalog, bucket: S3Tier) -> bool:
    """Node b's uploader, one pass: the due job of X (if any), its PUT and its record."""
    jobs = [j for j in b.due_uploads(2**62, 10, set()) if (j.digest, j.tier) == (X, "remote0")]
    if not jobs:
        return False
    put(bucket)
    return b.finish_uploads([(X, "remote0")], {(X, "remote0"): jobs[0].enqueued_ns})[(X, "remote0")]


def assert_readable(b: PostgresCatalog, bucket: S3Tier, ino: int) -> None:
    ref = b.extents(ino)[0]
    assert ref.digest == X
    for tier in ref.tiers:
        if tier == "remote0":
            assert bucket.get(X.hex()) == BODY, "valid replica row, object missing"


def test_a_deletion_claimed_before_the_commit_runs_before_the_upload(
    nodes: tuple[PostgresCatalog, PostgresCatalog], bucket: S3Tier
) -> None:
    """The failure seen under load: a claims (X, remote0); b commits X (no valid remote
    row: an upload job), PUTs it and records it; then a's DELETE lands. The upload must
    wait for the deletion that was claimed first, and run after it."""
    a, b = nodes
    a_drops_x(a, bucket)
    assert a.claim_deletions([(X, "remote0")], lease_end()) == [(X, "remote0")]  # a's deleter, step 2
    ino = b_commits_x(b)
    b_uploads(b, bucket)  # b's uploader while a's delete is in flight
    bucket.delete(X.hex())  # a's DELETE lands after b's PUT
    a.finish_deletions([(X, "remote0")])
    assert_readable(b, bucket, ino)
    assert b_uploads(b, bucket)  # the job ran after the deletion
    assert b.extents(ino)[0].tiers == ("b-local", "remote0")
    assert_readable(b, bucket, ino)
    assert not a.deletion_keys("remote0")


def test_an_upload_finishing_while_a_deletion_is_claimed_is_not_recorded(
    nodes: tuple[PostgresCatalog, PostgresCatalog], bucket: S3Tier
) -> None:
    """b's PUT ran (its due read came before a's claim was visible); a's DELETE is still
    in flight when b records: no valid row, the job stays and runs after the deletion."""
    a, b = nodes
    a_drops_x(a, bucket)
    assert a.claim_deletions([(X, "remote0")], lease_end()) == [(X, "remote0")]
    ino = b_commits_x(b)
    put(bucket)  # b's upload, started before it could see the claim
    assert b.finish_uploads([(X, "remote0")]) == {(X, "remote0"): False}
    bucket.delete(X.hex())
    a.finish_deletions([(X, "remote0")])
    assert_readable(b, bucket, ino)
    assert b_uploads(b, bucket)
    assert_readable(b, bucket, ino)
    assert b.extents(ino)[0].tiers == ("b-local", "remote0")


def test_a_commit_before_the_claim_cancels_the_deletion(
    nodes: tuple[PostgresCatalog, PostgresCatalog], bucket: S3Tier
) -> None:
    """The other order: b commits X while a's row is still queued (unclaimed): a's claim
    finds the chunk wanted again and deletes nothing; b's upload is recorded."""
    a, b = nodes
    a_drops_x(a, bucket)
    ino = b_commits_x(b)
    assert a.claim_deletions([(X, "remote0")], lease_end()) == []
    assert not a.deletion_keys("remote0")
    assert b_uploads(b, bucket)
    assert_readable(b, bucket, ino)


def test_an_upload_recorded_before_the_claim_cancels_the_deletion(
    nodes: tuple[PostgresCatalog, PostgresCatalog], bucket: S3Tier
) -> None:
    a, b = nodes
    a_drops_x(a, bucket)
    ino = b_commits_x(b)
    assert b_uploads(b, bucket)
    assert a.claim_deletions([(X, "remote0")], lease_end()) == []
    assert_readable(b, bucket, ino)
    assert b.extents(ino)[0].tiers == ("b-local", "remote0")


def test_an_upload_of_a_dropped_job_does_not_finish_the_job_queued_after_the_deletion(
    nodes: tuple[PostgresCatalog, PostgresCatalog], bucket: S3Tier
) -> None:
    """b's upload of X runs; meanwhile its file goes (the job with it, a deletion row
    queued), a claims and deletes the object, and b commits X again (a new job, held by
    the claim). b's PUT landed before a's DELETE: when the old upload finishes after the
    deletion, it must not record the new job's replica; the new job runs."""
    a, b = nodes
    f = b.create(R, b"b0-1.bin", F, 0, 0)
    b.commit_file(f.ino, len(BODY), 2, 2, CHUNK, {0: ChunkRef(X, len(BODY), ("b-local",))},
                  uploads={X: ["remote0"]})
    [old] = [j for j in b.due_uploads(2**62, 10, set()) if j.digest == X]
    put(bucket)  # b's upload of the first job is in flight
    b.unlink(R, b"b0-1.bin")
    assert b.delete_inode(f.ino) == [X]
    b.drop_unreferenced([X])
    assert a.claim_deletions([(X, "remote0")], lease_end()) == [(X, "remote0")]
    ino = b_commits_x(b)  # a new job of X, held by a's claim
    bucket.delete(X.hex())
    a.finish_deletions([(X, "remote0")])
    assert b.finish_uploads([(X, "remote0")], {(X, "remote0"): old.enqueued_ns}) == {
        (X, "remote0"): False}
    assert_readable(b, bucket, ino)
    assert b_uploads(b, bucket)
    assert_readable(b, bucket, ino)
    assert b.extents(ino)[0].tiers == ("b-local", "remote0")


def a_deleter_holding_its_delete(
    a: PostgresCatalog, bucket: S3Tier
) -> tuple[FaultyTier, threading.Event, Deleter]:
    """Node a dropped X; its Deleter's DELETE of X will be held until the gate opens."""
    remote = FaultyTier(bucket)
    remote.hold_deletes = gate = threading.Event()
    a_drops_x(a, remote)
    deleter = Deleter(a, [remote], trio.CapacityLimiter(2), guard=ChunkGuard([]),
                      stats=stats_for([remote]), room=Room())
    return remote, gate, deleter


async def test_node_a_deleter_holding_its_delete_holds_node_b_upload(
    nodes: tuple[PostgresCatalog, PostgresCatalog], bucket: S3Tier
) -> None:
    """The same race with node a's real Deleter: its DELETE of X is held (a slow object
    store) after its claim; node b commits X meanwhile. b's upload is not due until the
    DELETE returned and the row is done, and then it runs and is recorded."""
    a, b = nodes
    remote, gate, deleter = a_deleter_holding_its_delete(a, bucket)
    async with trio.open_nursery() as n:
        n.start_soon(deleter.run)
        deleter.kick()
        await trio.to_thread.run_sync(remote.delete_held.wait, 30)
        ino = b_commits_x(b)
        assert not b_uploads(b, bucket)  # held by a's claim
        gate.set()
        while deleter.deleted < 1:
            await deleter._progress.wait()
        n.cancel_scope.cancel()
    assert not bucket.has(X.hex())
    assert b_uploads(b, bucket)
    assert_readable(b, bucket, ino)
    assert b.extents(ino)[0].tiers == ("b-local", "remote0")


@pytest.mark.allow_log_warnings("deletion queue paused")
async def test_a_claims_end_met_by_a_database_outage_is_written_once_the_database_is_back(
    nodes: tuple[PostgresCatalog, PostgresCatalog], bucket: S3Tier, postgres: PgServer
) -> None:
    """Node a's DELETE of X returns while the database is down, so the end of its claim
    cannot be written. The deleter keeps running (its DELETE is never abandoned) and
    writes the end as soon as the database answers: node b's held upload of X is due then,
    not when the 10-minute lease runs out (before, the outage ended the deleter's task and
    the claim stayed, holding b's upload: `ckptfs sync` timed out)."""
    a, b = nodes
    remote, gate, deleter = a_deleter_holding_its_delete(a, bucket)
    async with trio.open_nursery() as n:
        n.start_soon(deleter.run)
        deleter.kick()
        await trio.to_thread.run_sync(remote.delete_held.wait, 30)
        ino = b_commits_x(b)
        assert not b_uploads(b, bucket)  # held by a's claim
        await trio.to_thread.run_sync(postgres.stop)
        try:
            progress = deleter._progress
            gate.set()
            with trio.fail_after(60):
                await progress.wait()  # the DELETE returned; its end was not written
            assert not bucket.has(X.hex()) and deleter.deleted == 0
        finally:
            await trio.to_thread.run_sync(postgres.start)
        with trio.fail_after(60):
            while deleter.deleted < 1:
                await deleter._progress.wait()
        n.cancel_scope.cancel()
    assert a.deletion_keys("remote0") == set()
    assert b_uploads(b, bucket)
    assert_readable(b, bucket, ino)
    assert b.extents(ino)[0].tiers == ("b-local", "remote0")


async def b_commits_x_while_a_deletes_it(
    deleter: Deleter, remote: FaultyTier, b: PostgresCatalog, bucket: S3Tier
) -> int:
    """With a's deleter running: its DELETE of X is held at the wrapper's gate (claimed),
    and b commits X meanwhile, whose upload that claim holds. b's inode of X."""
    deleter.kick()
    await trio.to_thread.run_sync(remote.delete_held.wait, 30)
    ino = b_commits_x(b)
    assert not b_uploads(b, bucket)  # held by a's claim
    return ino


async def until(deleter: Deleter, done: Callable[[], bool]) -> None:
    """Wait until ``done()``, looking again after each row or batch the deleter ends."""
    while True:
        progress = deleter._progress
        if done():
            return
        await progress.wait()


def a_deleter_failing_its_delete(
    a: PostgresCatalog, bucket: S3Tier, clock: Callable[[], int]
) -> tuple[FaultyTier, threading.Event, Deleter]:
    """As a_deleter_holding_its_delete, with the deleter on ``clock``: the held DELETE
    fails with the error the test sets on the wrapper before it opens the gate."""
    remote = FaultyTier(bucket)
    remote.hold_deletes = gate = threading.Event()
    a_drops_x(a, remote)
    deleter = Deleter(a, [remote], trio.CapacityLimiter(2), guard=ChunkGuard([]),
                      stats=stats_for([remote]), room=Room(), clock=clock)
    return remote, gate, deleter


def trio_ns_clock() -> Callable[[], int]:
    """The wall clock now, moved on as trio's (Mock)clock moves: the deleter's clock."""
    wall, start = time.time_ns(), trio.current_time()
    return lambda: wall + int((trio.current_time() - start) * 1e9)


@pytest.mark.allow_log_warnings("deleting chunks on tier remote0 failed")
async def test_a_delete_in_doubt_keeps_its_claim_for_the_grace_and_holds_the_upload(
    nodes: tuple[PostgresCatalog, PostgresCatalog], bucket: S3Tier,
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Node a's DELETE of X was sent and timed out unanswered (in doubt): it may still
    land. Node b committed X meanwhile. Until the tier's grace ends a's row stays claimed:
    b's upload is neither due nor recorded, and the late DELETE lands harmlessly. Then a's
    deleter ends the claim at its deadline (trio's clock jumps to it: no poll, no sleep),
    the attempt and its error stay for `ckptfs status`, and b's upload runs and is
    recorded. (Before, the claim ended with the failure: b's PUT was recorded and the
    late DELETE removed the object a valid replica row names.)"""
    a, b = nodes
    remote, gate, deleter = a_deleter_failing_its_delete(a, bucket, trio_ns_clock())
    pair = (X, "remote0")
    async with trio.open_nursery() as n:
        n.start_soon(deleter.run)
        ino = await b_commits_x_while_a_deletes_it(deleter, remote, b, bucket)
        remote.delete_error = TransientTierError("delete: read timeout", in_doubt=True)
        gate.set()
        await until(deleter, lambda: deleter.failures >= 1 and pair not in deleter.running)
        # No await from here to the grace's end: trio's clock cannot jump meanwhile.
        assert pair in deleter._graced, "the claim ended with the failure"
        lease = deleter._graced[pair]
        assert lease >= deleter.clock() + int(bucket.request_grace_s * 1e9) - 10**9
        [backlog] = a.deletion_backlog()
        assert (backlog.failing, backlog.last_error) == (1, "delete: read timeout")
        assert a.due_deletions(deleter.clock(), 10, set(), ["remote0"]) == []  # claimed
        assert not b_uploads(b, bucket)  # still held
        put(bucket)  # a PUT of b's that started before: not recorded
        assert b.finish_uploads([pair]) == {pair: False}
        assert b.next_upload_due_ns(set()) == lease  # b's uploader: a deadline, not a poll
        bucket.delete(X.hex())  # a's DELETE lands late, inside the grace
        await until(deleter, lambda: pair not in deleter._graced)  # the clock jumps to its end
        assert deleter.clock() >= lease
        n.cancel_scope.cancel()
    assert b_uploads(b, bucket)  # released at the grace's end: due, and recorded
    assert b.extents(ino)[0].tiers == ("b-local", "remote0")
    assert_readable(b, bucket, ino)
    assert deleter.failures == 1 and deleter.deleted == 0


@pytest.mark.allow_log_warnings("deleting chunks on tier remote0 failed")
async def test_a_delete_the_server_answered_ends_its_claim_at_once(
    nodes: tuple[PostgresCatalog, PostgresCatalog], bucket: S3Tier,
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A's DELETE of X is refused with 403: an answer, so the request is over. The claim
    ends with the failure (the row postponed with its backoff, its error kept), and b's
    held upload is due at once."""
    a, b = nodes
    remote, gate, deleter = a_deleter_failing_its_delete(a, bucket, trio_ns_clock())
    pair = (X, "remote0")
    async with trio.open_nursery() as n:
        n.start_soon(deleter.run)
        ino = await b_commits_x_while_a_deletes_it(deleter, remote, b, bucket)
        remote.delete_error = AccessDenied("delete: access denied (403 AccessDenied)")
        gate.set()
        await until(deleter, lambda: deleter.failures >= 1 and pair not in deleter.running)
        assert not deleter._graced
        [backlog] = a.deletion_backlog()
        assert backlog.failing == 1 and "403" in str(backlog.last_error)
        assert b_uploads(b, bucket)  # the claim ended: due and recorded now
        n.cancel_scope.cancel()
    assert b.extents(ino)[0].tiers == ("b-local", "remote0")
    assert_readable(b, bucket, ino)


@pytest.mark.allow_log_warnings("deletion queue paused", "deleting chunks on tier remote0 failed")
async def test_a_delete_in_doubt_met_by_a_database_outage_keeps_its_claim_once_written(
    nodes: tuple[PostgresCatalog, PostgresCatalog], bucket: S3Tier, postgres: PgServer
) -> None:
    """Node a's DELETE of X fails in doubt while the database is down: its end cannot be
    written (the claim made before holds meanwhile). Once the database answers, the end
    is written as a kept claim (the grace has not ended): b's upload stays held until the
    deleter's clock passes the grace, and is due then."""
    a, b = nodes
    shift = [0]  # the deleter's clock: the wall clock, moved on by the test
    remote, gate, deleter = a_deleter_failing_its_delete(
        a, bucket, lambda: time.time_ns() + shift[0])
    pair = (X, "remote0")
    async with trio.open_nursery() as n:
        n.start_soon(deleter.run)
        ino = await b_commits_x_while_a_deletes_it(deleter, remote, b, bucket)
        await trio.to_thread.run_sync(postgres.stop)
        try:
            remote.delete_error = TransientTierError("delete: connection reset", in_doubt=True)
            gate.set()
            with trio.fail_after(60):  # the DELETE failed; its end was not written
                await until(deleter, lambda: deleter.failures >= 1 and pair not in deleter.running)
            [(how, _, _, kept)] = [end for _, end in deleter._unwritten.values()]
            assert (how, kept) == ("postpone", True)
        finally:
            await trio.to_thread.run_sync(postgres.start)
        with trio.fail_after(60):  # written once the database answers
            await until(deleter, lambda: pair in deleter._graced)
        assert not deleter._unwritten
        lease = deleter._graced[pair]
        assert not b_uploads(b, bucket)  # still held: the grace has not ended
        assert b.next_upload_due_ns(set()) == lease
        [backlog] = a.deletion_backlog()
        assert (backlog.failing, backlog.last_error) == (1, "delete: connection reset")
        shift[0] = lease - time.time_ns()  # the deleter's clock reaches the grace's end
        deleter.kick()
        with trio.fail_after(60):
            await until(deleter, lambda: pair not in deleter._graced)
        n.cancel_scope.cancel()
    assert b_uploads(b, bucket)
    assert_readable(b, bucket, ino)
    assert b.extents(ino)[0].tiers == ("b-local", "remote0")
