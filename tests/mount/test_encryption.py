"""Encryption at rest on real mounts (docs/governance.md, "Encryption at rest and keys"):
no plaintext in an encrypted namespace's frames, no deduplication across namespaces (and
as before outside them), the KEK checks at mount, rotation and crypto-shredding, and no
key material in the log or the status."""

from __future__ import annotations

import datetime
import errno
import json
import os
from pathlib import Path

import pytest

from tests.conftest import CkptFactory
from tests.support import encryption as enc
from tests.support.mountutil import run_cli, wait_until

from ckptfs.codec import frame
from ckptfs.codec.seal import KEYRING, Cipher
from ckptfs.errors import CorruptChunk

ARGS = ("--chunk-size", "1MiB")


def _args(cfg: Path) -> tuple[str, ...]:
    return (*ARGS, "--config", str(cfg))


def _layout(m_point: Path) -> None:
    for d in ("proj-a", "proj-b", "open", "elsewhere"):
        (m_point / d).mkdir(mode=0o777, exist_ok=True)  # namespace roots: made at mount


def test_encrypted_frames_hold_no_plaintext_and_dedup_stays_inside_a_namespace(
    ckpt_factory: CkptFactory, tmp_path: Path,
) -> None:
    kek_path, kek = enc.kek_file(tmp_path / "keys" / "kek")
    cfg = enc.config(tmp_path / "ckptfs.toml", kek_path)
    big, small = enc.marked(3 * enc.MiB + 4321), enc.marked(5000, b"small")
    m = ckpt_factory.mount(extra_args=_args(cfg))
    _layout(m.mountpoint)
    paths = {n: m.mountpoint / n for n in ("proj-a/w.bin", "proj-b/w.bin", "open/w1.bin",
                                           "open/w2.bin", "elsewhere/w.bin")}
    for p in paths.values():
        enc.write(p, big)
    enc.write(m.mountpoint / "proj-a/small.json", small)  # a small frame: buffered, not staged
    for p in paths.values():
        assert p.read_bytes() == big
    assert (m.mountpoint / "proj-a/small.json").read_bytes() == small
    raw = enc.frames(m.locals)
    cat = enc.open_catalog(m.state_dir)
    try:
        ids = {n: enc.chunk_ids(cat, p) for n, p in paths.items()}
        ids["proj-a/small.json"] = enc.chunk_ids(cat, m.mountpoint / "proj-a/small.json")
        keys = enc.keys_of(cat, kek)
        status = run_cli("status", str(m.mountpoint), "--json")
    finally:
        cat.close()
    sealed = ids["proj-a/w.bin"] | ids["proj-b/w.bin"] | ids["proj-a/small.json"]
    for k in sealed:
        head = frame.parse_header(raw[k])
        assert head.cipher == Cipher.AES256GCM and head.key_id != 0, k
        assert enc.MARKER not in raw[k], f"plaintext in sealed frame {k[:16]}"
    # Equal plaintext in two encrypted namespaces: unrelated chunks.
    assert not ids["proj-a/w.bin"] & ids["proj-b/w.bin"]
    assert enc.key_ids(raw, ids["proj-a/w.bin"]) != enc.key_ids(raw, ids["proj-b/w.bin"])
    # Outside encrypted namespaces, as before: plain frames, one copy of equal content,
    # named by the plain blake3 of the chunk.
    plain = ids["open/w1.bin"] | ids["elsewhere/w.bin"]
    assert ids["open/w1.bin"] == ids["open/w2.bin"] == ids["elsewhere/w.bin"]
    assert all(frame.parse_header(raw[k]).cipher == Cipher.NONE for k in plain)
    assert frame.digest_of(big[: enc.MiB]).hex() in plain
    assert not plain & sealed
    # No key material in the catalog in clear, the log or the status.
    assert {k.namespace for k in keys} == {"/proj-a", "/proj-b"}
    assert status.returncode == 0, status.stderr
    stats = (m.state_dir / "stats.json").read_bytes() if (m.state_dir / "stats.json").exists() else b""
    catalog_bytes = (m.state_dir / "catalog.sqlite").read_bytes()
    secrets = [kek] + [k.data_key for k in keys] + [k.id_key for k in keys]
    for secret in secrets:
        for text in (m.log.encode(), status.stdout.encode(), stats, catalog_bytes):
            assert secret not in text and secret.hex().encode() not in text


