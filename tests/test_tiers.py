"""One conformance suite for every Tier implementation."""

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

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


def _framed(data: bytes) -> tuple[str, list[frame.Buffer]]:
    d = frame.digest_of(data)
    return d.hex(), frame.encode([data], d)


def test_put_get_delete_are_idempotent(tier: Tier) -> None:
    key, parts = _framed(b"hello" * 100)
    assert tier.get(key) is None
    n = tier.put(key, parts)
    assert n == frame.HEADER_SIZE + 500
    assert tier.put(key, parts) == n  # a second put of the same frame is harmless
    assert frame.decode(tier.get(key) or b"") == b"hello" * 100
    assert list(tier.list_keys()) == [key]
    assert tier.usage().used == n
    assert tier.delete(key) == n
    assert tier.delete(key) == 0
    assert tier.get(key) is None
    assert tier.usage().used == 0


def test_capacity_gives_nospace(tier: Tier) -> None:
    key, parts = _framed(b"x" * (900 * 1024))
    tier.put(key, parts)
    key2, parts2 = _framed(b"y" * (200 * 1024))
    with pytest.raises(NoSpace):
        tier.put(key2, parts2)
    assert tier.get(key2) is None
    assert frame.decode(tier.get(key) or b"") == b"x" * (900 * 1024)


def test_local_tier_reports_vanished_directory(tmp_path: Path) -> None:
    t = LocalTier(TierConfig("gone", "local", tmp_path / "gone"))
    t.open()
    key, parts = _framed(b"data")
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
