"""The upload queue: copies committed chunks from a local tier to their remote tiers.

Jobs are catalog rows written in the same transaction as the commit that makes a file name
the chunk, so a restart replays them. Oldest commit first, a bounded number at once (worker
threads under a limiter), transient errors retried with exponential backoff and jitter,
permanent ones (access denied, no bucket) reported once and retried rarely; the data stays
local meanwhile. A finished copy becomes a replica row; a copy whose job was cancelled
(the chunk was deleted while it uploaded) is removed again.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import math
import random
import time
from collections.abc import Callable

import trio

from ..catalog import Catalog
from ..catalog.catalog import UploadJob
from ..chunks import frame
from ..chunks.store import ChunkStore
from ..errors import ChunkMissing, CkptfsError, CorruptChunk, PermanentTierError, TierError

log = logging.getLogger("ckptfs.upload")

BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 60.0
BLOCKED_RETRY_S = 300.0
SNAPSHOT_NAME = "catalog.snapshot"
RATE_WINDOW_S = 2.0


def backoff_s(attempts: int, rnd: Callable[[], float] = random.random) -> float:
    """Exponential backoff with full jitter: uniform in [d/2, d], d = base * 2**attempts."""
    d = min(BACKOFF_MAX_S, BACKOFF_BASE_S * (2 ** min(attempts, 30)))
    return d * (0.5 + 0.5 * rnd())


class Uploader:
    def __init__(
        self,
        catalog: Catalog,
        store: ChunkStore,
        db_limiter: trio.CapacityLimiter,
        concurrency: int = 8,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.catalog = catalog
        self.store = store
        self.db_limiter = db_limiter
        self.concurrency = concurrency
        self.clock = clock
        self.limiter = trio.CapacityLimiter(concurrency)
        self.running: set[tuple[bytes, str]] = set()
        self.uploaded_bytes = 0
        self._wake = trio.Event()
        self._failing: set[str] = set()  # tiers whose last upload failed (log once per streak)
        self._snapshot_failures = 0
        self._rate_mark: tuple[float, int] | None = None

    def kick(self) -> None:
        """Something changed (a commit, a finished upload): look at the queue again."""
        self._wake.set()

    async def run(self) -> None:
        if not self.store.remotes:
            return
        async with trio.open_nursery() as nursery:
            while True:
                self._wake = trio.Event()
                snapshot_retry_s = math.inf
                if not self.running:
                    snapshot_retry_s = await self._maybe_snapshot()
                free = self.concurrency - len(self.running)
                if free > 0:
                    jobs = await trio.to_thread.run_sync(
                        self.catalog.due_uploads, self.clock(), free, set(self.running),
                        limiter=self.db_limiter,
                    )
                    for job in jobs:
                        self.running.add((job.digest, job.tier))
                        nursery.start_soon(self._upload, job)
                due = await trio.to_thread.run_sync(
                    self.catalog.next_upload_due_ns, set(self.running), limiter=self.db_limiter
                )
                delay = math.inf if due is None else max(0.0, (due - self.clock()) / 1e9)
                if free <= 0 or delay == 0.0:
                    delay = math.inf if self.running else delay  # a finishing job kicks us
                delay = min(delay, snapshot_retry_s)
                with trio.move_on_after(delay):
                    await self._wake.wait()

    async def _upload(self, job: UploadJob) -> None:
        key = (job.digest, job.tier)
        try:
            await trio.to_thread.run_sync(self._copy, job, limiter=self.limiter)
        except PermanentTierError as exc:
            log.error("upload to tier %s refused: %s; chunks stay local, retry in %.0f s",
                      job.tier, exc, BLOCKED_RETRY_S)
            await self._postpone(job, BLOCKED_RETRY_S, str(exc), blocked=True)
        except (ChunkMissing, CorruptChunk) as exc:
            log.error("chunk %s has no valid local copy to upload: %s", job.digest.hex()[:16], exc)
            await self._postpone(job, BLOCKED_RETRY_S, str(exc), blocked=True)
        except TierError as exc:  # transient: throttling, 5xx, resets, timeouts, outage
            if job.tier not in self._failing:
                log.warning("upload to tier %s failed, will retry with backoff: %s", job.tier, exc)
                self._failing.add(job.tier)
            await self._postpone(job, backoff_s(job.attempts), str(exc), blocked=False)
        else:
            if job.tier in self._failing:
                log.info("uploads to tier %s work again", job.tier)
                self._failing.discard(job.tier)
            kept = await trio.to_thread.run_sync(
                self.catalog.finish_upload, job.digest, job.tier, limiter=self.db_limiter
            )
            if kept:
                self.uploaded_bytes += job.length
                await self._record_rate()
            else:
                await self._discard_copy(job)
        finally:
            self.running.discard(key)
            self.kick()

    async def _maybe_snapshot(self) -> float:
        """When nothing is pending and the namespace changed since the last snapshot, put
        a verified copy of the catalog on every remote tier: what a fresh node restores.
        Returns seconds until a failed snapshot should be retried (inf if none failed)."""

        def backup() -> tuple[int, bytes] | None:
            if self.catalog.backlog().chunks or self.catalog.snapshot_is_current():
                return None
            return time.time_ns(), self.catalog.backup_bytes()

        taken = await trio.to_thread.run_sync(backup, limiter=self.db_limiter)
        if taken is None:
            return math.inf
        of_ns, data = taken
        digest = frame.digest_of(data)
        framed = b"".join(bytes(p) for p in frame.encode([data], digest))
        try:
            for remote in self.store.remotes:
                await trio.to_thread.run_sync(
                    remote.put_meta, SNAPSHOT_NAME, framed, limiter=self.limiter  # type: ignore[attr-defined]
                )
        except TierError as exc:
            self._snapshot_failures += 1
            delay = backoff_s(self._snapshot_failures)
            log.warning("catalog snapshot upload failed (retry in %.1f s): %s", delay, exc)
            return delay
        self._snapshot_failures = 0
        await trio.to_thread.run_sync(
            self.catalog.set_meta, "snapshot_of_ns", str(of_ns), limiter=self.db_limiter
        )
        log.info("catalog snapshot (%d bytes) stored on %d remote tier(s)",
                 len(data), len(self.store.remotes))
        return math.inf

    async def _record_rate(self) -> None:
        """Publish the upload rate (bytes/s over the last window) in the catalog's meta,
        at most once per RATE_WINDOW_S, for `ckptfs status` (rate and ETA)."""
        now = time.monotonic()
        if self._rate_mark is None:
            self._rate_mark = (now, self.uploaded_bytes)
            return
        t0, b0 = self._rate_mark
        if now - t0 < RATE_WINDOW_S:
            return
        rate = (self.uploaded_bytes - b0) / (now - t0)
        self._rate_mark = (now, self.uploaded_bytes)
        await trio.to_thread.run_sync(
            self.catalog.set_meta, "upload_rate", f"{rate:.0f} {time.time_ns()}",
            limiter=self.db_limiter,
        )

    async def _postpone(self, job: UploadJob, delay_s: float, error: str, blocked: bool) -> None:
        await trio.to_thread.run_sync(
            self.catalog.postpone_upload, job.digest, job.tier,
            self.clock() + int(delay_s * 1e9), error[:500], blocked, limiter=self.db_limiter,
        )

    async def _discard_copy(self, job: UploadJob) -> None:
        remote = self.store.tiers.get(job.tier)
        if remote is None:
            return
        try:
            await trio.to_thread.run_sync(remote.delete, job.digest.hex(), limiter=self.limiter)
        except CkptfsError as exc:
            log.warning("could not remove cancelled upload %s: %s", job.digest.hex()[:16], exc)

    def _copy(self, job: UploadJob) -> None:
        """Blocking: read a verified local copy and put it on the remote tier."""
        remote = self.store.tiers.get(job.tier)
        if remote is None:
            raise PermanentTierError(f"tier {job.tier} is not configured")
        key = job.digest.hex()
        problems = []
        for name in job.sources:
            tier = self.store.local.get(name)
            if tier is None:
                continue
            raw = tier.get(key)
            if raw is None:
                problems.append(f"{name}: missing")
                continue
            try:
                frame.verify(raw, job.digest)  # never upload bytes we cannot vouch for
            except CorruptChunk as exc:
                problems.append(f"{name}: {exc}")
                continue
            # The server checks what arrives against the checksum of what we verified.
            sha = base64.b64encode(hashlib.sha256(raw).digest()).decode()
            remote.put(key, [raw], expected_sha256=sha)
            return
        raise ChunkMissing("; ".join(problems) or "no local replica recorded")
