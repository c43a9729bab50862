"""The Tier conformance suite, shared by every implementation.

A test module subclasses ``TierConformance`` as ``Test...`` and provides a ``tier`` fixture
that yields an empty tier (test_tiers.py: local and memory; test_s3_tier.py: S3 on SeaweedFS).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from ckptfs.codec import frame
from ckptfs.errors import ChunkMissing, CorruptChunk
from ckptfs.tiers.base import Tier


def framed(data: bytes) -> tuple[str, list[frame.Buffer]]:
    d = frame.digest_of(data)
    return d.hex(), frame.encode([data], d)


def joined(parts: list[frame.Buffer]) -> bytes:
    return b"".join(bytes(p) for p in parts)


class TierConformance:
    def test_put_get_delete_are_idempotent(self, tier: Tier) -> None:
        key, parts = framed(b"hello" * 100)
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

    def test_missing_chunk(self, tier: Tier) -> None:
        key, _ = framed(b"never stored")
        assert tier.get(key) is None
        with pytest.raises(ChunkMissing):
            tier.verify(key, bytes.fromhex(key))
        assert tier.delete(key) == 0
        assert list(tier.list_keys()) == []

    def test_verify_checks_the_frame(self, tier: Tier) -> None:
        key, parts = framed(os.urandom(10_000))
        tier.put(key, parts)
        tier.verify(key, bytes.fromhex(key))
        with pytest.raises(CorruptChunk):
            tier.verify(key, bytes(32))  # a different chunk's digest
        # A damaged copy stored under the key: the tier keeps it, verify rejects it.
        bad_key, bad_parts = framed(os.urandom(10_000))
        damaged = bytearray(joined(bad_parts))
        damaged[-1] ^= 0x01
        tier.put(bad_key, [damaged])
        assert tier.get(bad_key) == bytes(damaged)
        with pytest.raises(CorruptChunk):
            tier.verify(bad_key, bytes.fromhex(bad_key))
        truncated_key, truncated_parts = framed(os.urandom(1000))
        tier.put(truncated_key, [joined(truncated_parts)[:-10]])
        with pytest.raises(CorruptChunk):
            tier.verify(truncated_key, bytes.fromhex(truncated_key))

    def test_put_takes_any_buffer_parts(self, tier: Tier) -> None:
        data = os.urandom(70_000)
        d = frame.digest_of(data)
        header = bytes(frame.encode([data], d)[0])
        parts: list[frame.Buffer] = [
            bytearray(header),
            memoryview(data)[:30_000],
            bytearray(data[30_000:50_000]),
            data[50_000:],
        ]
        assert tier.put(d.hex(), parts) == frame.HEADER_SIZE + len(data)
        assert tier.get(d.hex()) == header + data
        assert frame.decode(tier.get(d.hex()) or b"", d) == data

    def test_large_frame_of_mixed_parts(self, tier: Tier) -> None:
        # Over a local tier's O_DIRECT threshold and not a multiple of any block size, as
        # pyfuse3 hands a chunk over: bytes parts, plus the views and bytearrays that
        # overwrites and truncations make (read-only views among them).
        data = os.urandom(3 * 1024 * 1024 + 4097)
        d = frame.digest_of(data)
        header = bytes(frame.encode([data], d)[0])
        m = 1024 * 1024
        parts: list[frame.Buffer] = [
            header,
            data[:m],
            memoryview(data)[m : 2 * m],  # read-only view
            bytearray(data[2 * m : 3 * m]),
            memoryview(bytearray(data[3 * m :])),  # writable view
        ]
        assert tier.put(d.hex(), parts) == frame.HEADER_SIZE + len(data)
        tier.verify(d.hex(), d)
        assert frame.decode(tier.get(d.hex()) or b"", d) == data
        assert tier.put(d.hex(), parts) == frame.HEADER_SIZE + len(data)  # a rewrite
        assert frame.decode(tier.get(d.hex()) or b"", d) == data

    def test_list_keys_and_usage_follow_puts_and_deletes(self, tier: Tier) -> None:
        frames = dict(framed(os.urandom(1000 + i)) for i in range(7))
        for key, parts in frames.items():
            tier.put(key, parts)
        assert sorted(tier.list_keys()) == sorted(frames)
        total = sum(len(joined(p)) for p in frames.values())
        usage = tier.usage()
        assert usage.used == total
        assert 0 <= usage.free <= usage.total
        gone = sorted(frames)[:3]
        for key in gone:
            assert tier.delete(key) == len(joined(frames[key]))
        assert sorted(tier.list_keys()) == sorted(set(frames) - set(gone))
        assert tier.usage().used == total - sum(len(joined(frames[k])) for k in gone)

    def test_sync_and_check_on_a_healthy_tier(self, tier: Tier) -> None:
        key, parts = framed(b"durable")
        tier.put(key, parts)
        tier.sync([key])
        tier.sync([])
        tier.check()

    def test_parallel_puts_and_gets_from_threads(self, tier: Tier) -> None:
        frames = dict(framed(os.urandom(20_000 + i)) for i in range(16))

        def roundtrip(item: tuple[str, list[frame.Buffer]]) -> bool:
            key, parts = item
            tier.put(key, parts)
            tier.verify(key, bytes.fromhex(key))
            return tier.get(key) == joined(parts)

        with ThreadPoolExecutor(4) as pool:
            assert all(pool.map(roundtrip, frames.items()))
        assert sorted(tier.list_keys()) == sorted(frames)
