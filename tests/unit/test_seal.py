"""Sealed frames (codec/seal.py, codec/frame.py): AES-256-GCM bodies under a namespace's
key, keyed chunk ids, every tampering detected, and never a plaintext byte in the frame."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator

import pytest

from ckptfs.codec import compress, frame
from ckptfs.codec.seal import KEYRING, OVERHEAD, Cipher, KeyUnavailable, Plaintext, SealKey
from ckptfs.errors import CorruptChunk

PLAIN = b"the-secret-weights-" * 4096


def _key(key_id: int, ns: str, version: int = 1, id_key: bytes | None = None) -> SealKey:
    return SealKey(key_id, ns, version, os.urandom(32), id_key or os.urandom(32))


@pytest.fixture
def keys() -> Iterator[tuple[SealKey, SealKey]]:
    a, b = _key(1, "/proj-a"), _key(2, "/proj-b")
    KEYRING.replace([a, b])
    yield a, b
    KEYRING.replace([])


def test_a_sealed_frame_opens_to_its_plaintext_and_holds_none_of_it(keys: tuple[SealKey, SealKey]) -> None:
    a, _ = keys
    digest = a.chunk_id([PLAIN])
    raw = frame.seal([PLAIN[:1000], PLAIN[1000:]], digest, a)
    head = frame.parse_header(raw)
    assert (head.cipher, head.key_id, head.plain_len) == (Cipher.AES256GCM, 1, len(PLAIN))
    assert head.body_len == len(PLAIN) + OVERHEAD == len(raw) - frame.HEADER_SIZE
    assert head.digest == digest != frame.digest_of(PLAIN)  # the keyed id, never plain blake3
    assert b"the-secret-weights" not in raw
    plain = frame.decode_view(raw, digest)
    assert isinstance(plain, Plaintext) and plain.key_id == 1 and bytes(plain) == PLAIN
    frame.verify(raw, digest)
    assert frame.decode(raw) == PLAIN


def test_sealing_into_a_reused_aligned_buffer(keys: tuple[SealKey, SealKey]) -> None:
    a, _ = keys
    buf = mmap.mmap(-1, frame.sealed_size(len(PLAIN)) + 4096)
    digest = a.chunk_id([PLAIN])
    view = frame.seal([memoryview(PLAIN)], digest, a, buf)
    assert len(view) == frame.sealed_size(len(PLAIN))
    assert bytes(frame.decode_view(view, digest)) == PLAIN
    again = frame.seal([PLAIN], digest, a)
    assert bytes(again[:frame.HEADER_SIZE]) == bytes(view[:frame.HEADER_SIZE])
    assert bytes(again) != bytes(view)  # a fresh nonce per frame
    del view
    buf.close()


def test_equal_plaintext_in_two_namespaces_gets_unrelated_ids(keys: tuple[SealKey, SealKey]) -> None:
    a, b = keys
    assert a.chunk_id([PLAIN]) != b.chunk_id([PLAIN])
    rotated = SealKey(3, "/proj-a", 2, os.urandom(32), a.id_key)  # a rotation keeps the id key
    assert rotated.chunk_id([PLAIN]) == a.chunk_id([PLAIN])


@pytest.mark.parametrize("where", [0, 9, 30, frame.HEADER_SIZE, frame.HEADER_SIZE + 5, -3])
def test_a_flipped_byte_anywhere_is_detected(keys: tuple[SealKey, SealKey], where: int) -> None:
    a, _ = keys
    digest = a.chunk_id([PLAIN])
    raw = bytearray(frame.seal([PLAIN], digest, a))
    raw[where] ^= 0x01
    with pytest.raises(CorruptChunk):
        frame.decode_view(raw, None if where >= frame.HEADER_SIZE else digest)


def test_a_frame_passed_off_as_another_namespace_or_without_its_key_does_not_open(
    keys: tuple[SealKey, SealKey],
) -> None:
    a, _ = keys
    digest = a.chunk_id([PLAIN])
    raw = frame.seal([PLAIN], digest, a)
    # The same data key under another namespace's name (and key id): the namespace is bound in.
    KEYRING.replace([SealKey(1, "/proj-b", 1, a.data_key, a.id_key)])
    with pytest.raises(CorruptChunk, match="authenticate"):
        frame.verify(raw, digest)
    KEYRING.replace([])  # shredded: no key, no bytes
    with pytest.raises(KeyUnavailable):
        frame.verify(raw, digest)


def test_a_plain_frame_is_unchanged_and_a_sealed_one_is_never_compressed(
    keys: tuple[SealKey, SealKey],
) -> None:
    zeros = bytes(1 << 20)
    digest = frame.digest_of(zeros)
    plain_frame = b"".join(bytes(p) for p in frame.encode([zeros], digest))
    assert frame.parse_header(plain_frame).cipher == Cipher.NONE
    a, _ = keys
    sealed = frame.seal([zeros], a.chunk_id([zeros]), a)
    sent, choice = compress.remote_frame(sealed, a.chunk_id([zeros]), "always")
    assert sent is sealed and choice.codec == frame.Codec.RAW and choice.reason == "sealed"
    packed, choice = compress.remote_frame(plain_frame, digest, "always")
    assert choice.codec == frame.Codec.LZ4  # plain frames compress as before


def test_the_key_repr_shows_no_key_bytes() -> None:
    k = _key(7, "/p")
    assert k.data_key.hex() not in repr(k) and k.id_key.hex() not in repr(k)


def test_a_frame_in_a_receive_buffer_opens_into_its_own_buffer_and_names_its_key(
    keys: tuple[SealKey, SealKey],
) -> None:
    # The receive buffer is writable and reused by the pool: the plaintext must not alias
    # it (and AEAD libraries refuse overlapping input and output: cryptography 51 does).
    a, _ = keys
    digest = a.chunk_id([PLAIN])
    buf = mmap.mmap(-1, frame.sealed_size(len(PLAIN)))
    raw = memoryview(buf)
    raw[:] = frame.seal([PLAIN], digest, a)
    sealed_copy = bytes(raw)
    plain = frame.decode_view(raw, digest)
    assert bytes(plain) == PLAIN
    assert not (isinstance(plain, memoryview) and plain.obj is buf)
    assert bytes(raw) == sealed_copy  # the frame is left as it came: still a frame
    assert frame.opened_key_id(plain) == 1 and frame.opened_key_id(memoryview(plain)[10:20]) == 1
    copied = frame.decode_view(frame.seal([PLAIN], digest, a), digest)  # read-only input
    assert frame.opened_key_id(copied) == 1 and frame.opened_key_id(memoryview(copied)) == 1
    zeros = bytes(100)
    plain_view = frame.decode_view(b"".join(bytes(p) for p in frame.encode([zeros], frame.digest_of(zeros))))
    assert frame.opened_key_id(plain_view) == 0
    # A damaged frame in a writable buffer: CorruptChunk, never the bytes.
    raw2 = bytearray(frame.seal([PLAIN], digest, a))
    raw2[frame.HEADER_SIZE + 50] ^= 1
    with pytest.raises(CorruptChunk):
        frame.decode_view(memoryview(raw2), digest)
    del plain, raw
    buf.close()
