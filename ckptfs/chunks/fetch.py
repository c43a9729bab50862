"""Fetching a chunk from the tiers that hold it: the fastest first (measured), local
tiers under the local I/O limiter, remote ones under their own (a hung object store holds
only those threads); every copy verified, falling back on a miss, damage or an I/O error,
and noting which copies need healing."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from ..catalog import ChunkRef
from ..codec import frame
from ..errors import CorruptChunk, ObjectUnreadable, TierError
from .bufpool import FramePool
from .parts import Limiters, TierSet
from .priority import Ticket

log = logging.getLogger("ckptfs.chunks")


@dataclass
class Fetched:
    """What a fetch found: the verified plaintext and its tier, and the copies to heal."""

    data: frame.Buffer | None = None
    source: str | None = None
    # (tier, missing|corrupt|unreadable|error): all but "error" are this copy's problem
    failures: list[tuple[str, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    refresh: bool = False  # nothing valid among the tiers the caller named: ask the catalog


def _runs(names: Sequence[str], remote: Callable[[str], bool]) -> list[tuple[bool, list[str]]]:
    """``names`` in order, cut into runs of the same kind: [(is_remote, names), ...]."""
    out: list[tuple[bool, list[str]]] = []
    for n in names:
        r = remote(n)
        if out and out[-1][0] == r:
            out[-1][1].append(n)
        else:
            out.append((r, [n]))
    return out


class TierFetcher:
    def __init__(self, tiers: TierSet, limiters: Limiters, frames: FramePool) -> None:
        """``frames``: the receive buffers GETs and O_DIRECT reads fill (the read cache's)."""
        self.tiers = tiers.tiers
        self.local = tiers.local
        self.residency = tiers.residency
        self.stats = tiers.stats
        self.io, self.remote_io = limiters.io, limiters.remote_io
        self.frames = frames

    async def fetch(self, ref: ChunkRef, abandon: bool, ticket: Ticket) -> Fetched:
        """Try the tiers holding the chunk, the fastest first (measured): local tiers in
        a thread under the store's I/O limiter, remote ones under ``remote_io`` (a hung
        object store holds only those threads, never the ones local writes, fsync and
        reads need)."""
        names = list(ref.tiers) or list(self.local)
        got = Fetched(refresh=True)
        if self.residency.enabled:
            # A copy outside the chunk's allowed locations (a tier relabelled since it was
            # made) is not read: not a source for this read, nor for a heal or copy-back.
            allowed = [n for n in names
                       if n not in self.tiers or self.residency.permits(ref.digest, n)]
            for name in names:
                if name not in allowed:
                    self.residency.refuse("read", name, ref.digest)
                    got.problems.append(f"{name}: outside the chunk's allowed locations")
            names = allowed
        for remote, run in _runs(self.stats.read_order(names, ref.length),
                                 lambda n: n in self.tiers and n not in self.local):
            # trio takes any object with acquire/release_on_behalf_of as the limiter (its
            # stub names CapacityLimiter only).
            limiter: Any = self.remote_io.slot(ticket) if remote else self.io
            part = await trio.to_thread.run_sync(
                self._fetch_from, ref, run, limiter=limiter, abandon_on_cancel=abandon,
            )
            got.failures += part.failures
            got.problems += part.problems
            if part.data is not None:
                got.data, got.source, got.refresh = part.data, part.source, False
                return got
        return got

    def _fetch_from(self, ref: ChunkRef, names: Sequence[str]) -> Fetched:
        """Blocking: try these tiers in order; verify; fall back on a miss, damage or an
        I/O error, noting which copies need healing."""
        got = Fetched()
        for name in names:
            tier = self.tiers.get(name)
            if tier is None:
                got.problems.append(f"{name}: tier not configured")
                continue
            started = time.perf_counter()
            get_into = getattr(tier, "get_into", None)  # GETs, O_DIRECT reads: into our buffers
            try:
                raw = tier.get(ref.key) if get_into is None else get_into(ref.key, self.frames.take)
            except ObjectUnreadable as exc:
                # This copy is bad (the tier answers other requests): heal it, keep the tier.
                log.error("chunk %s on tier %s unreadable: %s", ref.key[:16], name, exc)
                self.stats.count("unreadable_copies")
                self.stats.record_ok(name)
                got.failures.append((name, "unreadable"))
                got.problems.append(f"{name}: {exc}")
                continue
            except TierError as exc:
                log.error("chunk %s on tier %s unreadable: %s", ref.key[:16], name, exc)
                self.stats.record_error(name, str(exc))
                got.failures.append((name, "error"))
                got.problems.append(f"{name}: {exc}")
                continue
            if raw is None:
                self.stats.count("missing_copies")
                got.failures.append((name, "missing"))
                got.problems.append(f"{name}: missing")
                continue
            self.stats.record_read(name, len(raw), time.perf_counter() - started)
            self.stats.record_ok(name)
            try:
                # A sealed frame opens into a new buffer; a plain one is served in place.
                data = frame.decode_view(raw, ref.digest)
                if len(data) != ref.length:
                    raise CorruptChunk(f"length {len(data)} != {ref.length}")
            except CorruptChunk as exc:
                log.error("chunk %s on tier %s is corrupt: %s", ref.key[:16], name, exc)
                self.stats.count("integrity_failures")
                got.failures.append((name, "corrupt"))
                got.problems.append(f"{name}: {exc}")
                self._drop_frame(raw)
                continue
            if not (isinstance(data, memoryview) and isinstance(raw, memoryview)
                    and data.obj is raw.obj):
                self._drop_frame(raw)  # decompressed into new bytes: the frame is done with
            got.data, got.source = data, name
            return got
        return got

    def _drop_frame(self, raw: frame.Buffer) -> None:
        if isinstance(raw, memoryview):
            self.frames.give(raw.obj)
