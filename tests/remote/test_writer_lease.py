"""One writer per bucket prefix: the writer lease (ckptfs/upload/lease.py) on a real SeaweedFS.

The lease logic first against S3Tier objects (two "nodes" on one prefix, no FUSE), then with
real mounts: a second state dir is refused while the first is mounted, ``--takeover`` wins
(and the first node stops writing), a clean unmount lets the next node in, and a stale
lease is taken over.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON, mounted, run_cli
from tests.support.s3faults import LeasePutFaults
from tests.support.s3fixtures import remove_prefix
from tests.support.s3server import ACCESS_KEY, SECRET_KEY, SeaweedServer

from ckptfs.errors import ConfigError, PermanentTierError, TransientTierError
from ckptfs.tiers.s3 import PreconditionFailed, S3Tier
from ckptfs.upload.lease import (
    LEASE_NAME,
    RETRY_ATTEMPTS,
    Lease,
    LeaseConflict,
    LeaseTiming,
    WriterLease,
    WriterLeases,
    lease_timing,
    read_lease,
    writer_id,
)

needs_fuse = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)
MiB = 1 << 20
HEARTBEAT_S = 0.2  # the daemons' heartbeat in these tests (CKPTFS_LEASE_HEARTBEAT_S)
# Their lease timeout (CKPTFS_LEASE_TIMEOUT_S): long, so that a loaded test machine, where
# a heartbeat's requests may take longer than 3 * HEARTBEAT_S, does not trip the watchdog.
TIMEOUT_S = 30.0


def wait_until(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll a condition with a deadline (never a bare sleep standing in for it)."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


def lease_key(prefix: str) -> str:
    return f"{prefix}/meta/{LEASE_NAME}"


def get_lease(server: SeaweedServer, prefix: str) -> dict[str, Any] | None:
    client = server.client()
    try:
        raw = client.get_object(Bucket=server.bucket, Key=lease_key(prefix))["Body"].read()
    except client.exceptions.NoSuchKey:
        return None
    finally:
        client.close()
    return dict(json.loads(raw))


def put_lease(server: SeaweedServer, prefix: str, **fields: Any) -> None:
    client = server.client()
    try:
        client.put_object(Bucket=server.bucket, Key=lease_key(prefix),
                          Body=json.dumps(fields).encode())
    finally:
        client.close()


# ------------------------------------------------------------------ the lease, without FUSE

FAST = LeaseTiming(heartbeat_s=0.1, timeout_s=0.3)


def fence(tier: S3Tier) -> str | None:
    """``tier.fenced`` as a call: heartbeats between two reads change it, and mypy would
    keep an ``assert tier.fenced is None`` narrowing past them (the rest unreachable)."""
    return tier.fenced


@pytest.fixture
def two_nodes(
    s3_tier_factory: Callable[..., S3Tier], tmp_path: Path  # noqa: F811
) -> Iterator[tuple[S3Tier, S3Tier, Path, Path]]:
    """Two S3Tiers on one prefix, as two nodes with their own state dirs would have."""
    a = s3_tier_factory(name="remote0")
    b = s3_tier_factory(name="remote0", prefix=a.prefix)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    yield a, b, tmp_path / "a", tmp_path / "b"


@pytest.mark.allow_log_errors
@pytest.mark.allow_log_warnings("--takeover: taking the writer lease")
def test_lease_conflict_takeover_and_release(
    two_nodes: tuple[S3Tier, S3Tier, Path, Path], tmp_path: Path
) -> None:
    a, b, state_a, state_b = two_nodes
    node_a = WriterLeases([a], state_a, timing=FAST)
    node_a.acquire()
    held = read_lease(a).lease
    assert held is not None and held.writer_id == writer_id(state_a) and not held.released
    assert fence(a) is None

    node_b = WriterLeases([b], state_b, timing=FAST)
    with pytest.raises(LeaseConflict) as refused:
        node_b.acquire()
    msg = str(refused.value)
    for needle in ("remote0", socket.gethostname(), f"pid {os.getpid()}", str(state_a),
                   "--takeover"):
        assert needle in msg, (needle, msg)

    # A heartbeat renews the lease in place.
    before = read_lease(a).lease
    node_a.leases[0].heartbeat()
    after = read_lease(a).lease
    assert before is not None and after is not None and after.heartbeat > before.heartbeat

    taker = WriterLeases([b], state_b, takeover=True, timing=FAST)
    taker.acquire()
    assert read_lease(b).lease.writer_id == writer_id(state_b)  # type: ignore[union-attr]

    # A's next heartbeat finds the lease taken: A stops writing, and leaves B's lease alone.
    node_a.leases[0].heartbeat()
    assert a.fenced is not None and "writer lease" in a.fenced
    with pytest.raises(PermanentTierError, match="writer lease"):
        a.put("00" * 32, [b"x"])
    with pytest.raises(PermanentTierError, match="writer lease"):
        a.delete("00" * 32)
    node_a.leases[0].heartbeat()
    node_a.release()
    assert read_lease(b).lease.writer_id == writer_id(state_b)  # type: ignore[union-attr]

    # B unmounts cleanly: a third node takes the released lease without --takeover.
    taker.release()
    released = read_lease(b).lease
    assert released is not None and released.released
    (tmp_path / "c").mkdir()
    node_c = WriterLeases([b], tmp_path / "c", timing=FAST)
    node_c.acquire()
    assert read_lease(b).lease.writer_id == writer_id(tmp_path / "c")  # type: ignore[union-attr]


@pytest.mark.allow_log_warnings("--takeover: replacing the unreadable lease")
def test_stale_and_unreadable_leases(
    two_nodes: tuple[S3Tier, S3Tier, Path, Path], seaweed: SeaweedServer  # noqa: F811
) -> None:
    a, _b, state_a, _ = two_nodes
    put_lease(seaweed, a.prefix, writer_id="f" * 32, host="gone", pid=1, state_dir="/x",
              heartbeat=time.time() - 1.0)  # older than FAST.timeout_s
    WriterLeases([a], state_a, timing=FAST).acquire()
    assert read_lease(a).lease.writer_id == writer_id(state_a)  # type: ignore[union-attr]

    a.client.put_object(Bucket=a.bucket, Key=lease_key(a.prefix), Body=b"\x00garbage")
    with pytest.raises(LeaseConflict, match="unreadable lease"):
        WriterLeases([a], state_a, timing=FAST).acquire()
    WriterLeases([a], state_a, takeover=True, timing=FAST).acquire()
    assert read_lease(a).lease.writer_id == writer_id(state_a)  # type: ignore[union-attr]


def test_lease_writes_are_conditional(s3_tier: S3Tier) -> None:  # noqa: F811
    """Two writers racing for the lease cannot both win: If-None-Match / If-Match."""
    etag = s3_tier.put_meta_if(LEASE_NAME, b"{}", etag=None)
    with pytest.raises(PreconditionFailed):
        s3_tier.put_meta_if(LEASE_NAME, b"{}", etag=None)  # it exists now
    new = s3_tier.put_meta_if(LEASE_NAME, b"[]", etag=etag)
    with pytest.raises(PreconditionFailed):
        s3_tier.put_meta_if(LEASE_NAME, b"{}", etag=etag)  # changed since etag was read
    assert s3_tier.get_meta_tagged(LEASE_NAME) == (b"[]", new)


@pytest.mark.allow_log_warnings("not taken (", "cannot reach the remote", "not renewed for")
def test_unreachable_remote_at_mount_fences_until_the_lease_is_taken(
    two_nodes: tuple[S3Tier, S3Tier, Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _b, state_a, _ = two_nodes

    def outage(name: str) -> None:
        raise TransientTierError(f"tier {a.name}: get {name}: cannot reach endpoint (simulated)")

    leases = WriterLeases([a], state_a, timing=FAST, sleep=lambda _s: None)
    with monkeypatch.context() as patch:
        patch.setattr(a, "get_meta_tagged", outage)
        leases.acquire()  # no error: the mount goes on, writes to the tier wait
        assert a.fenced is not None and "not taken yet" in a.fenced
        with pytest.raises(TransientTierError, match="not taken yet"):
            a.put_meta("catalog.snapshot", b"x")
        leases.leases[0].heartbeat()  # still down: still fenced, no exception
        assert a.fenced is not None
    leases.leases[0].heartbeat()  # the remote is back: the heartbeat takes the lease
    assert fence(a) is None
    assert read_lease(a).lease.writer_id == writer_id(state_a)  # type: ignore[union-attr]

    # Held, then an outage longer than (timeout - heartbeat): others may soon take the lease
    # as stale, so this node stops writing until a renewal shows the lease is still its own.
    lease = leases.leases[0]
    lease.renewed_at -= FAST.timeout_s  # as if the last renewal was that long ago
    with monkeypatch.context() as patch:
        patch.setattr(a, "get_meta_tagged", outage)
        lease.heartbeat()
    assert a.fenced is not None and "could not be renewed" in a.fenced
    lease.heartbeat()
    assert fence(a) is None


def test_lease_timing_from_the_environment() -> None:
    assert lease_timing({}) == LeaseTiming(30.0, 90.0)
    assert lease_timing({"CKPTFS_LEASE_HEARTBEAT_S": "0.5"}) == LeaseTiming(0.5, 1.5)
    assert lease_timing({"CKPTFS_LEASE_HEARTBEAT_S": "1", "CKPTFS_LEASE_TIMEOUT_S": "10"}) == (
        LeaseTiming(1.0, 10.0)
    )
    for bad in ({"CKPTFS_LEASE_HEARTBEAT_S": "soon"}, {"CKPTFS_LEASE_HEARTBEAT_S": "-1"},
                {"CKPTFS_LEASE_HEARTBEAT_S": "5", "CKPTFS_LEASE_TIMEOUT_S": "5"}):
        with pytest.raises(ConfigError, match="CKPTFS_LEASE"):
            lease_timing(bad)


def test_lease_json_round_trip() -> None:
    lease = Lease("ab" * 16, "node7", 42, "/var/lib/ckptfs", 1_700_000_000.5)
    assert Lease.from_bytes(lease.to_bytes()) == lease
    for bad in (b"", b"[]", b'{"writer_id": "x"}', b'{"heartbeat": 1}', b"\xff"):
        with pytest.raises(ValueError):
            Lease.from_bytes(bad)


# ------------------------------------------------------------------ faults in the lease's PUTs

# Virtual time only (a fake clock, or trio's MockClock): nothing here sleeps.
SLOW = LeaseTiming(heartbeat_s=10.0, timeout_s=35.0)  # window 25 s, retry budget 5 s


class FakeTime:
    """A monotonic clock that moves only when a heartbeat pauses between attempts."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.pauses: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


