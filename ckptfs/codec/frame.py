"""The chunk frame: a self-describing header followed by the payload.

A frame can be checked without the catalog: the header names the codec, the plaintext
length and the blake3 digest of the plaintext, so a tier can be scrubbed on its own.

Layout (little endian, 60 bytes)::

    magic      4s   b"CKFR"
    version    B    1
    codec      B    0 = raw, 1 = lz4 (block)
    cipher     B    0 = none, 1 = AES-256-GCM (a sealed frame, codec/seal.py)
    flags      B    reserved, 0
    key_id     I    0, or the namespace key version that sealed the frame
    plain_len  Q    length of the plaintext
    body_len   Q    length of the stored body after the header
    digest     32s  blake3(plaintext); a sealed frame: the keyed chunk id (codec/seal.py)

A sealed frame's body is nonce || ciphertext || tag of the plaintext (codec RAW: an
encrypted chunk is never compressed, its ciphertext would not shrink).
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

import blake3

from ..errors import CorruptChunk
from .seal import KEYRING, OVERHEAD, Cipher, KeyUnavailable, Plaintext, SealKey

MAGIC = b"CKFR"
VERSION = 1
_HEADER = struct.Struct("<4sBBBBIQQ32s")
HEADER_SIZE = _HEADER.size
DIGEST_SIZE = 32

Buffer = bytes | bytearray | memoryview


class Codec(IntEnum):
    RAW = 0
    LZ4 = 1


@dataclass(frozen=True)
class FrameHeader:
    codec: Codec
    plain_len: int
    body_len: int
    digest: bytes
    cipher: Cipher = Cipher.NONE
    key_id: int = 0


def digest_of(data: Buffer) -> bytes:
    # blake3 releases the GIL for large inputs, so this runs in parallel in worker threads.
    return blake3.blake3(data).digest()


def digest_of_parts(parts: Sequence[Buffer]) -> bytes:
    h = blake3.blake3()
    for p in parts:
        h.update(p)
    return h.digest()


def header(plain_len: int, digest: bytes) -> bytes:
    """The header of a raw frame of ``plain_len`` plaintext bytes."""
    return _HEADER.pack(MAGIC, VERSION, Codec.RAW, 0, 0, 0, plain_len, plain_len, digest)


def encode(parts: Sequence[Buffer], digest: bytes) -> list[Buffer]:
    """The frame as a list of buffers ready for writev: header, then the plaintext parts
    themselves (raw codec), so no copy is made."""
    return [header(sum(len(p) for p in parts), digest), *parts]


def encode_lz4(body: Buffer, plain_len: int, digest: bytes) -> bytes:
    """An LZ4 frame: ``body`` is ``lz4.block.compress(plaintext, store_size=False)`` (the
    header carries plain_len instead). The caller must verify the result before trusting it."""
    head = _HEADER.pack(MAGIC, VERSION, Codec.LZ4, 0, 0, 0, plain_len, len(body), digest)
    return head + bytes(body)


def parse_header(raw: Buffer) -> FrameHeader:
    if len(raw) < HEADER_SIZE:
        raise CorruptChunk(f"frame shorter than its header ({len(raw)} bytes)")
    magic, version, codec, cipher, flags, key_id, plain_len, body_len, digest = _HEADER.unpack_from(
        raw, 0
    )
    if magic != MAGIC:
        raise CorruptChunk(f"bad frame magic {magic!r}")
    if version != VERSION:
        raise CorruptChunk(f"unsupported frame version {version}")
    if cipher not in (Cipher.NONE, Cipher.AES256GCM) or (cipher == Cipher.NONE) != (key_id == 0):
        raise CorruptChunk(f"unsupported cipher {cipher} (key id {key_id})")
    if flags != 0:
        raise CorruptChunk(f"unknown frame flags {flags:#x}")
    try:
        codec_ = Codec(codec)
    except ValueError:
        raise CorruptChunk(f"unknown codec {codec}") from None
    return FrameHeader(codec_, plain_len, body_len, digest, Cipher(cipher), key_id)


def sealed_header(plain_len: int, digest: bytes, key_id: int) -> bytes:
    """The header of a sealed frame (``digest``: the keyed chunk id)."""
    return _HEADER.pack(MAGIC, VERSION, Codec.RAW, Cipher.AES256GCM, 0, key_id, plain_len,
                        plain_len + OVERHEAD, digest)


def sealed_size(plain_len: int) -> int:
    return HEADER_SIZE + plain_len + OVERHEAD


def seal(
    parts: Sequence[Buffer], digest: bytes, key: SealKey, out: Buffer | mmap.mmap | None = None
) -> Buffer:
    """The sealed frame of the plaintext ``parts`` (chunk id ``digest``, from
    ``key.chunk_id``), written into ``out`` (a reused buffer of at least ``sealed_size``
    bytes: the result is a view of it, page-aligned if ``out`` is) or into new bytes."""
    n = sum(len(p) for p in parts)
    head = sealed_header(n, digest, key.key_id)
    plain = parts[0] if len(parts) == 1 else b"".join(parts)
    if out is None:
        return head + key.seal(head, plain)
    view = memoryview(out)[: sealed_size(n)]
    view[:HEADER_SIZE] = head
    key.seal_into(head, plain, view[HEADER_SIZE:])
    return view


def decode(frame: Buffer, expected_digest: bytes | None = None) -> bytes:
    """Decode and verify a whole frame. Raises CorruptChunk; never returns unverified bytes."""
    plain = _verified_plaintext(frame, expected_digest)
    return plain if isinstance(plain, bytes) else bytes(plain)


def decode_view(frame: Buffer, expected_digest: bytes | None = None) -> Buffer:
    """Like decode, but a raw body comes back as a view into ``frame`` (no copy). A sealed
    frame opens into a new buffer (AEAD libraries refuse overlapping input and output:
    cryptography 51 raises on it); ``opened_key_id`` tells its key."""
    return _verified_plaintext(frame, expected_digest)


def opened_key_id(plain: Buffer) -> int:
    """The key id that sealed a plaintext ``decode_view`` returned (0: a plain chunk). A
    copy of it written again (a heal, a copy-back) must be sealed under that key."""
    if isinstance(plain, memoryview) and isinstance(plain.obj, Plaintext):
        return plain.obj.key_id
    if isinstance(plain, Plaintext):
        return plain.key_id
    return 0


def verify(frame: Buffer, expected_digest: bytes) -> None:
    """Check a frame against the digest it should hold, without copying its body."""
    _verified_plaintext(frame, expected_digest)


def _verified_plaintext(frame: Buffer, expected_digest: bytes | None) -> Buffer:
    header = parse_header(frame)
    if expected_digest is not None and header.digest != expected_digest:
        raise CorruptChunk("frame digest does not match the requested chunk")
    body = memoryview(frame)[HEADER_SIZE:]
    if len(body) != header.body_len:
        raise CorruptChunk(f"frame body is {len(body)} bytes, header says {header.body_len}")
    if header.cipher != Cipher.NONE:
        return _opened(frame, header, body)
    if header.codec == Codec.LZ4:
        import lz4.block

        try:
            plain = lz4.block.decompress(body, uncompressed_size=header.plain_len)
        except Exception as exc:  # lz4 raises a bare LZ4BlockError
            raise CorruptChunk(f"lz4 body does not decompress: {exc}") from None
    else:
        plain = body
    if len(plain) != header.plain_len:
        raise CorruptChunk(f"plaintext is {len(plain)} bytes, header says {header.plain_len}")
    if digest_of(plain) != header.digest:
        raise CorruptChunk("plaintext digest mismatch")
    return plain


def _opened(frame: Buffer, header: FrameHeader, body: memoryview) -> Buffer:
    """The verified plaintext of a sealed frame: authenticated by the AEAD tag (header and
    namespace bound in), then checked against the keyed chunk id."""
    key = KEYRING.get(header.key_id)
    if key is None:
        raise KeyUnavailable(f"sealed with key {header.key_id}, which this node does not hold "
                             f"(shredded, or its namespace key was not loaded)")
    if header.codec != Codec.RAW:
        raise CorruptChunk(f"sealed frame with codec {header.codec}")
    head = memoryview(frame)[:HEADER_SIZE]
    plain = key.open(head, body, header.plain_len)
    if key.chunk_id([plain]) != header.digest:
        raise CorruptChunk("plaintext does not match the chunk id")
    return plain
