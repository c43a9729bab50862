"""Reads of chunks only another node holds (a shared catalog): such a chunk was committed
there and not uploaded yet. A read waits for a copy on a tier this node reads, asking the
catalog with backoff, and wants the chunk in the catalog meanwhile (its holder uploads it
first: catalog/wants.py); one wait per silent node, not one per chunk."""

from __future__ import annotations

import contextlib
import logging
import math
import uuid
from collections.abc import Awaitable, Callable, Collection
from typing import Protocol

import trio

from ..catalog import ChunkRef
from ..catalog.protocols import ReplicaCatalog, SessionCatalog, WantCatalog
from ..errors import CatalogUnavailable, PeerChunkPending
from .fetch import Fetched
from .priority import Ticket

log = logging.getLogger("ckptfs.chunks")

# A read waiting for another node's upload asks the shared catalog again after this long,
# doubling up to the max (the catalog is the only news of another node's upload).
PEER_POLL_MIN_S = 0.1
PEER_POLL_MAX_S = 1.0
# After a wait for another node's chunk gave up, reads of chunks only that node holds
# fail at once for this long (a read of a file it alone holds waits once, not per chunk).
PEER_QUIET_S = 60.0
# Such a read records a want in the catalog (catalog/wants.py): the holding node uploads the
# chunk first. The want outlives the wait by this much (a stale one expires by itself).
WANT_SLACK_S = 10.0


class PeerCatalog(ReplicaCatalog, SessionCatalog, WantCatalog, Protocol):
    """Where a chunk's copies are, which nodes are alive, and the wants of chunks."""


