"""The chunk frame: round trip, and every kind of damage is refused."""

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptfs.codec import frame
from ckptfs.errors import CorruptChunk


def _frame(parts: list[bytes]) -> bytes:
    digest = frame.digest_of_parts(parts)
    return b"".join(bytes(p) for p in frame.encode(parts, digest))


@given(st.lists(st.binary(max_size=3000), max_size=5))
def test_round_trip(parts: list[bytes]) -> None:
    raw = _frame(parts)
    assert frame.decode(raw) == b"".join(parts)
    header = frame.parse_header(raw)
    assert header.plain_len == sum(map(len, parts))
    assert header.digest == frame.digest_of(b"".join(parts))


def test_every_flipped_byte_is_detected() -> None:
    raw = _frame([os.urandom(300)])
    for i in range(len(raw)):
        bad = bytearray(raw)
        bad[i] ^= 0x01
        with pytest.raises(CorruptChunk):
            frame.decode(bytes(bad))


def test_truncated_and_extended_frames_are_refused() -> None:
    raw = _frame([b"x" * 100])
    with pytest.raises(CorruptChunk):
        frame.decode(raw[:-1])
    with pytest.raises(CorruptChunk):
        frame.decode(raw + b"\0")
    with pytest.raises(CorruptChunk):
        frame.decode(raw[:10])


def test_wrong_expected_digest_is_refused() -> None:
    raw = _frame([b"abc"])
    with pytest.raises(CorruptChunk):
        frame.decode(raw, expected_digest=frame.digest_of(b"abd"))
    frame.verify(raw, frame.digest_of(b"abc"))
