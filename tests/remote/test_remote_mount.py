"""A real mount with a remote tier on a real SeaweedFS: upload, sync, outage, crash."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON, mounted, run_cli
from tests.support.s3server import OUTAGE_WARNINGS, SeaweedServer

from ckptfs.catalog import SqliteCatalog
from ckptfs.codec import frame

pytestmark = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)

MiB = 1 << 20


def remote_objects(server: SeaweedServer, prefix: str) -> dict[str, bytes]:
    client = server.client()
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=server.bucket, Prefix=f"{prefix}/chunks/"
    ):
        for o in page.get("Contents") or ():
            out[o["Key"].rsplit("/", 1)[1]] = client.get_object(
                Bucket=server.bucket, Key=o["Key"]
            )["Body"].read()
    client.close()
    return out


def local_chunk_keys(tiers: list[Path]) -> set[str]:
    return {p.name for t in tiers for p in (t / "chunks").glob("*/*")}


def pending_chunks(state_dir: Path) -> int:
    cat = SqliteCatalog(state_dir / "catalog.sqlite", readonly=True)
    try:
        return cat.backlog().chunks
    finally:
        cat.close()


def write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        for off in range(0, len(data), MiB):
            f.write(data[off : off + MiB])


def test_chunks_reach_the_bucket_and_sync_waits_for_them(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str]  # noqa: F811
) -> None:
    url, prefix = remote
    files = {f"ckpt/part{i}.bin": os.urandom(3 * MiB + i) for i in range(3)}
    with mounted(tmp_path, 2, ("--chunk-size", "1MiB", "--remote", url)) as m:
        (m.mountpoint / "ckpt").mkdir()
        for name, data in files.items():
            write(m.mountpoint / name, data)
        res = run_cli("sync", str(m.mountpoint / "ckpt"), "--timeout", "60")
        assert res.returncode == 0, res.stdout + res.stderr
        objects = remote_objects(seaweed, prefix)
        assert set(objects) == local_chunk_keys(m.locals)
        for key, raw in objects.items():
            frame.verify(raw, bytes.fromhex(key))
        status = run_cli("status", str(m.mountpoint))
        assert status.returncode == 0 and "backlog: empty" in status.stdout, status.stdout


@pytest.mark.slow
@pytest.mark.allow_log_warnings(*OUTAGE_WARNINGS)
def test_outage_grows_backlog_and_drains_after_restart(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str]  # noqa: F811
) -> None:
    url, prefix = remote
    with mounted(tmp_path, 2, ("--chunk-size", "1MiB", "--remote", url)) as m:
        # Stop the server while uploads are in flight: right after a close, with the
        # catalog showing chunks still pending.
        for i in range(10):
            write(m.mountpoint / f"before{i}.bin", os.urandom(16 * MiB))
            if pending_chunks(m.state_dir):
                break
        seaweed.stop()
        assert pending_chunks(m.state_dir) > 0
        try:
            data = os.urandom(4 * MiB)
            write(m.mountpoint / "during.bin", data)  # training goes on during the outage
            assert (m.mountpoint / "during.bin").read_bytes() == data
            res = run_cli("sync", str(m.mountpoint / "during.bin"), "--timeout", "2")
            assert res.returncode == 1 and "pending" in res.stderr, res.stderr
            status = run_cli("status", str(m.mountpoint)).stdout
            assert "backlog: " in status and "chunk(s)" in status, status
            assert pending_chunks(m.state_dir) >= 4
        finally:
            seaweed.start()
        res = run_cli("sync", str(m.mountpoint), "--timeout", "90")
        assert res.returncode == 0, res.stdout + res.stderr
        objects = remote_objects(seaweed, prefix)
        assert set(objects) == local_chunk_keys(m.locals)
        for key, raw in objects.items():
            frame.verify(raw, bytes.fromhex(key))


@pytest.mark.slow
@pytest.mark.allow_log_warnings("cleaning up stale mount", *OUTAGE_WARNINGS)
def test_killed_daemon_resumes_its_queue(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str]  # noqa: F811
) -> None:
    url, prefix = remote
    with mounted(tmp_path, 2, ("--chunk-size", "1MiB", "--remote", url)) as m:
        seaweed.stop()
        try:
            data = os.urandom(3 * MiB)
            write(m.mountpoint / "f.bin", data)
            m.kill9()
        finally:
            seaweed.start()
        m.start()  # the queue is in the catalog: the new daemon replays it
        res = run_cli("sync", str(m.mountpoint), "--timeout", "90")
        assert res.returncode == 0, res.stdout + res.stderr
        assert (m.mountpoint / "f.bin").read_bytes() == data
        assert set(remote_objects(seaweed, prefix)) == local_chunk_keys(m.locals)


@pytest.mark.slow
@pytest.mark.allow_log_errors
@pytest.mark.allow_log_warnings("writer lease", "upload failed", "failed, will retry")
def test_wrong_credentials_are_reported_and_data_stays_local(
    tmp_path: Path, remote: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _prefix = remote
    with mounted(tmp_path, 1, ("--chunk-size", "1MiB", "--remote", url)) as m:
        write(m.mountpoint / "old.bin", os.urandom(MiB))
        assert run_cli("sync", str(m.mountpoint), "--timeout", "60").returncode == 0
        m.stop()
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
        m.start()  # an existing node mounts anyway: training must not stop for the remote
        data = os.urandom(2 * MiB)
        write(m.mountpoint / "f.bin", data)
        assert (m.mountpoint / "f.bin").read_bytes() == data
        assert "remote tier remote0 unusable" in m.log
        res = run_cli("sync", str(m.mountpoint), "--timeout", "3")
        assert res.returncode == 1
        status = run_cli("status", str(m.mountpoint)).stdout
        assert "backlog: 2 chunk(s)" in status and "last error" in status, status


@pytest.mark.allow_log_errors  # "remote tier remote0 unusable", "mount failed: the state dir is empty"
@pytest.mark.allow_log_warnings("writer lease")
def test_new_node_with_wrong_credentials_refuses_to_start_empty(
    tmp_path: Path, remote: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _prefix = remote
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    (tmp_path / "mnt").mkdir()
    (tmp_path / "t0").mkdir()
    res = run_cli("mount", str(tmp_path / "mnt"), "--state-dir", str(tmp_path / "state"),
                  "--local", str(tmp_path / "t0"), "--remote", url)
    assert res.returncode != 0
    assert "remote0" in res.stderr and "refusing to start with an empty catalog" in res.stderr


@pytest.mark.slow
@pytest.mark.allow_log_warnings("moved from", "is no longer configured")  # a new node, other tier paths
def test_new_node_restores_everything_durable_from_the_remote_alone(
    tmp_path: Path, remote: tuple[str, str]
) -> None:
    url, _prefix = remote
    files = {"run/ckpt-1/model.bin": os.urandom(3 * MiB + 7), "run/ckpt-1/meta.json": b"{}",
             "run/latest": b"ckpt-1"}
    first = tmp_path / "node1"
    with mounted(first, 2, ("--chunk-size", "1MiB", "--remote", url)) as m:
        (m.mountpoint / "run" / "ckpt-1").mkdir(parents=True)
        for name, data in files.items():
            write(m.mountpoint / name, data)
        os.chmod(m.mountpoint / "run/latest", 0o600)
        os.utime(m.mountpoint / "run/ckpt-1/meta.json", ns=(1_000_000_000, 1_234_567_890_123))
        attrs = {n: os.stat(m.mountpoint / n) for n in files}
        res = run_cli("sync", str(m.mountpoint), "--timeout", "60")
        assert res.returncode == 0, res.stdout + res.stderr
    shutil.rmtree(first)  # every local tier and the state dir are gone
    second = tmp_path / "node2"
    with mounted(second, 1, ("--chunk-size", "1MiB", "--remote", url)) as m:
        assert "restored the catalog" in m.log
        for name, data in files.items():
            p = m.mountpoint / name
            assert p.read_bytes() == data, name
            st = os.stat(p)
            assert (st.st_size, st.st_mode, st.st_mtime_ns) == (
                attrs[name].st_size, attrs[name].st_mode, attrs[name].st_mtime_ns
            ), name


def test_server_refuses_a_body_damaged_after_it_was_checked(s3_tier) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    """The uploader sends the SHA-256 of the frame it verified; a FaultyTier flipping a bit
    on the way makes the real server refuse the object (BadDigest), a retryable error."""
    import base64
    import hashlib

    from ckptfs.errors import TransientTierError
    from ckptfs.testing.tiers import FaultyTier

    data = os.urandom(100_000)
    digest = frame.digest_of(data)
    raw = b"".join(bytes(p) for p in frame.encode([data], digest))
    sha = base64.b64encode(hashlib.sha256(raw).digest()).decode()
    wire = FaultyTier(s3_tier)
    wire.corrupt_puts = True
    with pytest.raises(TransientTierError, match="BadDigest|checksum|digest"):
        wire.put(digest.hex(), [raw], expected_sha256=sha)
    assert s3_tier.get(digest.hex()) is None
    wire.corrupt_puts = False
    wire.put(digest.hex(), [raw], expected_sha256=sha)
    frame.verify(s3_tier.get(digest.hex()) or b"", digest)


@pytest.mark.allow_log_warnings("local tiers full", "local tiers have room again")
def test_local_budget_full_evicts_uploaded_chunks_and_blocks_until_uploads_free_room(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str]  # noqa: F811
) -> None:
    """Local tier capped at 6 chunks; 8 saves of 3 chunks each go through: writers wait for
    uploads when needed, uploaded chunks are evicted, and every file reads back exact."""
    url, prefix = remote
    tier = tmp_path / "nvme0"
    tier.mkdir()
    cfg = tmp_path / "ckptfs.toml"
    cfg.write_text(
        'chunk_size = "1MiB"\nlocal_full_timeout = 120\n'
        f'[[tier]]\nname = "nvme0"\nkind = "local"\npath = "{tier}"\ncapacity = "{6 * (MiB + 64)}"\n'
    )
    saves = {f"step{i}.pt": os.urandom(3 * MiB) for i in range(8)}
    with mounted(tmp_path, 0, ("--config", str(cfg), "--remote", url)) as m:
        for name, data in saves.items():
            write(m.mountpoint / name, data)
        assert sum(p.stat().st_size for p in (tier / "chunks").glob("*/*")) <= 6 * (MiB + 64)
        for name, data in saves.items():
            assert (m.mountpoint / name).read_bytes() == data, name
        assert "evicted" in m.log
        res = run_cli("sync", str(m.mountpoint), "--timeout", "60")
        assert res.returncode == 0, res.stdout + res.stderr
        assert len(remote_objects(seaweed, prefix)) == 8 * 3


@pytest.mark.allow_log_warnings("local tiers full", "local tiers have room again")
def test_a_file_larger_than_the_local_budget_moves_its_chunks_to_the_remote(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str]  # noqa: F811
) -> None:
    """Local tier capped at 4 chunks, one 12-chunk file (uncommitted chunks have no upload
    jobs): the writer's own chunks go to the remote to make room, at once, not after
    local_full_timeout; after a remount the file reads back exact (from the remote)."""
    url, prefix = remote
    tier = tmp_path / "nvme0"
    tier.mkdir()
    cfg = tmp_path / "ckptfs.toml"
    cap = 4 * (MiB + 64)
    cfg.write_text(
        'chunk_size = "1MiB"\nlocal_full_timeout = 600\n'
        f'[[tier]]\nname = "nvme0"\nkind = "local"\npath = "{tier}"\ncapacity = "{cap}"\n'
    )
    data = os.urandom(12 * MiB + 5)
    with mounted(tmp_path, 0, ("--config", str(cfg), "--remote", url)) as m:
        path = m.mountpoint / "big.pt"
        outcome: list[BaseException | None] = []

        def save() -> None:
            try:
                write(path, data)
                outcome.append(None)
            except BaseException as exc:  # reported by the assertion below
                outcome.append(exc)

        started = time.monotonic()
        writer = threading.Thread(target=save, daemon=True)
        writer.start()
        writer.join(120)  # far below local_full_timeout; the mount's cleanup frees a hang
        assert outcome == [None], f"save did not finish in 120 s: {outcome}"
        assert time.monotonic() - started < 120
        assert sum(p.stat().st_size for p in (tier / "chunks").glob("*/*")) <= cap
        assert "uncommitted chunks to the remote tiers" in m.log
        assert path.read_bytes() == data
        res = run_cli("sync", str(m.mountpoint), "--timeout", "60")
        assert res.returncode == 0, res.stdout + res.stderr
        m.stop()
        m.start()
        assert path.read_bytes() == data
        assert len(remote_objects(seaweed, prefix)) == 13


@pytest.mark.allow_log_warnings("writer lease", "moved from")  # node 2 takes over
def test_durability_remote_policy_makes_close_wait_for_a_recoverable_copy(
    tmp_path: Path, remote: tuple[str, str]
) -> None:
    """Under ``durability = "remote"``, once close returns the file is recoverable from the
    bucket alone: no `ckptfs sync` is needed before the node is lost."""
    url, _prefix = remote
    cfg = tmp_path / "ckptfs.toml"
    cfg.write_text('chunk_size = "1MiB"\n[[policy]]\npath = "/final"\ndurability = "remote"\n')
    data = os.urandom(5 * MiB + 3)
    first = tmp_path / "node1"
    with mounted(first, 1, ("--config", str(cfg), "--remote", url)) as m:
        (m.mountpoint / "final").mkdir()
        write(m.mountpoint / "final" / "model.pt", data)
        m.kill9()  # no sync, no clean unmount: the node is lost right after close
    shutil.rmtree(first)
    # The lost node's writer lease is still fresh: the replacement takes it over.
    with mounted(tmp_path / "node2", 1, ("--chunk-size", "1MiB", "--remote", url, "--takeover")) as m:
        assert (m.mountpoint / "final" / "model.pt").read_bytes() == data


@pytest.mark.slow
@pytest.mark.allow_log_warnings("moved from")
def test_a_rename_alone_reaches_the_remote_snapshot(
    tmp_path: Path, remote: tuple[str, str]
) -> None:
    """A namespace-only change (no upload queued: DCP, Lightning and Orbax commit by rename)
    still makes it into the bucket's catalog snapshot, and `ckptfs sync` says so."""
    url, _prefix = remote
    data = os.urandom(2 * MiB)
    first = tmp_path / "node1"
    with mounted(first, 1, ("--chunk-size", "1MiB", "--remote", url)) as m:
        write(m.mountpoint / ".metadata.tmp", data)
        assert run_cli("sync", str(m.mountpoint), "--timeout", "60").returncode == 0
        os.rename(m.mountpoint / ".metadata.tmp", m.mountpoint / ".metadata")
        res = run_cli("sync", str(m.mountpoint), "--timeout", "30")
        assert res.returncode == 0, res.stdout + res.stderr
    shutil.rmtree(first)
    with mounted(tmp_path / "node2", 1, ("--chunk-size", "1MiB", "--remote", url)) as m:
        assert (m.mountpoint / ".metadata").read_bytes() == data
        assert not (m.mountpoint / ".metadata.tmp").exists()