@pytest.mark.allow_log_errors  # "mount refused: keys.kek_file: ..."
def test_a_kek_file_others_can_read_or_of_the_wrong_size_refuses_the_mount(tmp_path: Path) -> None:
    for name, data, mode, why in (("readable", None, 0o644, "mode 0644"),
                                  ("short", os.urandom(16), 0o600, "16 bytes")):
        kek_path, _ = enc.kek_file(tmp_path / "keys" / name, data, mode)
        cfg = enc.config(tmp_path / f"{name}.toml", kek_path)
        base = tmp_path / name
        tier = base / "tier0"
        tier.mkdir(parents=True)
        (base / "mnt").mkdir()
        res = run_cli("mount", str(base / "mnt"), "--state-dir", str(base / "state"), "--local",
                      str(tier), "--allow-shared-device", *_args(cfg), timeout=60)
        assert res.returncode == 2, res.stderr
        assert "keys.kek_file" in res.stderr and why in res.stderr, res.stderr
        assert not os.path.ismount(base / "mnt")


@pytest.mark.allow_log_errors  # the mount with the old KEK is refused
@pytest.mark.allow_log_warnings("could not reload the namespace keys")  # the KEK changed under it
def test_rotation_seals_new_writes_with_the_new_version_and_old_files_stay_readable(
    ckpt_factory: CkptFactory, tmp_path: Path,
) -> None:
    kek_path, kek = enc.kek_file(tmp_path / "keys" / "kek")
    cfg = enc.config(tmp_path / "ckptfs.toml", kek_path)
    old, new = enc.marked(2 * enc.MiB + 1, b"old"), enc.marked(2 * enc.MiB + 2, b"new")
    m = ckpt_factory.mount(extra_args=_args(cfg))
    _layout(m.mountpoint)
    enc.write(m.mountpoint / "proj-a/old.bin", old)
    res = run_cli("rekey", "--config", str(cfg), "--state-dir", str(m.state_dir),
                  "--namespace", "/proj-a")
    assert res.returncode == 0, res.stderr
    assert "key version 2" in res.stdout
    wait_until(lambda: "keys loaded: 3 live key version(s)" in m.log, 10, "the daemon reloads")
    enc.write(m.mountpoint / "proj-a/new.bin", new)
    cat = enc.open_catalog(m.state_dir)
    try:
        rows = {(r.namespace, r.version): r.key_id for r in cat.namespace_keys()}
        old_ids = enc.chunk_ids(cat, m.mountpoint / "proj-a/old.bin")
        new_ids = enc.chunk_ids(cat, m.mountpoint / "proj-a/new.bin")
    finally:
        cat.close()
    raw = enc.frames(m.locals)
    assert enc.key_ids(raw, old_ids) == {rows[("/proj-a", 1)]}
    assert enc.key_ids(raw, new_ids) == {rows[("/proj-a", 2)]}
    assert (m.mountpoint / "proj-a/old.bin").read_bytes() == old
    # A new KEK: every key rewrapped; the mount needs the new one from then on.
    new_path, new_kek = enc.kek_file(tmp_path / "keys" / "kek2")
    res = run_cli("rekey", "--config", str(cfg), "--state-dir", str(m.state_dir),
                  "--new-kek-file", str(new_path))
    assert res.returncode == 0, res.stderr
    m.stop()
    res = run_cli("mount", str(m.mountpoint), *m.args(), timeout=60)
    assert res.returncode == 2 and "does not unwrap with this KEK" in res.stderr, res.stderr
    m.extra_args = _args(enc.config(tmp_path / "ckptfs2.toml", new_path))
    m.start()
    assert (m.mountpoint / "proj-a/old.bin").read_bytes() == old
    assert (m.mountpoint / "proj-a/new.bin").read_bytes() == new
    assert kek != new_kek