@pytest.fixture
def faults(two_nodes: tuple[S3Tier, S3Tier, Path, Path]) -> Iterator[LeasePutFaults]:
    """Faults in node A's lease PUTs (its real client; everything else reaches SeaweedFS)."""
    injected = LeasePutFaults(two_nodes[0])
    try:
        yield injected
    finally:
        injected.close()


def lease_warnings(caplog: pytest.LogCaptureFixture, needle: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "ckptfs.lease" and r.levelno >= logging.WARNING and needle in r.getMessage()]


def held_lease(a: S3Tier, state_a: Path, faults: LeasePutFaults) -> tuple[FakeTime, WriterLease]:
    """Node a's lease, taken, on fake time (its pauses recorded, never slept); the faults'
    records of that taking cleared."""
    fake = FakeTime()
    leases = WriterLeases([a], state_a, timing=LeaseTiming(), monotonic=fake.monotonic,
                          sleep=fake.sleep)
    leases.acquire()
    faults.sent.clear()
    faults.answers.clear()
    return fake, leases.leases[0]


@pytest.mark.parametrize("failures", [1, 2])
def test_transient_500s_are_retried_within_the_heartbeat(
    two_nodes: tuple[S3Tier, S3Tier, Path, Path], faults: LeasePutFaults,
    caplog: pytest.LogCaptureFixture, failures: int,
) -> None:
    """A 500 on a lease PUT is tried again after a short pause, within the heartbeat, each
    attempt reading the lease first: no warning, no fence (and the fixture fails the test
    on any WARNING)."""
    a, _b, state_a, _ = two_nodes
    fake, lease = held_lease(a, state_a, faults)
    before = read_lease(a)
    faults.fail = failures
    lease.heartbeat()
    assert faults.answers == [500] * failures + [200]
    assert fake.pauses == [0.5, 1.0][:failures]  # 0.5 s, doubling
    # Every attempt wrote over the lease as read just before it (nothing else changed it).
    assert [s.get("If-Match") for s in faults.sent] == [before.etag] * (failures + 1)
    after = read_lease(a)
    assert after.lease is not None and before.lease is not None
    assert after.lease.heartbeat > before.lease.heartbeat and after.etag != before.etag
    assert fence(a) is None and not lease.failing and not lease.lost
    assert lease.renewed_at == fake.now  # stamped after the last pause
    assert lease_warnings(caplog, "") == []


