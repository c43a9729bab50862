"""One writer per bucket prefix: the writer lease (ckptfs/upload/lease.py) on a real SeaweedFS.

The lease logic first against S3Tier objects (two "nodes" on one prefix, no FUSE), then with
real mounts: a second state dir is refused while the first is mounted, ``--takeover`` wins
(and the first node stops writing), a clean unmount lets the next node in, and a stale
lease is taken over.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON, mounted, run_cli
from tests.support.s3fixtures import remove_prefix
from tests.support.s3server import ACCESS_KEY, SECRET_KEY, SeaweedServer

from ckptfs.errors import ConfigError, PermanentTierError, TransientTierError
from ckptfs.tiers.s3 import PreconditionFailed, S3Tier
from ckptfs.upload.lease import (
    LEASE_NAME,
    Lease,
    LeaseConflict,
    LeaseTiming,
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
