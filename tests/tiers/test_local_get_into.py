"""LocalTier.get_into: a frame read into a buffer the caller reuses (the upload's read)."""

import mmap
import os
from pathlib import Path

import pytest

from tests.support.tier_conformance import framed, joined

from ckptfs.chunks.bufpool import FrameBuffer, FramePool
from ckptfs.codec import frame
from ckptfs.config import TierConfig
from ckptfs.errors import CorruptChunk
from ckptfs.tiers.local import LocalTier

MiB = 1024 * 1024


@pytest.fixture(params=["direct", "buffered"])
def tier(request: pytest.FixtureRequest, tmp_path: Path) -> LocalTier:
    t = LocalTier(TierConfig("t", "local", tmp_path / "t",
                             direct_io=request.param == "direct"))
    t.open()
    assert t._direct == (request.param == "direct")
    return t


def test_frames_land_in_the_buffer_given_and_it_is_read_into_again(tier: LocalTier) -> None:
    pool = FramePool(keep=1)
    stored = {}
    for size in (3 * MiB + 123, 2 * MiB, 3 * MiB - 5):
        key, parts = framed(os.urandom(size))
        tier.put(key, parts)
        stored[key] = joined(parts)
    for key, body in stored.items():
        got = tier.get_into(key, pool.take)
        assert isinstance(got, memoryview) and isinstance(got.obj, FrameBuffer)
        assert bytes(got) == body
        frame.verify(got, bytes.fromhex(key))
        pool.give(got.obj)
        del got
    assert pool.made == 1 and pool.reused == 2  # one mapping, its pages read into again


def test_small_frames_missing_keys_and_no_buffer_read_as_get(tier: LocalTier) -> None:
    pool = FramePool(keep=1)
    small_key, small_parts = framed(b"tiny")
    tier.put(small_key, small_parts)
    got = tier.get_into(small_key, pool.take)  # under 1 MiB: the pool gives no buffer
    assert isinstance(got, bytes) and got == joined(small_parts)
    assert tier.get_into("ab" * 32, pool.take) is None
    key, parts = framed(os.urandom(2 * MiB))
    tier.put(key, parts)
    assert tier.get_into(key, lambda n: None) == joined(parts)
    too_small = mmap.mmap(-1, MiB)
    assert tier.get_into(key, lambda n: too_small) == joined(parts)  # not read into it


def test_a_damaged_frame_comes_back_as_stored_and_fails_its_check(tier: LocalTier) -> None:
    key, parts = framed(os.urandom(2 * MiB))
    tier.put(key, parts)
    path = tier._path(key)
    with open(path, "r+b") as f:
        f.seek(MiB)
        byte = f.read(1)
        f.seek(MiB)
        f.write(bytes([byte[0] ^ 0xFF]))
    got = tier.get_into(key, FramePool(keep=1).take)
    assert got is not None and len(got) == len(joined(parts))
    with pytest.raises(CorruptChunk):
        frame.verify(got, bytes.fromhex(key))
    with open(path, "ab") as f:
        f.write(b"grown")  # longer than its header says: it shows
    got = tier.get_into(key, FramePool(keep=1).take)
    assert got is not None and len(got) == len(joined(parts)) + 5
