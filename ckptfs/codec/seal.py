"""Encryption at rest of chunk frames (docs/governance.md, "Encryption at rest and keys").

A chunk of an encrypted namespace is stored as a *sealed* frame: the usual header with
``cipher = 1`` (AES-256-GCM) and ``key_id`` (the catalog's number of the namespace key
version that sealed it), then the body ``nonce (12) || ciphertext || tag (16)``. The
header's digest is the chunk id, a blake3 keyed with the namespace's id key (never the
plain blake3 of the plaintext: equal plaintext in two namespaces gives unrelated ids, and
an id says nothing about the content to whoever lacks the key). The associated data is
the whole header (chunk id, key id, lengths) and the namespace, so a frame cannot be
passed off as another chunk's, another version's or another namespace's.

The keys live in ``KEYRING``, one per process: the daemon fills it at mount (keys/ring.py)
and every frame check of the process (the store's reads, the tiers' verify, the
uploader's check before a put) opens sealed frames with it. A frame whose key is not in
it (shredded, or never loaded) cannot be opened: CorruptChunk, EIO, never bytes.
Everything here but the keyring's dict operations is blocking CPU work: worker threads
(the AEAD and blake3 release the GIL on large buffers).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

import blake3
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..errors import CorruptChunk

NONCE_SIZE = 12
TAG_SIZE = 16
OVERHEAD = NONCE_SIZE + TAG_SIZE  # a sealed body is this much longer than its plaintext
KEY_SIZE = 32

Buffer = bytes | bytearray | memoryview


class Cipher(IntEnum):
    NONE = 0
    AES256GCM = 1


class KeyUnavailable(CorruptChunk):
    """A sealed frame whose key this process does not hold (shredded, or not loaded)."""


class Plaintext(bytearray):
    """The opened plaintext of a sealed frame, with the key id that sealed it: a copy
    written again (a heal, a copy-back) is sealed anew under that key, never stored in
    the clear."""

    key_id: int = 0


@dataclass(frozen=True, eq=False)
class SealKey:
    """One version of a namespace's data key, unwrapped (memory only; never logged: the
    repr shows no key bytes)."""

    key_id: int  # the frame header's key_id (catalog/keys.py: never reused)
    namespace: str
    version: int
    data_key: bytes = field(repr=False)
    id_key: bytes = field(repr=False)  # the same in every version of a namespace
    _aead: AESGCM = field(init=False, repr=False)
    _ns: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if len(self.data_key) != KEY_SIZE or len(self.id_key) != KEY_SIZE:
            raise ValueError("namespace keys are 32 bytes")
        object.__setattr__(self, "_aead", AESGCM(self.data_key))
        object.__setattr__(self, "_ns", self.namespace.encode())

    def chunk_id(self, parts: Sequence[Buffer]) -> bytes:
        """The chunk id of this plaintext in this namespace: blake3 keyed with the id key."""
        h = blake3.blake3(key=self.id_key)
        for p in parts:
            h.update(p)
        return h.digest()

    def seal_into(self, head: bytes, plain: Buffer, out: memoryview) -> None:
        """``out`` (exactly len(plain) + OVERHEAD bytes) gets nonce || ciphertext || tag
        of ``plain``, ``head`` (the frame header) bound in. A fresh random nonce per frame:
        2^32 frames per key version keep the collision chance negligible (rotate beyond)."""
        nonce = os.urandom(NONCE_SIZE)
        out[:NONCE_SIZE] = nonce
        self._aead.encrypt_into(nonce, plain, head + self._ns, out[NONCE_SIZE:])

    def seal(self, head: bytes, plain: Buffer) -> bytes:
        nonce = os.urandom(NONCE_SIZE)
        return nonce + self._aead.encrypt(nonce, plain, head + self._ns)

    def open(self, head: Buffer, body: memoryview, plain_len: int) -> Plaintext:
        """The plaintext of a sealed body; CorruptChunk if the tag does not verify (a
        flipped byte anywhere in header or body, or another namespace's frame)."""
        if len(body) != plain_len + OVERHEAD:
            raise CorruptChunk(f"sealed body is {len(body)} bytes, expected {plain_len + OVERHEAD}")
        out = Plaintext(plain_len)
        out.key_id = self.key_id
        try:
            self._aead.decrypt_into(
                body[:NONCE_SIZE], body[NONCE_SIZE:], bytes(head) + self._ns, out
            )
        except InvalidTag:
            raise CorruptChunk(
                f"sealed frame does not authenticate under key {self.key_id} "
                f"({self.namespace} v{self.version})"
            ) from None
        return out


class Keyring:
    """The unwrapped keys of this process, by key id, and each namespace's newest (the
    one new chunks are sealed with). Thread-safe: dict operations under a lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_id: dict[int, SealKey] = {}
        self._current: dict[str, SealKey] = {}

    def get(self, key_id: int) -> SealKey | None:
        with self._lock:
            return self._by_id.get(key_id)

    def current(self, namespace: str) -> SealKey | None:
        with self._lock:
            return self._current.get(namespace)

    def ids(self) -> set[int]:
        with self._lock:
            return set(self._by_id)

    def replace(self, keys: Iterable[SealKey]) -> set[int]:
        """Hold exactly ``keys`` from now on; returns the ids forgotten (shredded)."""
        by_id = {k.key_id: k for k in keys}
        current: dict[str, SealKey] = {}
        for k in by_id.values():
            if k.namespace not in current or k.version > current[k.namespace].version:
                current[k.namespace] = k
        with self._lock:
            gone = set(self._by_id) - set(by_id)
            self._by_id, self._current = by_id, current
        return gone


# The process's keys (see the module's docstring): filled by the daemon at mount.
KEYRING = Keyring()