@pytest.mark.allow_log_warnings("cannot reach the remote")
def test_retries_stop_within_the_retry_budget(
    two_nodes: tuple[S3Tier, S3Tier, Path, Path], faults: LeasePutFaults,
) -> None:
    """At most RETRY_ATTEMPTS attempts, and none that would start after the retry budget
    (half a heartbeat at most): a heartbeat stays well inside its period and the deadline."""
    a, _b, state_a, _ = two_nodes
    fake = FakeTime()
    timing = LeaseTiming()
    assert timing.retry_budget_s < timing.heartbeat_s < timing.window_s
    leases = WriterLeases([a], state_a, timing=timing, monotonic=fake.monotonic,
                          sleep=fake.sleep)
    leases.acquire()
    lease = leases.leases[0]
    faults.answers.clear()
    faults.fail = 100
    lease.heartbeat()
    assert len(faults.answers) == RETRY_ATTEMPTS and fake.pauses == [0.5, 1.0, 2.0]
    # Slow failures: each attempt takes 4 s; a fourth would start after the budget (15 s).
    faults.answers.clear()
    fake.pauses.clear()
    began = fake.now
    faults.on_put = lambda _i: setattr(fake, "now", fake.now + 4.0)
    lease.heartbeat()
    assert len(faults.answers) == 3 and fake.pauses == [0.5, 1.0]
    assert fake.now - began < timing.retry_budget_s
    assert lease.failing and fence(a) is None  # still inside the window


