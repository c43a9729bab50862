"""Placement of a new frame on the local tiers: the least busy healthy tier with room,
in the chunk's allowed locations (chunks/residency.py). Used by the writer (new chunks)
and the reader (heals and copy-backs)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from ..codec import frame
from ..errors import ChunkMissing, CkptfsError, CorruptChunk, NoSpace, ResidencyRefused, TierError
from ..tiers.base import Tier
from .parts import TierSet
from .residency import Locations

log = logging.getLogger("ckptfs.chunks")

_UNHEALTHY_RETRY_S = 5.0


class Placement:
    def __init__(self, tiers: TierSet) -> None:
        self.local = tiers.local
        self.residency = tiers.residency
        self.stats = tiers.stats
        self._inflight_bytes = {n: 0 for n in tiers.tiers}
        self._pass = {n: 0.0 for n in tiers.tiers}
        self._place_lock = threading.Lock()
        self._unhealthy: dict[str, float] = {}
        self._full: dict[str, float] = {}

    def clear_full(self) -> None:
        """Room may have been freed: tiers found full are tried in order again."""
        self._full.clear()

    def _candidates(self, bound: Locations = None) -> list[Tier]:
        """Tiers in placement order: healthy first, least queued bytes per unit of weight;
        only those in the ``bound`` locations (residency)."""
        now = time.monotonic()
        local = [t for t in self.local.values() if bound is None or t.location in bound]
        usable = [
            t for t in local
            if now - self._unhealthy.get(t.name, -1e9) > _UNHEALTHY_RETRY_S
            and now - self._full.get(t.name, -1e9) > 1.0
            and not self.stats.is_degraded(t.name)  # reads failed there: a device going bad
        ]
        # Ties (nothing queued) go round-robin by weight: each placement advances the
        # chosen tier's pass by size/weight (stride scheduling).
        usable.sort(key=lambda t: (self._inflight_bytes[t.name] / t.weight, self._pass[t.name]))
        # Tiers marked bad or full are still tried last: they may have recovered.
        rest = [t for t in local if t not in usable]
        return usable + rest

    def put_somewhere(
        self, digest: bytes, parts: Sequence[frame.Buffer], size: int, bound: Locations = None,
        what: str = "write",
    ) -> str:
        """Blocking: put the frame on the first tier (in the ``bound`` locations) that takes
        it; return the tier name. ResidencyRefused if no local tier is in them."""
        key = digest.hex()
        errors: list[CkptfsError] = []
        with self._place_lock:
            order = self._candidates(bound)
            if not order:
                self.residency.refuse(what, None, digest)
                raise ResidencyRefused(
                    f"chunk {key[:16]} may be stored only in {sorted(bound or ())}, where no "
                    f"local tier is (locations: "
                    f"{', '.join(sorted({f'{t.name}={t.location}' for t in self.local.values()}))})"
                )
            self._pass[order[0].name] += size / order[0].weight
        for tier in order:
            with self._place_lock:
                self._inflight_bytes[tier.name] += size
            try:
                tier.put(key, parts)
                if not tier.verified_put:
                    tier.verify(key, digest)  # check what the device holds, not what we sent
            except NoSpace as exc:
                self._full[tier.name] = time.monotonic()
                errors.append(exc)
                continue
            except (TierError, CorruptChunk, ChunkMissing) as exc:
                if tier.name not in self._unhealthy:
                    log.error("tier %s failed, placing chunks elsewhere: %s", tier.name, exc)
                self._unhealthy[tier.name] = time.monotonic()
                errors.append(exc)
                continue
            finally:
                with self._place_lock:
                    self._inflight_bytes[tier.name] -= size
            self._unhealthy.pop(tier.name, None)
            self._full.pop(tier.name, None)
            self.stats.record_write(tier.name, size - frame.HEADER_SIZE)
            return tier.name
        if errors and all(isinstance(e, NoSpace) for e in errors):
            raise NoSpace("no tier has room for a chunk: " + "; ".join(str(e) for e in errors))
        raise TierError("no tier could store a chunk: " + "; ".join(str(e) for e in errors))