@pytest.mark.allow_log_errors
def test_shredding_makes_every_frame_unreadable_while_the_frames_stay(
    ckpt_factory: CkptFactory, tmp_path: Path,
) -> None:
    kek_path, kek = enc.kek_file(tmp_path / "keys" / "kek")
    cfg = enc.config(tmp_path / "ckptfs.toml", kek_path)
    data, other = enc.marked(3 * enc.MiB + 5, b"a"), enc.marked(enc.MiB + 9, b"b")
    m = ckpt_factory.mount(extra_args=_args(cfg))
    _layout(m.mountpoint)
    enc.write(m.mountpoint / "proj-a/read-before.bin", data)
    enc.write(m.mountpoint / "proj-a/never-read.bin", data[::-1])
    enc.write(m.mountpoint / "proj-b/kept.bin", other)
    enc.write(m.mountpoint / "open/plain.bin", other)
    assert (m.mountpoint / "proj-a/read-before.bin").read_bytes() == data  # in the chunk cache
    cat = enc.open_catalog(m.state_dir)
    try:
        ids = (enc.chunk_ids(cat, m.mountpoint / "proj-a/read-before.bin")
               | enc.chunk_ids(cat, m.mountpoint / "proj-a/never-read.bin"))
    finally:
        cat.close()
    before = enc.frames(m.locals)
    res = run_cli("shred", "/proj-a", "--config", str(cfg), "--state-dir", str(m.state_dir))
    assert res.returncode == 2 and "--yes" in res.stderr  # asks for confirmation
    res = run_cli("shred", "/proj-a", "--config", str(cfg), "--state-dir", str(m.state_dir),
                  "--yes")
    assert res.returncode == 0, res.stderr
    wait_until(lambda: "shredded in the catalog: forgotten" in m.log, 10, "the daemon forgets")
    # The kernel's page cache is not ckptfs's to empty (docs/governance.md): drop it here.
    for name in ("read-before.bin", "never-read.bin"):
        with open(m.mountpoint / "proj-a" / name, "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        assert enc.read_is_eio(m.mountpoint / "proj-a" / name), name
    assert (m.mountpoint / "proj-b/kept.bin").read_bytes() == other
    assert (m.mountpoint / "open/plain.bin").read_bytes() == other
    after = enc.frames(m.locals)
    assert all(after.get(k) == before[k] for k in ids)  # every frame is still there
    cat = enc.open_catalog(m.state_dir)
    try:
        rows = cat.namespace_keys("/proj-a")
        remaining = enc.keys_of(cat, kek)
    finally:
        cat.close()
    # Every version that sealed its frames is a tombstone (the daemon made a fresh one for
    # new writes, which opens none of them).
    assert enc.key_ids(before, ids) <= {r.key_id for r in rows if r.wrapped is None}
    assert any(r.wrapped is not None for r in rows)
    KEYRING.replace(remaining)  # every key that is left, and the KEK: none opens them
    try:
        for k in ids:
            with pytest.raises(CorruptChunk):
                frame.verify(after[k], bytes.fromhex(k))
    finally:
        KEYRING.replace([])
    ckpt_factory.remount(m)
    assert enc.read_is_eio(m.mountpoint / "proj-a/never-read.bin")
    assert (m.mountpoint / "proj-b/kept.bin").read_bytes() == other
    # The namespace gets a fresh key for new data.
    enc.write(m.mountpoint / "proj-a/after.bin", data)
    assert (m.mountpoint / "proj-a/after.bin").read_bytes() == data
    status = json.loads(run_cli("status", str(m.mountpoint), "--json").stdout or "{}")
    assert status


@pytest.mark.allow_log_errors
def test_a_namespace_past_its_expiry_is_shredded_by_the_daemon(
    ckpt_factory: CkptFactory, tmp_path: Path,
) -> None:
    kek_path, _ = enc.kek_file(tmp_path / "keys" / "kek")
    at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=8)
    cfg = enc.config(tmp_path / "ckptfs.toml", kek_path, encrypted=("/proj-b",))
    cfg.write_text(cfg.read_text() + f'[[namespace]]\npath = "/proj-a"\nuids = [0]\n'
                   f'encrypt = true\nexpires = "{at.isoformat()}"\n')
    data = enc.marked(enc.MiB + 3, b"expiring")
    m = ckpt_factory.mount(extra_args=_args(cfg))
    _layout(m.mountpoint)
    enc.write(m.mountpoint / "proj-a/f.bin", data)
    enc.write(m.mountpoint / "proj-b/f.bin", data)
    wait_until(lambda: "namespace /proj-a expired" in m.log, 20, "the expiry")
    wait_until(lambda: "shredded in the catalog: forgotten" in m.log, 10, "forgotten")
    assert enc.read_is_eio(m.mountpoint / "proj-a/f.bin")
    assert (m.mountpoint / "proj-b/f.bin").read_bytes() == data
    with pytest.raises(OSError) as info:  # no new key for an expired namespace
        enc.write(m.mountpoint / "proj-a/g.bin", data)
        os.sync()
    assert info.value.errno == errno.EIO


def test_an_overwritten_chunk_of_an_encrypted_file_is_sealed_under_its_keyed_id(
    ckpt_factory: CkptFactory, tmp_path: Path,
) -> None:
    """A chunk written again before it is full is staged in place (vfs/chunkbuffer.py);
    its id must still be the namespace's keyed one, or the committed file is unreadable
    (a regression of the one-pass save path, found by the direct path's test)."""
    kek_path, _kek = enc.kek_file(tmp_path / "keys" / "kek")
    cfg = enc.config(tmp_path / "ckptfs.toml", kek_path)
    m = ckpt_factory.mount(extra_args=_args(cfg))
    _layout(m.mountpoint)
    path = m.mountpoint / "proj-a" / "rewritten.bin"
    data = bytearray(enc.marked(enc.MiB + 300_000))
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, data[:400_000])  # chunk 0, not yet full: in memory
        patch = os.urandom(50_000)
        os.pwrite(fd, patch, 100_000)  # an overwrite inside it: staged in place
        data[100_000:150_000] = patch
        os.pwrite(fd, data[400_000:], 400_000)
    finally:
        os.close(fd)
    ckpt_factory.remount(m)  # nothing cached in the daemon or the kernel
    assert path.read_bytes() == bytes(data)  # every chunk verified against its keyed id