def _returns(lease: WriterLease) -> trio.MemoryReceiveChannel[None]:
    """A channel that gets a message each time ``lease.heartbeat`` returns (it runs in a
    worker thread of ``WriterLeases.run``)."""
    send, receive = trio.open_memory_channel[None](math.inf)
    beat = lease.heartbeat

    def heartbeat() -> None:
        try:
            beat()
        finally:
            trio.from_thread.run_sync(send.send_nowait, None)

    lease.heartbeat = heartbeat  # type: ignore[method-assign]
    return receive


def record_fences(tier: S3Tier, clock: trio.testing.MockClock) -> list[tuple[float, str | None]]:
    """Each ``tier.fence`` call: (virtual time, reason)."""
    calls: list[tuple[float, str | None]] = []
    fence_of = tier.fence

    def fenced(reason: str | None, *, permanent: bool = False) -> None:
        calls.append((clock.current_time(), reason))
        fence_of(reason, permanent=permanent)

    tier.fence = fenced  # type: ignore[method-assign]
    return calls


async def jump_to(clock: trio.testing.MockClock, when: float) -> None:
    """Move trio's virtual clock to ``when``; return once every task has run to a block."""
    clock.jump(when - clock.current_time())
    await trio.testing.wait_all_tasks_blocked()


@pytest.mark.allow_log_warnings("cannot reach the remote", "not renewed for")
async def test_a_lasting_failure_warns_once_and_fences_at_the_deadline(
    two_nodes: tuple[S3Tier, S3Tier, Path, Path], faults: LeasePutFaults,
    mock_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture,
) -> None:
    a, _b, state_a, _ = two_nodes
    leases = WriterLeases([a], state_a, timing=SLOW, monotonic=mock_clock.current_time,
                          sleep=lambda _s: None)
    await trio.to_thread.run_sync(leases.acquire)
    lease = leases.leases[0]
    t0 = lease.renewed_at
    returned = _returns(lease)
    fences = record_fences(a, mock_clock)
    faults.answers.clear()
    faults.fail = 10**6
    async with trio.open_nursery() as nursery:
        nursery.start_soon(leases.run)
        await returned.receive()  # the first heartbeat, at once
        assert faults.answers == [500] * RETRY_ATTEMPTS
        assert len(lease_warnings(caplog, "cannot reach the remote")) == 1
        assert fence(a) is None
        for k in (1, 2):  # heartbeats at t0 + 10 and t0 + 20: still inside the window
            await jump_to(mock_clock, t0 + k * SLOW.heartbeat_s + 1e-3)
            await returned.receive()
            assert fence(a) is None and fences == []
        assert len(faults.answers) == 3 * RETRY_ATTEMPTS
        await jump_to(mock_clock, t0 + SLOW.window_s - 1e-3)
        assert fence(a) is None
        await jump_to(mock_clock, t0 + SLOW.window_s + 1e-3)  # the deadline: t0 + 25
        assert len(fences) == 1
        when, reason = fences[0]
        assert t0 + SLOW.window_s <= when <= t0 + SLOW.window_s + 1e-3
        assert reason is not None and "could not be renewed for 25 s" in reason
        assert "server error 500" in reason  # what the failed attempts said
        with pytest.raises(TransientTierError, match="could not be renewed"):
            a.put_meta("catalog.snapshot", b"x")  # refused before any request
        await jump_to(mock_clock, t0 + 3 * SLOW.heartbeat_s + 1e-3)
        await returned.receive()  # a fourth failed heartbeat: nothing more is logged
        nursery.cancel_scope.cancel()
    assert len(lease_warnings(caplog, "cannot reach the remote")) == 1
    assert len(lease_warnings(caplog, "not renewed for")) == 1
    assert fence(a) is not None and len(fences) == 1
    held = read_lease(a).lease
    assert held is not None and held.writer_id == writer_id(state_a)  # never renewed