class PeerWaits:
    def __init__(
        self, catalog: PeerCatalog, db_limiter: trio.CapacityLimiter, tiers: Collection[str],
        peer_wait_s: float, node: str,
    ) -> None:
        """``tiers``: the tiers this node reads; ``peer_wait_s``: how long a read of a
        chunk only other nodes hold waits for their upload (peer_chunk_wait); ``node``:
        this node's name (it names this node's wants of such chunks in the catalog)."""
        self.catalog = catalog
        self.db_limiter = db_limiter
        self.tiers = tiers
        self.peer_wait_s = peer_wait_s
        # Per other node (trio time): when the wait for its chunks now going on began (the
        # waits on one node share one deadline), and when such a wait last gave up (reads
        # of its chunks then fail at once for PEER_QUIET_S): a file read waits once for a
        # node that uploads nothing, not once per chunk.
        self._peer_waits: dict[str, float] = {}
        self._peer_gave_up: dict[str, float] = {}
        # Who waits, in the catalog's wants: the node, and this daemon's run of it.
        self.waiter = f"{node or 'node'}:{uuid.uuid4().hex[:8]}"

    async def await_peer(
        self, ref: ChunkRef, got: Fetched, abandon: bool, ticket: Ticket,
        fetch: Callable[[ChunkRef, bool, Ticket], Awaitable[Fetched]],
    ) -> Fetched:
        """A shared catalog: a chunk recorded only on other nodes' local tiers was committed
        there and not uploaded yet. Wait up to ``peer_wait_s`` for a copy on a tier this
        node reads (their uploader puts it on the bucket), asking the catalog with backoff,
        then fetch it. PeerChunkPending (EIO) names the nodes if none came, at once if
        none of them has a live session (dead: nothing will upload it) or a wait on each
        gave up lately (``_peer_deadline``); ``got`` as it was if the chunk is not another
        node's. Meanwhile the chunk is wanted in the catalog: its holder uploads it before
        its other jobs (``_want``)."""
        deadline: float | None = None
        delay = PEER_POLL_MIN_S
        asked = wanted = False
        try:
            while True:
                reachable, holders, nodes = await self._where_now(ref)
                if reachable and not set(reachable) <= set(ref.tiers):
                    fresh = await fetch(
                        ChunkRef(ref.digest, ref.length, reachable), abandon, ticket
                    )
                    if fresh.data is not None:
                        self._delivered(nodes)  # they deliver: the next chunk waits afresh
                        return fresh
                if reachable or not holders:
                    return got  # not (only) another node's: missing or damaged as it is
                deadline = await self._wait_goes_on(ref, holders, nodes, deadline)
                if not asked:
                    asked = True
                    wanted = await self._want(ref.digest, deadline - trio.current_time())
                await trio.sleep(min(delay, max(0.0, deadline - trio.current_time())))
                delay = min(delay * 2, PEER_POLL_MAX_S)
        finally:
            if wanted:
                with trio.CancelScope(shield=True):  # also when the read is cancelled
                    await self._unwant(ref.digest)

    async def _where_now(
        self, ref: ChunkRef
    ) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
        """The chunk's copies as the catalog lists them now: (on tiers this node reads, on
        other nodes' tiers, those nodes)."""
        tiers = await trio.to_thread.run_sync(
            self.catalog.replica_tiers, ref.digest, limiter=self.db_limiter
        )
        reachable = tuple(t for t in tiers if t in self.tiers)
        holders = tuple(t for t in tiers if t not in self.tiers)
        nodes = tuple(sorted({t.split(":", 1)[0] for t in holders}))
        return reachable, holders, nodes

    def _delivered(self, nodes: tuple[str, ...]) -> None:
        for n in nodes:
            self._peer_waits.pop(n, None)
            self._peer_gave_up.pop(n, None)

    async def _wait_goes_on(
        self, ref: ChunkRef, holders: tuple[str, ...], nodes: tuple[str, ...],
        deadline: float | None,
    ) -> float:
        """The deadline of a wait for ``nodes`` that goes on (set at the first look);
        PeerChunkPending if it ends here: they are down, were waited on lately, or the
        deadline passed."""
        where = f"node {', '.join(nodes)} ({', '.join(holders)})"
        if await self._peers_gone(nodes):
            raise PeerChunkPending(
                f"chunk {ref.key[:16]} is only on {where}, whose session has ended "
                "(the node is down): nothing will upload it until it is back", nodes)
        if deadline is None:
            deadline = self._peer_deadline(nodes)
            if deadline is None:
                raise PeerChunkPending(
                    f"chunk {ref.key[:16]} is only on {where}; a read waited "
                    f"{self.peer_wait_s:g} s for that node's chunks less than "
                    f"{PEER_QUIET_S:g} s ago: not waiting again", nodes)
        if trio.current_time() >= deadline:
            now = trio.current_time()
            for n in nodes:
                self._peer_waits.pop(n, None)
                self._peer_gave_up[n] = now
            raise PeerChunkPending(
                f"chunk {ref.key[:16]} is only on {where}, not uploaded within "
                f"{self.peer_wait_s:g} s", nodes)
        return deadline

    def _peer_deadline(self, nodes: tuple[str, ...]) -> float | None:
        """When a wait for a chunk only ``nodes`` hold ends: ``peer_wait_s`` after the
        wait on them now going on began (one deadline for all their chunks); None: do not
        wait, a wait on each of them gave up less than PEER_QUIET_S ago."""
        now = trio.current_time()
        if all(now - self._peer_gave_up.get(n, -math.inf) < PEER_QUIET_S for n in nodes):
            return None
        began = []
        for n in nodes:
            since = self._peer_waits.get(n)
            if since is None or now - since > self.peer_wait_s:  # none, or one abandoned
                since = self._peer_waits[n] = now
            began.append(since)
        return max(began) + self.peer_wait_s

    async def _peers_gone(self, nodes: tuple[str, ...]) -> bool:
        """True if none of ``nodes`` has a live session in the catalog (dead, or cut off
        long enough for its session to expire): waiting for their uploads is useless. A
        catalog that cannot say: False (wait as usual)."""
        try:
            rows = await trio.to_thread.run_sync(self.catalog.sessions, limiter=self.db_limiter)
        except CatalogUnavailable:
            return False
        return not {r.node for r in rows if r.live} & set(nodes)

    async def _want(self, digest: bytes, wait_s: float) -> bool:
        """Record in the catalog that this node waits for ``digest`` (its holder is told at
        the commit). A catalog that cannot take it costs only the expedite: False."""
        try:
            await trio.to_thread.run_sync(
                self.catalog.want_chunks, [digest], self.waiter, wait_s + WANT_SLACK_S,
                limiter=self.db_limiter,
            )
        except CatalogUnavailable as exc:
            log.warning("could not ask for the upload of chunk %s first: %s", digest.hex()[:16], exc)
            return False
        return True

    async def _unwant(self, digest: bytes) -> None:
        # Not removed (the database is away): the want expires by itself (WANT_SLACK_S
        # after the wait would have ended).
        with contextlib.suppress(CatalogUnavailable):
            await trio.to_thread.run_sync(
                self.catalog.unwant_chunks, [digest], self.waiter, limiter=self.db_limiter
            )
