"""A bad object is not an outage, and `ckptfs status` shows what the daemon knows now.

On a SeaweedFS of this module's own (the tests flip bytes in its volume files and stop it):

* a byte flipped inside a stored object makes SeaweedFS fail that GET (after about 13 s of
  its own retries, with a 500) while it serves every other object: the tier reports one
  unreadable object, stays healthy, the read path heals the copy from a good local one, and
  ``fsck --verify`` names the object, checks the others, and ``--repair`` uploads it again;
* a server that stops answering (killed, or stopped mid-request) stays an outage;
* status with the remote down says "unreachable" with the last error and no rate or ETA;
  with a wrong secret "access denied"; a node restored from a bucket shows what it holds.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.store.test_upload import wait_backlog_empty
from tests.support.freeze import freeze
from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON, Mount, mounted, run_cli, wait_until
from tests.support.s3fixtures import SKIP_REASON as NO_WEED
from tests.support.s3fixtures import remove_prefix, tier_config
from tests.support.s3server import ACCESS_KEY, SECRET_KEY, SeaweedServer, find_weed, running_seaweed
from tests.support.tier_conformance import framed, joined
from tests.vfs.test_vfs import CS, catalog_of, make_fs, uploader_of, write_file

from ckptfs.catalog import ChunkRef
from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.codec import frame
from ckptfs.errors import ObjectUnreadable, TransientTierError
from ckptfs.testing.tiers import MemoryTier
from ckptfs.tiers.s3 import S3Tier

pytestmark = pytest.mark.slow  # SeaweedFS answers a bad object after ~13 s of retries

MiB = 1 << 20
needs_fuse = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)


@pytest.fixture(scope="module")
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """A SeaweedFS for this module alone: its tests damage objects and stop it."""
    weed = find_weed()
    if weed is None:
        pytest.skip(NO_WEED)
    with running_seaweed(tmp_path_factory.mktemp("own-seaweed"), 0.5, weed=weed) as server:
        yield server


@pytest.fixture
def server(own_server: SeaweedServer) -> SeaweedServer:
    own_server.start()  # a no-op while it runs; brings it back if a test left it down
    return own_server


@pytest.fixture
def own_remote(server: SeaweedServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    prefix = f"h-{uuid.uuid4().hex[:10]}"
    yield f"s3://{server.bucket}/{prefix}?endpoint={server.endpoint}", prefix
    if server.proc is not None:
        remove_prefix(server, server.bucket, prefix)


def flip_stored_byte(server: SeaweedServer, needle: bytes) -> None:
    """Flip one bit of the single copy of ``needle`` in the server's volume files: the
    object holding it is damaged at rest, as by a bad disk."""
    hits = []
    for path in sorted(server.data_dir.rglob("*.dat")):
        at = path.read_bytes().find(needle)
        if at >= 0:
            hits.append((path, at))
    assert len(hits) == 1, f"the pattern is stored {len(hits)} times: {hits}"
    path, at = hits[0]
    with open(path, "r+b") as f:
        f.seek(at + len(needle) // 2)
        byte = f.read(1)
        f.seek(at + len(needle) // 2)
        f.write(bytes([byte[0] ^ 0x10]))


def object_body(server: SeaweedServer, prefix: str, key: str) -> bytes:
    client = server.client()
    try:
        return bytes(client.get_object(Bucket=server.bucket, Key=f"{prefix}/chunks/{key}")["Body"].read())
    finally:
        client.close()


def status_json(m: Mount) -> dict[str, Any]:
    res = run_cli("status", "--state-dir", str(m.state_dir), "--json")
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout))


def tier_of(s: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in s["tiers"] if t["name"] == name)


def plain_line(m: Mount, prefix: str) -> tuple[str, str]:
    out = run_cli("status", "--state-dir", str(m.state_dir)).stdout
    return next(line for line in out.splitlines() if line.startswith(prefix)), out


def write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


# -- the tier ----------------------------------------------------------------------------------


def test_a_flipped_byte_on_the_server_is_one_bad_object_not_an_outage(
    server: SeaweedServer,
) -> None:
    # The daemon's timeouts: SeaweedFS answers a damaged object with a 500 after its retries.
    t = S3Tier(tier_config(server), session=server.session())
    try:
        stored = dict(framed(os.urandom(300_000)) for _ in range(3))
        for key, parts in stored.items():
            t.put(key, parts)
        bad, *good = sorted(stored)
        flip_stored_byte(server, joined(stored[bad])[frame.HEADER_SIZE + 1000:][:64])
        with pytest.raises(ObjectUnreadable, match="cannot be read although the endpoint") as ei:
            t.get(bad)
        assert ei.value.errno == errno.EIO
        for key in good:
            assert t.get(key) == joined(stored[key])
        health = t.health.snapshot()
        assert health["state"] == "healthy" and health["consecutive_failures"] == 0, health
    finally:
        remove_prefix(server, server.bucket, t.prefix)
        t.close()


def test_a_server_that_stops_answering_mid_request_is_an_outage_not_a_bad_object(
    server: SeaweedServer,
) -> None:
    t = S3Tier(tier_config(server), session=server.session(), connect_timeout=1, read_timeout=2)
    try:
        key, parts = framed(os.urandom(100_000))
        t.put(key, parts)
        assert server.pid is not None
        freeze(server.pid)  # connections are accepted, nothing answers
        try:
            with pytest.raises(TransientTierError) as ei:
                t.get(key)
            assert not isinstance(ei.value, ObjectUnreadable), ei.value
            health = t.health.snapshot()
            assert health["state"] != "healthy" and health["consecutive_failures"] == 1
        finally:
            os.kill(server.pid, signal.SIGCONT)
        server.kill()  # gone: connections refused
        try:
            with pytest.raises(TransientTierError, match="cannot reach endpoint") as ei:
                t.get(key)
            assert not isinstance(ei.value, ObjectUnreadable)
            health = t.health.snapshot()
            assert health["state"] == "unreachable" and health["consecutive_failures"] == 2
            assert "cannot reach endpoint" in str(health["last_error"])
        finally:
            server.start()
        assert t.get(key) == joined(parts)
        assert t.health.snapshot()["state"] == "healthy"
    finally:
        remove_prefix(server, server.bucket, t.prefix)
        t.close()


# -- the read path -----------------------------------------------------------------------------


@pytest.mark.allow_log_errors
@pytest.mark.allow_log_warnings("unreadable; healing it")
async def test_a_read_heals_an_unreadable_remote_copy_from_the_local_one(
    tmp_path: Path, server: SeaweedServer,
) -> None:
    r_tier = S3Tier(tier_config(server, name="r"), session=server.session())
    data = os.urandom(2 * CS)
    try:
        async with make_fs(tmp_path, [MemoryTier("l"), r_tier]) as fs:
            await write_file(fs, b"f", data)
            await wait_backlog_empty(fs, timeout=60)
            ino = (await fs.lookup(ROOT_INODE, b"f")).ino
            ref = (await fs.db(fs.catalog.extents, ino))[0]
            assert set(ref.tiers) == {"l", "r"}
            await trio.to_thread.run_sync(flip_stored_byte, server, data[CS // 2:][:64])
            uploaded = uploader_of(fs).uploaded_bytes
            # A reader whose view names only the remote copy (the local one came later).
            got = await fs.store.read(ChunkRef(ref.digest, ref.length, ("r",)))
            assert bytes(got) == data[:CS]
            stats = fs.store.stats
            assert stats.get("unreadable_copies") == 1 and not stats.is_degraded("r")
            # Healed: the copy was marked bad and uploaded again from the local copy.
            with trio.fail_after(60):
                while uploader_of(fs).uploaded_bytes == uploaded or "r" not in await fs.db(
                    catalog_of(fs).replica_tiers, ref.digest
                ):
                    await trio.sleep(0.05)  # polling the catalog, with a deadline
            raw = await trio.to_thread.run_sync(r_tier.get, ref.key)
            assert raw is not None
            assert frame.decode(raw, ref.digest) == data[:CS]
            assert r_tier.health.snapshot()["state"] == "healthy"
            assert stats.get("heals") >= 1
    finally:
        remove_prefix(server, server.bucket, r_tier.prefix)
        r_tier.close()


@needs_fuse
@pytest.mark.allow_log_errors
@pytest.mark.allow_log_warnings("moved from",  # node 2 restores node 1's catalog
                                "scrub: chunk")  # its scrubber finds the bad object too
def test_a_restored_node_gets_eio_for_the_bad_object_and_keeps_using_the_remote(
    tmp_path: Path, server: SeaweedServer, own_remote: tuple[str, str],
) -> None:
    url, _prefix = own_remote
    bad_file, good_file = os.urandom(2 * MiB), os.urandom(2 * MiB + 9)
    with mounted(tmp_path / "node1", 1, ("--chunk-size", "1MiB", "--remote", url)) as m:
        write(m.mountpoint / "bad.bin", bad_file)
        write(m.mountpoint / "good.bin", good_file)
        assert run_cli("sync", str(m.mountpoint), "--timeout", "60").returncode == 0
    flip_stored_byte(server, bad_file[MiB + MiB // 2:][:64])  # its second chunk
    # A new node: every chunk comes from the remote.
    with mounted(tmp_path / "node2", 1, ("--chunk-size", "1MiB", "--remote", url)) as m:
        with open(m.mountpoint / "bad.bin", "rb") as f:
            assert f.read(MiB) == bad_file[:MiB]
            with pytest.raises(OSError) as ei:
                f.read(MiB)  # never wrong bytes
            assert ei.value.errno == errno.EIO
        assert (m.mountpoint / "good.bin").read_bytes() == good_file
        s = wait_until(lambda: (lambda s: s if s["counters"].get("unreadable_copies") else None)(
            status_json(m)), what="the unreadable copy counted")
        t = tier_of(s, "remote0")
        assert t["state"] == "healthy" and not t["consecutive_failures"], t
        line, _out = plain_line(m, "tier remote0")
        assert "healthy" in line, line


# -- fsck ----------------------------------------------------------------------------------------


@needs_fuse
def test_fsck_names_the_unreadable_object_checks_the_others_and_repair_uploads_it_again(
    tmp_path: Path, server: SeaweedServer, own_remote: tuple[str, str],
) -> None:
    url, prefix = own_remote
    a, b = os.urandom(2 * MiB), os.urandom(3 * MiB + 5)
    bad = frame.digest_of(a[:MiB]).hex()
    with mounted(tmp_path, 1, ("--chunk-size", "1MiB", "--remote", url)) as m:
        write(m.mountpoint / "a.bin", a)
        write(m.mountpoint / "b.bin", b)
        assert run_cli("sync", str(m.mountpoint), "--timeout", "60").returncode == 0
        m.stop()
        flip_stored_byte(server, a[MiB // 2:][:64])

        res = run_cli("fsck", "--state-dir", str(m.state_dir), "--verify", timeout=180)
        out = res.stdout + res.stderr
        assert res.returncode == 1, out
        assert f"unreadable chunk {bad[:16]} on remote tier remote0" in out, out
        assert "cannot be reached" not in out and "checked: remote0" in out, out
        assert out.count("on remote tier remote0") == 1, out  # the other 5 objects are fine

        res = run_cli("fsck", "--state-dir", str(m.state_dir), "--verify", "--repair", timeout=180)
        out = res.stdout + res.stderr
        assert res.returncode == 0, out
        assert "1 upload(s) re-queued" in out, out

        m.start()  # the daemon uploads the good local copy again
        assert run_cli("sync", str(m.mountpoint), "--timeout", "60").returncode == 0
        assert (m.mountpoint / "a.bin").read_bytes() == a
        assert frame.decode(object_body(server, prefix, bad), bytes.fromhex(bad)) == a[:MiB]
        m.stop()
        res = run_cli("fsck", "--state-dir", str(m.state_dir), "--verify", timeout=180)
        assert res.returncode == 0 and "fsck: clean" in res.stdout, res.stdout + res.stderr


# -- status --------------------------------------------------------------------------------------


@needs_fuse
@pytest.mark.allow_log_warnings("upload failed", "failed, will retry")  # the outage
def test_status_with_the_remote_down_says_unreachable_with_no_rate_or_eta(
    tmp_path: Path, server: SeaweedServer, own_remote: tuple[str, str],
) -> None:
    url, _prefix = own_remote
    with mounted(tmp_path, 1, ("--chunk-size", "1MiB", "--remote", url)) as m:
        write(m.mountpoint / "f.bin", os.urandom(8 * MiB))
        assert run_cli("sync", str(m.mountpoint), "--timeout", "60").returncode == 0
        up = wait_until(lambda: (lambda s: s if tier_of(s, "remote0")["stored_bytes"] else None)(
            status_json(m)), what="remote bytes in status")
        assert tier_of(up, "remote0")["state"] == "healthy"
        assert tier_of(up, "remote0")["stored_bytes"] == 8 * MiB
        server.kill()
        try:
            write(m.mountpoint / "g.bin", os.urandom(4 * MiB))  # uploads fail from now on

            def down() -> dict[str, Any] | None:
                s = status_json(m)
                t = tier_of(s, "remote0")
                ok = t["state"] == "unreachable" and s["backlog"]["upload_rate_bytes_s"] == 0
                return s if ok else None

            s = wait_until(down, timeout=60, what="remote0 unreachable with a zero rate")
            t = tier_of(s, "remote0")
            assert "cannot reach endpoint" in t["last_error"], t
            assert t["last_error_age_s"] < 60 and t["consecutive_failures"] >= 1, t
            assert t["retry_in_s"] is not None and t["backoff_s"] > 0, t
            b = s["backlog"]
            assert b["chunks"] >= 4 and b["eta_s"] is None and b["remote_failing"] == ["remote0"]
            line, out = plain_line(m, "tier remote0")
            assert "unreachable" in line and "last error" in line and "healthy" not in line, line
            assert "ETA" not in out and "uploading at" not in out and "rate now" not in out, out
        finally:
            server.start()
        assert run_cli("sync", str(m.mountpoint), "--timeout", "90").returncode == 0
        wait_until(lambda: tier_of(status_json(m), "remote0")["state"] == "healthy",
                   timeout=60, what="remote0 healthy again")


@needs_fuse
@pytest.mark.allow_log_errors  # "remote tier remote0 unusable: ... access denied"
@pytest.mark.allow_log_warnings("writer lease")
def test_status_says_access_denied_for_a_wrong_secret(
    tmp_path: Path, remote: tuple[str, str], monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    url, _prefix = remote
    with mounted(tmp_path, 1, ("--chunk-size", "1MiB", "--remote", url)) as m:
        write(m.mountpoint / "old.bin", os.urandom(MiB))
        assert run_cli("sync", str(m.mountpoint), "--timeout", "60").returncode == 0
        m.stop()
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
        m.start()
        s = wait_until(lambda: (lambda s: s if tier_of(s, "remote0")["state"] == "access denied"
                                else None)(status_json(m)), what="remote0 access denied")
        t = tier_of(s, "remote0")
        assert "secret key does not match" in t["last_error"], t
        line, _out = plain_line(m, "tier remote0")
        assert "access denied" in line and "healthy" not in line, line


@needs_fuse
@pytest.mark.allow_log_warnings("moved from")  # node 2 restores node 1's catalog
def test_a_node_restored_from_the_bucket_shows_what_the_remote_and_local_tiers_hold(
    tmp_path: Path, remote: tuple[str, str],  # noqa: F811
) -> None:
    url, _prefix = remote
    data = os.urandom(3 * MiB + 7)
    with mounted(tmp_path / "node1", 1, ("--chunk-size", "1MiB", "--remote", url)) as m:
        write(m.mountpoint / "model.bin", data)
        assert run_cli("sync", str(m.mountpoint), "--timeout", "60").returncode == 0
    with mounted(tmp_path / "node2", 1, ("--chunk-size", "1MiB", "--remote", url)) as m:
        assert "restored the catalog" in m.log
        s = status_json(m)
        assert tier_of(s, "remote0")["stored_bytes"] == len(data)
        assert tier_of(s, "remote0")["stored_chunks"] == 4
        assert tier_of(s, "remote0")["capacity"]["used"] == len(data)
        assert tier_of(s, "local0")["stored_bytes"] == 0
        line, _out = plain_line(m, "tier remote0")
        assert "4 chunk(s), 3.0 MiB stored" in line, line
        assert (m.mountpoint / "model.bin").read_bytes() == data  # staged by copy-back
        wait_until(lambda: tier_of(status_json(m), "local0")["stored_bytes"] == len(data),
                   what="the staged local copies in status")