@pytest.mark.allow_log_warnings("not renewed for")
async def test_watchdog_fences_a_hung_heartbeat_at_the_deadline(
    two_nodes: tuple[S3Tier, S3Tier, Path, Path], faults: LeasePutFaults,
    mock_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture,
) -> None:
    """A heartbeat hung in its lease PUT (a hung object store) does not keep the tier
    writable past the deadline: the watchdog fences it on the trio side. The PUT, when it
    goes through at last, wrote a heartbeat time stamped a whole window ago (its lease is
    about to be stale) and does not unfence; the next heartbeat, due at once, does."""
    a, _b, state_a, _ = two_nodes
    leases = WriterLeases([a], state_a, timing=SLOW, monotonic=mock_clock.current_time,
                          sleep=lambda _s: None)
    await trio.to_thread.run_sync(leases.acquire)
    lease = leases.leases[0]
    t0 = lease.renewed_at
    acquired = read_lease(a)
    returned = _returns(lease)
    fences = record_fences(a, mock_clock)
    gate = faults.gate = threading.Event()
    then = threading.Event()  # holds the next heartbeat's PUT until the test looked
    async with trio.open_nursery() as nursery:
        try:  # a failed assertion opens the gates, or the nursery would wait for the thread
            nursery.start_soon(leases.run)
            await trio.to_thread.run_sync(faults.held.wait)  # the first heartbeat's PUT hangs
            await jump_to(mock_clock, t0 + SLOW.window_s - 1e-3)  # past two heartbeat periods
            assert fence(a) is None
            await jump_to(mock_clock, t0 + SLOW.window_s + 1e-3)
            assert len(fences) == 1 and t0 + SLOW.window_s <= fences[0][0]
            assert "could not be renewed" in str(fences[0][1])
            assert "still waiting for the remote" in str(fences[0][1])
            assert len(lease_warnings(caplog, "not renewed for")) == 1
            assert read_lease(a).etag == acquired.etag  # the heartbeat has not written
            faults.gate = then
            gate.set()  # the object store answers again
            await returned.receive()  # the hung heartbeat: its renewal is stale already
            assert fence(a) is not None and len(fences) == 1
            faults.gate = None
            then.set()
            await returned.receive()  # the next one, at once
            assert fence(a) is None and fences[-1][1] is None
            nursery.cancel_scope.cancel()
        finally:
            gate.set()
            then.set()
    renewed = read_lease(a).lease
    assert renewed is not None and acquired.lease is not None
    assert renewed.writer_id == acquired.lease.writer_id and not lease.lost
    assert lease.renewed_at >= t0 + SLOW.window_s  # the deadline moved with the renewal


