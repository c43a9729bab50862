"""The Tier protocol: a small, idempotent key -> frame store.

``put`` is all-or-nothing, ``get`` returns None on a miss and raises on a broken device,
``delete`` is idempotent. Every implementation runs the same conformance tests.
``put`` keeps no reference to its parts once it returns: callers read frames into reused
buffers (the uploader, chunks/bufpool.py) and read into them again afterwards. A tier may
also offer ``get_into(key, take)``: the frame read into ``take(size)`` (LocalTier, S3Tier).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from ..codec import frame
from ..codec.frame import Buffer
from ..errors import ChunkMissing


@dataclass(frozen=True)
class TierUsage:
    total: int  # bytes the tier may hold (device size, or the configured cap)
    free: int  # bytes still available to ckptfs on this tier
    used: int  # bytes of chunk frames ckptfs holds there
    device: int  # st_dev of the backing filesystem, to avoid double counting in statfs
    capped: bool = False  # total/free come from a configured cap, not from the device


class Tier(Protocol):
    name: str
    kind: str
    location: str
    weight: float
    # True if ``put`` itself reads the frame back from the device and compares it with
    # what it was given (then a ``verify`` right after it would only repeat that check).
    verified_put: bool

    @property
    def request_grace_s(self) -> float:
        """How long after a request in doubt failed (TierError.in_doubt) it may still
        take effect there (S3Tier: from its timeouts). 0: a request that failed is over."""
        ...

    def put(self, key: str, parts: Sequence[Buffer], expected_sha256: str | None = None) -> int: ...
    def get(self, key: str) -> Buffer | None: ...
    def has(self, key: str) -> bool: ...
    def verify(self, key: str, digest: bytes) -> None: ...
    def delete(self, key: str) -> int: ...
    def sync(self, keys: Sequence[str]) -> None: ...
    def list_keys(self) -> Iterator[str]: ...
    def usage(self) -> TierUsage: ...
    def check(self) -> None: ...


def verify_by_reading(tier: Tier, key: str, digest: bytes) -> None:
    """``Tier.verify`` for tiers whose cheapest check is to read the frame back."""
    raw = tier.get(key)
    if raw is None:
        raise ChunkMissing(f"tier {tier.name}: chunk {key[:16]} missing")
    frame.verify(raw, digest)
