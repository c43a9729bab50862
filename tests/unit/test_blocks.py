"""chunks/blocks.py: the per-block digests that let part of a verified chunk be read."""

import os

from ckptfs.chunks import blocks
from ckptfs.chunks.blocks import BLOCK, BlockDigests


def test_blocks_check_against_their_own_digests_and_nothing_else() -> None:
    data = os.urandom(3 * BLOCK + 4567)  # the last block is short
    digests = blocks.of_buffer(data)
    assert len(digests) == blocks.count(len(data)) * blocks.DIGEST == 4 * blocks.DIGEST
    assert blocks.check(digests, 0, data)
    assert blocks.check(digests, 1, data[BLOCK:3 * BLOCK])
    assert blocks.check(digests, 3, data[3 * BLOCK:])  # the short last block alone
    damaged = bytearray(data[BLOCK:2 * BLOCK])
    damaged[12345] ^= 1
    assert not blocks.check(digests, 1, damaged)
    assert not blocks.check(digests, 2, data[BLOCK:2 * BLOCK])  # the right bytes, wrong place
    assert not blocks.check(digests, 3, data[3 * BLOCK:] + b"x")  # longer than the chunk
    assert not blocks.check(digests, 4, b"x")  # past the last block
    assert not blocks.check(digests, 1, data[BLOCK:2 * BLOCK - 1])  # a block cut short


def test_the_digest_cache_keeps_its_budget_and_drops_the_least_recently_used() -> None:
    entry = 4 * blocks.DIGEST
    cache = BlockDigests(budget=3 * entry)
    for i in range(3):
        cache.put(bytes([i]) * 32, bytes([i]) * entry)
    assert cache.get(b"\0" * 32) == b"\0" * entry  # used: now the most recent
    cache.put(b"\3" * 32, b"\3" * entry)
    assert b"\1" * 32 not in cache  # the least recently used went
    assert all(bytes([i]) * 32 in cache for i in (0, 2, 3))
    cache.put(b"\3" * 32, b"\4" * entry)  # replaced, not counted twice
    assert cache.get(b"\3" * 32) == b"\4" * entry and b"\2" * 32 in cache
    cache.forget([b"\0" * 32, b"\x09" * 32])
    assert b"\0" * 32 not in cache
    cache.put(b"\5" * 32, b"\5" * entry)
    assert b"\2" * 32 in cache  # the forgotten entry's room was given back