def test_a_renewal_whose_reply_was_lost_is_not_a_lost_lease(
    two_nodes: tuple[S3Tier, S3Tier, Path, Path], faults: LeasePutFaults,
) -> None:
    """The PUT landed (the ETag changed) but the client saw a read timeout: the retry reads
    the lease again, finds it is ours, and writes If-Match the new ETag. No conflict."""
    a, _b, state_a, _ = two_nodes
    fake, lease = held_lease(a, state_a, faults)
    before = read_lease(a)
    faults.lose = 1
    lease.heartbeat()
    assert faults.answers == [0, 200]  # the first reply lost, the retry answered
    assert len(faults.landed) == 1 and faults.landed[0] != before.etag
    assert [s.get("If-Match") for s in faults.sent] == [before.etag, faults.landed[0]]
    assert not lease.lost and lease.held and fence(a) is None and not lease.failing


@pytest.mark.allow_log_warnings("cannot reach the remote")
def test_lost_replies_through_a_whole_heartbeat_are_not_a_lost_lease(
    two_nodes: tuple[S3Tier, S3Tier, Path, Path], faults: LeasePutFaults,
) -> None:
    """Every attempt of a heartbeat landed unseen: it fails (logged), and the next
    heartbeat renews the lease, which still names this node."""
    a, _b, state_a, _ = two_nodes
    fake, lease = held_lease(a, state_a, faults)
    faults.lose = RETRY_ATTEMPTS
    lease.heartbeat()
    assert faults.answers == [0] * RETRY_ATTEMPTS and lease.failing and not lease.lost
    assert len(set(faults.landed)) == RETRY_ATTEMPTS  # each landed: a new ETag each time
    lease.heartbeat()
    assert faults.answers[-1] == 200
    assert not lease.lost and not lease.failing and fence(a) is None


def test_a_lost_put_that_lands_late_only_makes_the_renewal_look_again(
    two_nodes: tuple[S3Tier, S3Tier, Path, Path], faults: LeasePutFaults,
    seaweed: SeaweedServer,  # noqa: F811
) -> None:
    """The PUT whose reply was lost lands only after the retry read the lease: the retry's
    If-Match fails (412), and the renewal reads again and wins: still not a lost lease."""
    a, _b, state_a, _ = two_nodes
    fake, lease = held_lease(a, state_a, faults)
    late = read_lease(a).lease
    assert late is not None
    faults.fail = 1  # the first PUT "times out" before it is answered ...

    def lands_late(index: int) -> None:
        if index == 1:  # ... and lands now, just before the retry's PUT
            put_lease(seaweed, a.prefix, version=1,
                      **asdict(replace(late, heartbeat=late.heartbeat + 1.0)))

    faults.on_put = lands_late
    lease.heartbeat()
    assert faults.answers == [500, 412, 200]
    assert not lease.lost and fence(a) is None
    renewed = read_lease(a).lease
    assert renewed is not None and renewed.writer_id == late.writer_id
    assert renewed.heartbeat > late.heartbeat


def test_taking_and_releasing_the_lease_retry_transient_errors(
    two_nodes: tuple[S3Tier, S3Tier, Path, Path], faults: LeasePutFaults,
) -> None:
    """A 500 when the mount takes the lease, and a lost reply when the unmount releases
    it, are tried again like a heartbeat's: the mount holds the lease, the unmount leaves
    it released, and nothing is logged as a warning."""
    a, _b, state_a, _ = two_nodes
    fake = FakeTime()
    leases = WriterLeases([a], state_a, timing=LeaseTiming(), monotonic=fake.monotonic,
                          sleep=fake.sleep)
    faults.fail = 1
    leases.acquire()
    assert faults.answers == [500, 200] and fence(a) is None and leases.leases[0].held
    faults.lose = 1
    leases.release()
    assert faults.answers[2:] == [0, 200] and fake.pauses == [0.5, 0.5]
    released = read_lease(a).lease
    assert released is not None and released.released
    assert released.writer_id == writer_id(state_a)


# ------------------------------------------------------------------ real mounts


