"""Seals of the audit chain (docs/governance.md "Audit log"): the head of the log (seq,
digest, time, node, and the catalog's fs_id) signed with an Ed25519 key and stored on the
remote tiers under ``<prefix>/meta/audit/seals/<seq>.json``, create-only (a PUT with
``If-None-Match: *``: a seal once stored is never overwritten, by this or any node).

A seal proves that the log held that record with that digest when it was made: a later
rewrite of the log that changes or drops it no longer matches the seal, even one that
recomputes every digest. The seal object:

    {"format": "ckptfs-audit-seal-1", "fs_id": ..., "seq": N, "digest": hex, "time_ns": ...,
     "node": ..., "public_key": hex, "signature": hex}

``signature`` is Ed25519 over ``signed_bytes``: the canonical JSON (sorted keys, no spaces)
of every field but ``public_key`` and ``signature``. Blocking code (key files, S3 calls):
callers run it in worker threads. No trio here: the commands use it too.
"""

from __future__ import annotations

import json
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from ..catalog.audit import AuditEntry
from ..errors import CkptfsError, ConfigError, TierError

__all__ = ["SEALS_DIR", "SEAL_FORMAT", "Seal", "SealStore", "list_seals", "load_public_key",
           "load_signing_key", "make_seal", "parse_seal", "seal_name", "store_seal"]

SEAL_FORMAT = "ckptfs-audit-seal-1"
SEALS_DIR = "audit/seals"  # under the tier's meta/ prefix
_KEY = "audit.signing_key_file"


class SealStore(Protocol):
    """What sealing uses of a remote tier (tiers/s3.py S3Tier)."""

    name: str

    def put_meta_if(self, name: str, data: bytes, *, etag: str | None,
                    conditional: bool = True) -> str: ...

    def get_meta(self, name: str) -> bytes | None: ...

    def list_meta(self, under: str) -> list[str]: ...


@dataclass(frozen=True)
class Seal:
    fs_id: str
    seq: int
    digest: bytes
    time_ns: int
    node: str
    public_key: bytes
    signature: bytes

    def signed_bytes(self) -> bytes:
        return _canonical({"format": SEAL_FORMAT, "fs_id": self.fs_id, "seq": self.seq,
                           "digest": self.digest.hex(), "time_ns": self.time_ns,
                           "node": self.node})

    def valid_under(self, key: Ed25519PublicKey) -> bool:
        try:
            key.verify(self.signature, self.signed_bytes())
            return True
        except InvalidSignature:
            return False


def _canonical(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def seal_name(seq: int) -> str:
    return f"{SEALS_DIR}/{seq:020d}.json"  # sorts by seq


def _read_key_file(path: Path, key: str) -> bytes:
    try:
        st = path.stat()
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path}: {exc.strerror}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{key}: {path} has mode {stat.S_IMODE(st.st_mode):04o}; a private "
                          "key must be readable by its owner only (chmod 600)")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{key}: cannot read {path}: {exc.strerror}") from None


def load_signing_key(path: Path) -> Ed25519PrivateKey:
    """The Ed25519 private key of ``audit.signing_key_file``: PEM (PKCS#8) or the raw 32
    bytes; mode 0600 or stricter. ConfigError naming the key otherwise."""
    raw = _read_key_file(path, _KEY)
    if len(raw) == 32:
        return Ed25519PrivateKey.from_private_bytes(raw)
    try:
        key = serialization.load_pem_private_key(raw, password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{_KEY}: {path} is neither a PEM private key nor 32 raw bytes: "
                          f"{exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"{_KEY}: {path} is a {type(key).__name__}, not an Ed25519 key")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """A verifier's key: a PEM public key, 32 raw bytes (public), or the signing key's
    file itself (its public half)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CkptfsError(f"public key {path}: {exc.strerror}") from None
    if len(raw) == 32:
        return Ed25519PublicKey.from_public_bytes(raw)
    if b"PRIVATE KEY" in raw:
        return load_signing_key(path).public_key()
    try:
        key = serialization.load_pem_public_key(raw)
    except ValueError as exc:
        raise CkptfsError(f"public key {path}: not a PEM public key: {exc}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise CkptfsError(f"public key {path}: a {type(key).__name__}, not Ed25519")
    return key


def public_bytes(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def make_seal(key: Ed25519PrivateKey, fs_id: str, head: AuditEntry, node: str,
              time_ns: int) -> Seal:
    unsigned = Seal(fs_id, head.seq, head.digest, time_ns, node, public_bytes(key.public_key()), b"")
    return Seal(fs_id, head.seq, head.digest, time_ns, node, unsigned.public_key,
                key.sign(unsigned.signed_bytes()))


def seal_json(seal: Seal) -> bytes:
    return _canonical({"format": SEAL_FORMAT, "fs_id": seal.fs_id, "seq": seal.seq,
                       "digest": seal.digest.hex(), "time_ns": seal.time_ns, "node": seal.node,
                       "public_key": seal.public_key.hex(), "signature": seal.signature.hex()})


def parse_seal(data: bytes) -> Seal:
    try:
        obj = json.loads(data)
        if obj.get("format") != SEAL_FORMAT:
            raise ValueError(f"format {obj.get('format')!r}")
        return Seal(str(obj["fs_id"]), int(obj["seq"]), bytes.fromhex(obj["digest"]),
                    int(obj["time_ns"]), str(obj["node"]), bytes.fromhex(obj["public_key"]),
                    bytes.fromhex(obj["signature"]))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CkptfsError(f"not a seal: {exc}") from None


def store_seal(tier: SealStore, seal: Seal) -> bool:
    """Store ``seal`` create-only; True if this call created it, False if the same head
    was sealed already (by another node, or an earlier call). CkptfsError if another seal
    of that seq names a different digest (the chain forked, or a seal was forged)."""
    # Not at the top: a daemon without a remote tier never loads boto3 (tiers/s3.py).
    from ..tiers.s3 import ConditionalWriteUnsupported, PreconditionFailed

    name = seal_name(seal.seq)
    data = seal_json(seal)
    try:
        tier.put_meta_if(name, data, etag=None)
        return True
    except PreconditionFailed:
        pass
    except ConditionalWriteUnsupported:
        # A server without If-None-Match: look, then put (two nodes could race here).
        if tier.get_meta(name) is None:
            tier.put_meta_if(name, data, etag=None, conditional=False)
            return True
    there = tier.get_meta(name)
    if there is None:
        raise TierError(f"tier {tier.name}: seal {name} refused but not readable")
    other = parse_seal(there)
    if other.digest != seal.digest:
        raise CkptfsError(f"tier {tier.name}: seal {name} already names digest "
                          f"{other.digest.hex()[:16]}, this log's record {seal.seq} is "
                          f"{seal.digest.hex()[:16]}")
    return False


def list_seals(tier: SealStore) -> list[tuple[str, bytes]]:
    """Every seal object on ``tier``: (name, body), oldest seq first."""
    out = []
    for name in tier.list_meta(SEALS_DIR):
        body = tier.get_meta(f"{SEALS_DIR}/{name}")
        if body is not None:
            out.append((name, body))
    return out
