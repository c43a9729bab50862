"""upload/uploader.py ``copy_frame``: what one upload does, against a real SeaweedFS and a
real local tier (the path scripts/bench_upload.py measures)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from ckptfs.chunks.bufpool import FramePool
from ckptfs.codec import frame
from ckptfs.codec.compress import RemoteCompressor
from ckptfs.config.model import TierConfig
from ckptfs.errors import ChunkMissing
from ckptfs.tiers.local import LocalTier
from ckptfs.tiers.s3 import S3Tier
from ckptfs.upload.uploader import copy_frame

MiB = 1 << 20


def local_tier(path: Path, name: str) -> LocalTier:
    path.mkdir()
    tier = LocalTier(TierConfig(name=name, kind="local", path=path))
    tier.open()
    return tier


def stored(tier: LocalTier, data: bytes) -> bytes:
    digest = frame.digest_of(data)
    tier.put(digest.hex(), frame.encode([data], digest))
    return digest


def test_copy_frame_puts_the_verified_frame_with_its_checksum(
    tmp_path: Path, s3_tier_factory: Callable[..., S3Tier]
) -> None:
    local = local_tier(tmp_path / "t0", "local0")
    remote = s3_tier_factory()
    data = os.urandom(2 * MiB)  # large enough for a reused frame buffer
    digest = stored(local, data)
    pool = FramePool(2)
    copy_frame(digest, [local], remote, RemoteCompressor("auto"), pool)
    got = remote.get(digest.hex())
    assert got is not None and frame.decode(got, digest) == data
    info = remote.head(digest.hex())
    assert info is not None and info.blake3 == digest.hex() and info.checksum_sha256
    assert pool.made == 1  # the frame was read into a pool buffer, given back after


def test_copy_frame_skips_a_corrupt_or_refused_source_and_uses_the_next(
    tmp_path: Path, s3_tier_factory: Callable[..., S3Tier]
) -> None:
    bad = local_tier(tmp_path / "t0", "local0")
    refused = local_tier(tmp_path / "t1", "local1")
    good = local_tier(tmp_path / "t2", "local2")
    remote = s3_tier_factory()
    data = os.urandom(MiB + 123)
    digest = stored(bad, data)
    stored(refused, data)
    stored(good, data)
    frames = [p for p in (tmp_path / "t0").rglob(digest.hex()) if p.is_file()]
    assert frames
    with open(frames[0], "r+b") as f:  # one flipped byte of the plaintext
        f.seek(frame.HEADER_SIZE + 7)
        b = f.read(1)
        f.seek(frame.HEADER_SIZE + 7)
        f.write(bytes([b[0] ^ 0xFF]))
    copy_frame(digest, [bad, refused, good], remote, RemoteCompressor("off"), FramePool(2),
               permitted=lambda name: name != "local1")
    got = remote.get(digest.hex())
    assert got is not None and frame.decode(got, digest) == data


def test_copy_frame_without_a_valid_source_puts_nothing(
    tmp_path: Path, s3_tier_factory: Callable[..., S3Tier]
) -> None:
    local = local_tier(tmp_path / "t0", "local0")
    remote = s3_tier_factory()
    digest = frame.digest_of(b"never stored")
    with pytest.raises(ChunkMissing, match="local0: missing"):
        copy_frame(digest, [local], remote, RemoteCompressor("auto"), FramePool(2))
    assert remote.head(digest.hex()) is None