@pytest.fixture
def remote(seaweed: SeaweedServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:  # noqa: F811
    """A fresh prefix; credentials and a short heartbeat in the environment the CLI and
    the daemons inherit."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("CKPTFS_LEASE_HEARTBEAT_S", str(HEARTBEAT_S))
    monkeypatch.setenv("CKPTFS_LEASE_TIMEOUT_S", str(TIMEOUT_S))
    prefix = f"l-{uuid.uuid4().hex[:10]}"
    yield f"s3://{seaweed.bucket}/{prefix}?endpoint={seaweed.endpoint}", prefix
    remove_prefix(seaweed, seaweed.bucket, prefix)


def write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


@pytest.mark.slow
@needs_fuse
@pytest.mark.allow_log_errors  # node 1 logs the loss of its lease at ERROR
@pytest.mark.allow_log_warnings("writer lease")  # node 2 takes it over, node 1 is refused
def test_second_node_is_refused_while_the_first_is_mounted_and_takeover_wins(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str]  # noqa: F811
) -> None:
    url, prefix = remote
    args = ("--chunk-size", "1MiB", "--remote", url)
    with mounted(tmp_path / "node1", 1, args) as m1:
        first = get_lease(seaweed, prefix)
        assert first is not None and first["writer_id"] == writer_id(m1.state_dir)
        assert first["pid"] == m1.pid and first["state_dir"] == str(m1.state_dir)
        # The heartbeat task renews it while mounted.
        wait_until(lambda: get_lease(seaweed, prefix)["heartbeat"] > first["heartbeat"],  # type: ignore[index]
                   10, "a heartbeat of node 1")

        second = tmp_path / "node2"
        (second / "mnt").mkdir(parents=True)
        (second / "tier0").mkdir()
        res = run_cli("mount", str(second / "mnt"), "--state-dir", str(second / "state"),
                      "--local", str(second / "tier0"), *args)
        assert res.returncode != 0, res.stdout + res.stderr
        for needle in ("in use by another writer", socket.gethostname(), f"pid {m1.pid}",
                       str(m1.state_dir), "--takeover"):
            assert needle in res.stderr, (needle, res.stderr)
        assert "Traceback" not in res.stderr
        assert get_lease(seaweed, prefix)["writer_id"] == first["writer_id"]  # type: ignore[index]

        with mounted(second, 1, (*args, "--takeover")) as m2:
            assert "WARNING" in m2.log and "--takeover" in m2.log
            assert get_lease(seaweed, prefix)["writer_id"] == writer_id(m2.state_dir)  # type: ignore[index]
            # Node 1 notices at its next heartbeat and stops writing to the prefix.
            wait_until(lambda: "writer lease of remote tier remote0" in m1.log
                       and "lost" in m1.log, 10, "node 1 to notice the takeover")
            write(m1.mountpoint / "late.bin", os.urandom(MiB))
            wait_until(lambda: "writer lease" in run_cli("status", str(m1.mountpoint)).stdout,
                       20, "node 1's upload refused for want of the lease")
            assert get_lease(seaweed, prefix)["writer_id"] == writer_id(m2.state_dir)  # type: ignore[index]


@needs_fuse
@pytest.mark.allow_log_warnings("moved from")  # node 2 restores node 1's catalog
def test_clean_unmount_releases_the_lease_for_the_next_node(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str]  # noqa: F811
) -> None:
    url, prefix = remote
    args = ("--chunk-size", "1MiB", "--remote", url)
    data = os.urandom(2 * MiB)
    with mounted(tmp_path / "node1", 1, args) as m1:
        write(m1.mountpoint / "f.bin", data)
        assert run_cli("sync", str(m1.mountpoint), "--timeout", "60").returncode == 0
    released = get_lease(seaweed, prefix)
    assert released is not None and released["released"] is True
    with mounted(tmp_path / "node2", 1, args) as m2:
        assert "released by" in m2.log
        assert (m2.mountpoint / "f.bin").read_bytes() == data
        assert get_lease(seaweed, prefix)["writer_id"] == writer_id(m2.state_dir)  # type: ignore[index]


@needs_fuse
def test_stale_lease_is_taken_over(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str]  # noqa: F811
) -> None:
    url, prefix = remote
    put_lease(seaweed, prefix, version=1, writer_id="d" * 32, host="crashed-node", pid=4242,
              state_dir="/var/lib/ckptfs", heartbeat=time.time() - 3600, released=False)
    with mounted(tmp_path, 1, ("--chunk-size", "1MiB", "--remote", url)) as m:
        assert "stale writer lease" in m.log and "crashed-node" in m.log
        assert get_lease(seaweed, prefix)["writer_id"] == writer_id(m.state_dir)  # type: ignore[index]
