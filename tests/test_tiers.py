"""The Tier conformance suite (tier_conformance.py) on the local and memory tiers, plus
what only tiers with a capacity or a directory can show."""

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from tier_conformance import TierConformance, framed

from ckptfs.chunks import frame
from ckptfs.config import TierConfig
from ckptfs.errors import NoSpace, TierError
from ckptfs.testing.tiers import MemoryTier
from ckptfs.tiers.base import Tier
from ckptfs.tiers.local import LocalTier


@pytest.fixture(params=["local", "memory"])
def tier(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Tier]:
    if request.param == "local":
        t = LocalTier(TierConfig("t", "local", tmp_path / "tier", capacity=1 << 20))
        t.open()
        yield t
    else:
        yield MemoryTier("t", capacity=1 << 20)


class TestConformance(TierConformance):
    pass


def test_capacity_gives_nospace(tier: Tier) -> None:
    key, parts = framed(b"x" * (900 * 1024))
    tier.put(key, parts)
    key2, parts2 = framed(b"y" * (200 * 1024))
    with pytest.raises(NoSpace):
        tier.put(key2, parts2)
    assert tier.get(key2) is None
    assert frame.decode(tier.get(key) or b"") == b"x" * (900 * 1024)


def test_local_tier_reports_vanished_directory(tmp_path: Path) -> None:
    t = LocalTier(TierConfig("gone", "local", tmp_path / "gone"))
    t.open()
    key, parts = framed(b"data")
    t.put(key, parts)
    shutil.rmtree(tmp_path / "gone")
    with pytest.raises(TierError, match="gone"):
        t.get(key)
    with pytest.raises(TierError):
        t.put(key, parts)
    with pytest.raises(TierError):
        t.check()


def test_local_tier_open_removes_leftover_temp_files(tmp_path: Path) -> None:
    cfg = TierConfig("t", "local", tmp_path / "t")
    LocalTier(cfg).open()
    (tmp_path / "t" / "tmp" / "half-written").write_bytes(b"partial")
    t = LocalTier(cfg)
    t.open()
    assert list((tmp_path / "t" / "tmp").iterdir()) == []
