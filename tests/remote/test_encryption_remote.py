"""Encryption at rest with a real SeaweedFS bucket: objects hold ciphertext only, a flipped
byte in an encrypted frame is healed from the bucket's copy (and with no good copy the
read is EIO), a lost node restores its encrypted namespace from the bucket with the KEK,
and a shred leaves the objects there, unreadable, with a snapshot that holds no key."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.remote.test_remote_mount import remote_objects
from tests.support import encryption as enc
from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON, mounted, run_cli, wait_until
from tests.support.s3server import SeaweedServer

from ckptfs.catalog import SqliteCatalog
from ckptfs.codec import frame
from ckptfs.codec.seal import KEYRING, Cipher
from ckptfs.errors import CorruptChunk

pytestmark = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)


def _sync(path: Path) -> None:
    res = run_cli("sync", str(path), "--timeout", "60", timeout=90)
    assert res.returncode == 0, res.stdout + res.stderr


def _args(cfg: Path, url: str) -> tuple[str, ...]:
    return ("--chunk-size", "1MiB", "--remote", url, "--config", str(cfg))


@pytest.mark.allow_log_errors("is corrupt", "no valid copy", "unreadable")
@pytest.mark.allow_log_warnings("healing it")
def test_bucket_objects_are_ciphertext_and_a_flipped_byte_is_healed_or_eio(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str],
) -> None:
    url, prefix = remote
    kek_path, kek = enc.kek_file(tmp_path / "keys" / "kek")
    cfg = enc.config(tmp_path / "ckptfs.toml", kek_path)
    data = enc.marked(2 * enc.MiB + 77, b"heal")
    lost = enc.marked(enc.MiB + 5, b"lost")
    with mounted(tmp_path / "node", 2, _args(cfg, url)) as m:
        (m.mountpoint / "proj-a").mkdir(mode=0o777, exist_ok=True)  # made at mount
        enc.write(m.mountpoint / "proj-a/f.bin", data)
        enc.write(m.mountpoint / "proj-a/g.bin", lost)
        _sync(m.mountpoint / "proj-a")
        objects = remote_objects(seaweed, prefix)
        cat = enc.open_catalog(m.state_dir)
        try:
            f_ids = enc.chunk_ids(cat, m.mountpoint / "proj-a/f.bin")
            g_ids = enc.chunk_ids(cat, m.mountpoint / "proj-a/g.bin")
            keys = enc.keys_of(cat, kek)
        finally:
            cat.close()
        assert f_ids | g_ids <= set(objects)
        for k in f_ids | g_ids:
            assert frame.parse_header(objects[k]).cipher == Cipher.AES256GCM
            assert enc.MARKER not in objects[k]
        # The local copy of f's first chunk gets a flipped byte in its ciphertext.
        victim = max(sorted(f_ids), key=lambda k: len(objects[k]))  # a whole chunk
        p = enc.frame_path(m.locals, victim)
        good = p.read_bytes()
        bad = bytearray(good)
        bad[frame.HEADER_SIZE + 1000] ^= 0x40
        p.write_bytes(bytes(bad))
        assert (m.mountpoint / "proj-a/f.bin").read_bytes() == data  # served from the bucket
        KEYRING.replace(keys)
        try:
            def healed() -> bool:
                try:
                    frame.verify(enc.frame_path(m.locals, victim).read_bytes(), bytes.fromhex(victim))
                except (CorruptChunk, AssertionError):
                    return False
                return True

            wait_until(healed, 20, "the local copy is healed")
        finally:
            KEYRING.replace([])
        # No good copy anywhere: EIO, never the damaged bytes.
        g0 = sorted(g_ids)[0]
        gp = enc.frame_path(m.locals, g0)
        broken = bytearray(gp.read_bytes())
        broken[-1] ^= 0x01  # the tag
        gp.write_bytes(bytes(broken))
        client = seaweed.client()
        client.put_object(Bucket=seaweed.bucket, Key=f"{prefix}/chunks/{g0}", Body=bytes(broken))
        client.close()
        # A remount: nothing of g is left in the daemon's chunk cache (the checkpoint
        # detectors may have read it after its close).
        m.stop()
        m.start()
        assert enc.read_is_eio(m.mountpoint / "proj-a/g.bin")


@pytest.mark.slow
def test_a_lost_node_restores_its_encrypted_namespace_from_the_bucket_with_the_kek(
    tmp_path: Path, remote: tuple[str, str],
) -> None:
    url, _prefix = remote
    kek_path, _kek = enc.kek_file(tmp_path / "keys" / "kek")
    cfg = enc.config(tmp_path / "ckptfs.toml", kek_path)
    data = enc.marked(3 * enc.MiB + 3, b"restore")
    first = tmp_path / "node1"
    with mounted(first, 2, _args(cfg, url)) as m:
        (m.mountpoint / "proj-a").mkdir(mode=0o777, exist_ok=True)  # made at mount
        (m.mountpoint / "open").mkdir(mode=0o777, exist_ok=True)
        enc.write(m.mountpoint / "proj-a/model.bin", data)
        enc.write(m.mountpoint / "open/plain.bin", data)
        _sync(m.mountpoint)
    shutil.rmtree(first)
    with mounted(tmp_path / "node2", 1, _args(cfg, url)) as m:
        assert "restored the catalog" in m.log
        assert (m.mountpoint / "proj-a/model.bin").read_bytes() == data
        assert (m.mountpoint / "open/plain.bin").read_bytes() == data


@pytest.mark.allow_log_errors("is corrupt", "no valid copy")
def test_a_shred_leaves_the_objects_unreadable_and_the_snapshot_without_the_key(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str],
) -> None:
    url, prefix = remote
    kek_path, kek = enc.kek_file(tmp_path / "keys" / "kek")
    cfg = enc.config(tmp_path / "ckptfs.toml", kek_path)
    data = enc.marked(2 * enc.MiB + 1, b"shred")
    with mounted(tmp_path / "node", 1, _args(cfg, url)) as m:
        (m.mountpoint / "proj-a").mkdir(mode=0o777, exist_ok=True)  # made at mount
        enc.write(m.mountpoint / "proj-a/f.bin", data)
        _sync(m.mountpoint)
        cat = enc.open_catalog(m.state_dir)
        try:
            ids = enc.chunk_ids(cat, m.mountpoint / "proj-a/f.bin")
        finally:
            cat.close()
        before = remote_objects(seaweed, prefix)
        res = run_cli("shred", "/proj-a", "--yes", "--config", str(cfg), "--state-dir",
                      str(m.state_dir), "--timeout", "60", timeout=90)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "no longer holds them" in res.stdout
        after = remote_objects(seaweed, prefix)
        assert all(after[k] == before[k] for k in ids)  # the objects stay, as they were
        # Evict the local copies: the read has only the bucket's.
        for p in (m.locals[0] / "chunks").glob("*/*"):
            if p.name in ids:
                p.unlink()
        wait_until(lambda: enc.read_is_eio(m.mountpoint / "proj-a/f.bin"), 10, "EIO after the shred")
        client = seaweed.client()
        snap = client.get_object(Bucket=seaweed.bucket, Key=f"{prefix}/meta/catalog.snapshot")
        body = snap["Body"].read()
        client.close()
    snap_path = tmp_path / "snap.sqlite"
    snap_path.write_bytes(frame.decode(body))
    restored = SqliteCatalog(snap_path, readonly=True)
    try:
        rows = restored.namespace_keys("/proj-a")
    finally:
        restored.close()
    # The versions that sealed its objects are tombstones there too (the daemon's fresh
    # version for new writes opens none of them).
    assert enc.key_ids(before, ids) <= {r.key_id for r in rows if r.wrapped is None}
    assert kek not in body
