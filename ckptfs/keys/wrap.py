"""Data keys wrapped by the KEK: AES-256-GCM of ``data key || id key`` with a fresh nonce,
the namespace and the version bound in as associated data (a wrapped key copied to
another namespace's row, or another version's, does not unwrap)."""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..catalog.keys import KeyRow
from ..codec.seal import KEY_SIZE, NONCE_SIZE, SealKey
from ..errors import ConfigError
from .kek import kek_id


def _ad(namespace: str, version: int) -> bytes:
    return b"ckptfs namespace key\0" + namespace.encode() + b"\0" + str(version).encode()


def new_key_material() -> tuple[bytes, bytes]:
    """A fresh data key and id key (32 random bytes each)."""
    return os.urandom(KEY_SIZE), os.urandom(KEY_SIZE)


def wrap(kek: bytes, namespace: str, version: int, data_key: bytes, id_key: bytes) -> bytes:
    nonce = os.urandom(NONCE_SIZE)
    return nonce + AESGCM(kek).encrypt(nonce, data_key + id_key, _ad(namespace, version))


def unwrap(kek: bytes, row: KeyRow) -> SealKey:
    """The key of a live row; ConfigError if the KEK is not the one that wrapped it."""
    assert row.wrapped is not None
    try:
        plain = AESGCM(kek).decrypt(row.wrapped[:NONCE_SIZE], row.wrapped[NONCE_SIZE:],
                                    _ad(row.namespace, row.version))
    except InvalidTag:
        raise ConfigError(
            f"keys: the key of namespace {row.namespace} (version {row.version}) does not "
            f"unwrap with this KEK (fingerprint {kek_id(kek)}; it was wrapped by {row.kek_id})"
        ) from None
    return SealKey(row.key_id, row.namespace, row.version, plain[:KEY_SIZE], plain[KEY_SIZE:])
