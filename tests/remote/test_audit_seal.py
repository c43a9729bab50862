"""Seals of the audit log on a real SeaweedFS (upload/seal.py, docs/governance.md "Audit
log"): ``ckptfs audit seal`` and the daemon's periodic seal store the signed head under
``<prefix>/meta/audit/seals/``, create-only (a second PUT of the same name is refused by the
server); ``ckptfs audit verify`` checks the signatures and finds the newest records deleted
after a seal; a node restored from the bucket continues the chain; a signing key readable
by others refuses the mount, naming the key."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import botocore.exceptions
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON, Mount, mounted, run_cli, wait_until
from tests.support.s3server import SeaweedServer

from ckptfs.catalog.audit import AuditEntry
from ckptfs.tiers.s3 import PreconditionFailed, S3Tier
from ckptfs.upload.seal import SEALS_DIR, make_seal, parse_seal, seal_name, store_seal

pytestmark = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)


def keypair(tmp_path: Path, mode: int = 0o600) -> tuple[Path, Path, Ed25519PrivateKey]:
    """A signing key file (PEM) outside any state dir and its public key file."""
    key = Ed25519PrivateKey.generate()
    priv = tmp_path / "keys" / "audit.pem"
    priv.parent.mkdir(parents=True, exist_ok=True)
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    os.chmod(priv, mode)
    pub = tmp_path / "keys" / "audit.pub"
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return priv, pub, key


def seal_keys(seaweed: SeaweedServer, prefix: str) -> list[str]:
    client = seaweed.client()
    try:
        resp = client.list_objects_v2(Bucket=seaweed.bucket, Prefix=f"{prefix}/meta/{SEALS_DIR}/")
        return sorted(o["Key"] for o in resp.get("Contents") or ())
    finally:
        client.close()


def get(seaweed: SeaweedServer, key: str) -> bytes:
    client = seaweed.client()
    try:
        return bytes(client.get_object(Bucket=seaweed.bucket, Key=key)["Body"].read())
    finally:
        client.close()


def config(tmp_path: Path, priv: Path, interval: float = 3600) -> Path:
    cfg = tmp_path / "ckptfs.toml"
    cfg.write_text(f'[audit]\nsigning_key_file = "{priv}"\nseal_interval = {interval}\n')
    return cfg


def head_seq(m: Mount) -> int:
    res = run_cli("audit", "tail", str(m.mountpoint), "-n", "1", "--json")
    assert res.returncode == 0, res.stderr
    return int(json.loads(res.stdout)["seq"])


def test_seal_stores_the_signed_head_create_only_and_verify_checks_it(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str]
) -> None:
    url, prefix = remote
    priv, pub, key = keypair(tmp_path)
    cfg = config(tmp_path, priv)
    with mounted(tmp_path, 1, ("--remote", url, "--config", str(cfg))) as m:
        (m.mountpoint / "a.bin").write_bytes(b"a" * 1000)
        seq = head_seq(m)
        res = run_cli("audit", "seal", str(m.mountpoint), "--config", str(cfg))
        assert res.returncode == 0 and f"sealed record {seq}" in res.stdout, res.stdout + res.stderr
        name = f"{prefix}/meta/{seal_name(seq)}"
        assert name in seal_keys(seaweed, prefix)
        seal = parse_seal(get(seaweed, name))
        assert seal.seq == seq and seal.valid_under(key.public_key())
        # Create-only: the server refuses a second PUT of that name (If-None-Match: *).
        client = seaweed.client()
        try:
            with pytest.raises(botocore.exceptions.ClientError) as err:
                client.put_object(Bucket=seaweed.bucket, Key=name, Body=b"{}", IfNoneMatch="*")
            assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
        finally:
            client.close()
        assert parse_seal(get(seaweed, name)) == seal  # unchanged
        res = run_cli("audit", "verify", str(m.mountpoint), "--public-key", str(pub))
        assert res.returncode == 0 and "intact" in res.stdout and "seal(s) match" in res.stdout, \
            res.stdout + res.stderr


def test_store_seal_is_refused_over_another_head(
    tmp_path: Path, s3_tier_factory: Callable[..., S3Tier]
) -> None:
    tier = s3_tier_factory(prefix="seals-unit")
    _, _, key = keypair(tmp_path)
    e = AuditEntry(3, 1, "n", 0, 0, "create", "/x", "{}", b"\x00" * 32, b"\x01" * 32)
    seal = make_seal(key, "fs", e, "n", 5)
    assert store_seal(tier, seal) is True
    assert store_seal(tier, seal) is False  # the same head again: already sealed
    other = make_seal(key, "fs", AuditEntry(**{**e.__dict__, "digest": b"\x02" * 32}), "n", 6)
    with pytest.raises(Exception, match="already names digest"):
        store_seal(tier, other)
    with pytest.raises(PreconditionFailed):
        tier.put_meta_if(seal_name(3), b"{}", etag=None)


def test_the_daemon_seals_periodically_and_a_deleted_tail_is_found(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str]
) -> None:
    url, prefix = remote
    priv, pub, _ = keypair(tmp_path)
    cfg = config(tmp_path, priv, interval=1)
    with mounted(tmp_path, 1, ("--remote", url, "--config", str(cfg))) as m:
        for i in range(3):
            (m.mountpoint / f"f{i}").write_bytes(b"z" * 100)
        seq = head_seq(m)
        wait_until(lambda: any(int(k.rsplit("/", 1)[1].split(".")[0]) >= seq
                               for k in seal_keys(seaweed, prefix)), what="a periodic seal")
        state = m.state_dir
    # Unmounted (its last seal covers its last record). Delete the newest records.
    res = run_cli("audit", "verify", "--state-dir", str(state), "--public-key", str(pub))
    assert res.returncode == 0, res.stdout + res.stderr
    conn = sqlite3.connect(state / "catalog.sqlite")
    top = conn.execute("SELECT max(seq) FROM audit_log").fetchone()[0]
    conn.execute("DELETE FROM audit_log WHERE seq > ?", (top - 2,))
    conn.commit()
    conn.close()
    res = run_cli("audit", "verify", "--state-dir", str(state), "--public-key", str(pub))
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"records {top - 1}..{top} are missing" in res.stdout, res.stdout  # the unmount's seal
    assert "deleted after the seal" in res.stdout
    # A seal signed by another key is not taken for ours.
    _, other_pub, _ = keypair(tmp_path / "other")
    res = run_cli("audit", "verify", "--state-dir", str(state), "--public-key", str(other_pub))
    assert res.returncode == 1 and "bad signature" in res.stdout, res.stdout


@pytest.mark.allow_log_errors  # the daemon logs why it refused to mount
def test_a_signing_key_others_can_read_refuses_the_mount(
    tmp_path: Path, remote: tuple[str, str]
) -> None:
    url, _ = remote
    priv, _, _ = keypair(tmp_path, mode=0o644)
    cfg = config(tmp_path, priv)
    with pytest.raises(RuntimeError) as err, mounted(tmp_path, 1, ("--remote", url, "--config", str(cfg))):
        pass
    assert "audit.signing_key_file" in str(err.value) and "0644" in str(err.value)



def test_a_restored_node_continues_the_chain_its_seals_cover(
    tmp_path: Path, remote: tuple[str, str]
) -> None:
    """The catalog snapshot carries the log: a new node restored from the bucket has every
    record the old node's seals name, then its own "restore" and "mount" records."""
    url, _ = remote
    priv, pub, _ = keypair(tmp_path)
    cfg = config(tmp_path, priv)
    first = tmp_path / "node1"
    with mounted(first, 1, ("--remote", url, "--config", str(cfg))) as m:
        (m.mountpoint / "kept.bin").write_bytes(b"k" * 5000)
        res = run_cli("sync", str(m.mountpoint), "--timeout", "60")
        assert res.returncode == 0, res.stdout + res.stderr
        old = head_seq(m)
    shutil.rmtree(first)  # the state dir and the local tier are gone
    with mounted(tmp_path / "node2", 1, ("--remote", url, "--config", str(cfg))) as m:
        assert "restored the catalog" in m.log
        res = run_cli("audit", "export", str(m.mountpoint), "--json")
        recs = [json.loads(line) for line in res.stdout.splitlines()]
        assert [r["seq"] for r in recs] == list(range(1, len(recs) + 1))
        assert [r["action"] for r in recs[old:old + 2]] == ["restore", "mount"], recs
        assert any(r["path"] == "/kept.bin" and r["action"] == "commit" for r in recs[:old])
        res = run_cli("audit", "verify", str(m.mountpoint), "--public-key", str(pub))
        assert res.returncode == 0 and "seal(s) match" in res.stdout, res.stdout + res.stderr
