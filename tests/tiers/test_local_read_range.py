"""LocalTier.read_range: part of a frame file, read whole-block aligned with O_DIRECT."""

import mmap
import os
from pathlib import Path

import pytest

from tests.support.tier_conformance import framed, joined

from ckptfs.chunks.bufpool import FramePool
from ckptfs.config import TierConfig
from ckptfs.tiers.local import LocalTier

MiB = 1024 * 1024


@pytest.fixture(params=["direct", "buffered"])
def tier(request: pytest.FixtureRequest, tmp_path: Path) -> LocalTier:
    t = LocalTier(TierConfig("t", "local", tmp_path / "t",
                             direct_io=request.param == "direct"))
    t.open()
    assert t._direct == (request.param == "direct")
    return t


def test_any_range_comes_back_as_stored_however_it_is_aligned(tier: LocalTier) -> None:
    pool = FramePool(keep=1)
    key, parts = framed(os.urandom(5 * MiB + 321))
    tier.put(key, parts)
    stored = joined(parts)
    for offset, length in [(0, MiB), (1, MiB), (4095, 2 * MiB + 3), (MiB + 100, 7),
                           (len(stored) - 10, 10), (len(stored) - 10, MiB)]:
        got = tier.read_range(key, offset, length, pool.take)
        assert got is not None
        assert bytes(got) == stored[offset:offset + length]  # fewer at the frame's end
        if isinstance(got, memoryview):
            pool.give(got.obj)
        del got


def test_a_missing_frame_is_none_and_no_buffer_means_a_plain_read(tier: LocalTier) -> None:
    assert tier.read_range("ab" * 32, 0, MiB, lambda n: None) is None
    key, parts = framed(os.urandom(3 * MiB))
    tier.put(key, parts)
    stored = joined(parts)
    assert tier.read_range(key, 77, MiB, lambda n: None) == stored[77:77 + MiB]
    too_small = mmap.mmap(-1, 4096)
    assert tier.read_range(key, 77, MiB, lambda n: too_small) == stored[77:77 + MiB]
