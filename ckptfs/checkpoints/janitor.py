"""Applies retention in the daemon, in the background, with the safety rules.

After each checkpoint commit, the janitor plans retention per run (retention.py) and
carries it out; `ckptfs gc PATH` (the ``user.ckptfs.gc`` xattr) does the same for the
checkpoints under PATH only (each run is still planned whole, so what stays protected does):

* **skip_upload**: drop pending uploads of chunks only superseded checkpoints name;
* **evict_local**: drop local copies of chunks a remote holds and no upload needs, except
  chunks a checkpoint kept local also names (never evict data not yet uploaded);
* **expire**: delete the checkpoint's files and directories (their chunks go from every
  tier through the deletion queue, upload/deleter.py), unless a file under it is open
  (never delete a checkpoint being read); then, once the queue has no row left for its
  chunks, check on every tier (outside every lock) that they are gone, queueing again what
  is still there, before calling it deleted. A chunk another file references again (same
  content) is kept.

Every few seconds it also keeps the local tiers under a high watermark by evicting the
oldest chunks a remote already holds.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio

from ..errors import CkptfsError
from .retention import Ckpt, Plan, RetentionPolicy, plan_all, run_of, under

if TYPE_CHECKING:
    from ..vfs.filesystem import Filesystem

log = logging.getLogger("ckptfs.retention")

WATERMARK_CHECK_S = 5.0
LEFTOVER_RETRY_S = 30.0  # expired checkpoints not yet verified gone are looked at this often
SETTLE_S = 10.0  # how long a pass waits for the deletion queue to try a checkpoint's chunks


@dataclass
class JanitorReport:
    skipped_upload_jobs: int = 0
    evicted_bytes: int = 0
    expired: int = 0
    deleted: int = 0
    busy: int = 0  # expiries postponed: a file under the checkpoint is open


def to_ckpts(rows: list[dict[str, Any]]) -> list[Ckpt]:
    return [
        Ckpt(str(r["root"]), run_of(str(r["root"])), r["step"], str(r["state"]),
             int(r["commit_ns"] or 0), tuple(t for t in str(r["tags"]).split(",") if t))
        for r in rows
    ]


class Janitor:
    def __init__(
        self, fs: Filesystem, policies: tuple[RetentionPolicy, ...],
        high_watermark: float = 0.9, low_watermark: float = 0.8,
    ) -> None:
        self.fs = fs
        self.policies = policies
        self.high = high_watermark
        self.low = low_watermark
        self._wake = trio.Event()
        self._everything = False  # a commit asked for a pass over every run
        self._scopes: set[str] = set()  # subtrees `ckptfs gc PATH` asked for
        self._done = trio.Event()  # set (and replaced) after each retention pass
        self.passes = 0
        self._started = self._finished = 0  # loop iterations begun and ended
        self._leftovers_at = time.monotonic()
        self.last = JanitorReport()

    def kick(self) -> None:
        self._everything = True
        self._wake.set()

    async def run_now(self, scope: str = "/") -> JanitorReport:
        """Ask for a pass over the checkpoints under ``scope`` and wait for one that started
        after this call (``ckptfs gc PATH``); postponed deletions are tried again at once."""
        wanted = self._started + 1
        # The scope and the wake-up go in before any await, so the pass this call waits for
        # (the next one to start) covers the scope, and no second pass is asked for.
        self._scopes.add(scope)
        self._wake.set()
        await self.fs.deleter.retry_now()
        while self._finished < wanted:
            await self._done.wait()
        return self.last

    async def run(self) -> None:
        while True:
            with trio.move_on_after(WATERMARK_CHECK_S):
                await self._wake.wait()
            woken = self._wake.is_set()
            self._wake = trio.Event()
            scopes = None if self._everything else self._scopes
            self._everything, self._scopes = False, set()
            self._started += 1
            if woken and self.policies:
                try:
                    self.last = await self.retention_pass(scopes)
                    await self.retry_leftovers()
                except CkptfsError as exc:
                    log.error("retention pass failed: %s", exc)
                self.passes += 1
            elif time.monotonic() - self._leftovers_at > LEFTOVER_RETRY_S:
                self._leftovers_at = time.monotonic()
                try:
                    await self.retry_leftovers()
                except CkptfsError as exc:
                    log.warning("retrying deletions failed: %s", exc)
            self._finished = self._started
            done, self._done = self._done, trio.Event()
            done.set()
            await self._watermark()

    async def _watermark(self) -> None:
        store = self.fs.store
        if not store.remotes:
            return
        used, total = await trio.to_thread.run_sync(store.local_fill)
        if total <= 0 or used / total <= self.high:
            return
        want = int(used - self.low * total)
        freed = await store.evict(want)
        log.info("local tiers at %.0f%% (high watermark %.0f%%): evicted %d bytes held by a "
                 "remote tier", 100 * used / total, 100 * self.high, freed)

    async def retention_pass(self, scopes: set[str] | None = None) -> JanitorReport:
        """Plan every run; act on the checkpoints under one of ``scopes`` (None: all)."""
        fs = self.fs
        rows = await fs.db(fs.catalog.checkpoints, "/")
        plans = plan_all(to_ckpts(rows), self.policies, time.time_ns())
        report = JanitorReport()
        for run, plan in plans.items():
            await self._apply(run, plan, report, scopes)
        if report.expired or report.evicted_bytes or report.skipped_upload_jobs:
            log.info("retention: %d upload job(s) skipped, %d bytes evicted from local tiers, "
                     "%d checkpoint(s) expired, %d deleted, %d postponed (open)",
                     report.skipped_upload_jobs, report.evicted_bytes, report.expired,
                     report.deleted, report.busy)
        return report

    async def _apply(
        self, run: str, plan: Plan, report: JanitorReport, scopes: set[str] | None = None
    ) -> None:
        """Carry out ``plan``; with ``scopes``, act only on checkpoints under one of them
        (the run is planned whole: what it keeps still protects their shared chunks)."""
        def acts(root: str) -> bool:
            return scopes is None or any(under(root, s) for s in scopes)

        fs = self.fs
        kept_local = await fs.db(fs.catalog.digests_under, plan.keep_local)
        skipping = [r for r in plan.skip_upload if acts(r)]
        if skipping:
            skip = await fs.db(fs.catalog.digests_under, skipping)
            living = [r for r in plan.keep_local + plan.evict_local if r not in skipping]
            needed = await fs.db(fs.catalog.digests_under, living)
            drop = [d for d in skip if d not in needed]
            if drop:
                report.skipped_upload_jobs += await fs.db(fs.catalog.drop_upload_jobs, drop)
        evicting = [r for r in plan.evict_local if acts(r)]
        if evicting and fs.store.remotes:
            victims = await fs.db(fs.catalog.digests_under, evicting)
            report.evicted_bytes += await fs.db(
                fs.store.evict_digests, [d for d in victims if d not in kept_local]
            )
            fs.store.deletions_queued()
        for root in plan.expire:
            if acts(root):
                await self._expire(root, plan.why.get(root, ""), report)

    async def _expire(self, root: str, why: str, report: JanitorReport) -> None:
        fs = self.fs
        if await self._open_under(root):
            report.busy += 1
            return
        digests = await fs.db(fs.catalog.digests_under, [root])
        await fs.db(fs.catalog.checkpoint_set_state, root, "expired", why)
        report.expired += 1
        log.info("checkpoint %s expired (%s): deleting it", root, why)
        # Remembered before the files go: the chunks to verify gone (or delete again).
        await fs.db(fs.catalog.checkpoint_leftover, root, list(digests))
        try:
            await fs.remove_tree(root)
        except CkptfsError as exc:
            log.warning("could not delete expired checkpoint %s: %s", root, exc)
            return
        if await self._finish(root, list(digests)):
            report.deleted += 1

    async def _finish(self, root: str, digests: list[bytes]) -> bool:
        """Verify that no tier holds the chunks of an expired checkpoint; then it is
        *deleted*. The deletion queue does the deleting: this waits a little for it, then
        looks (``tier.has``, outside every lock and limiter the file system needs) and
        queues again whatever is still there. False: not yet, look again later."""
        fs = self.fs
        await fs.deleter.settle(digests, SETTLE_S)
        referenced = await fs.db(fs.catalog.referenced_digests)
        candidates = [d for d in digests if d not in referenced]  # shared ones are kept
        queued = await fs.db(fs.catalog.deletions_pending, candidates)
        present, unknown = await trio.to_thread.run_sync(
            self._still_there, [d for d in candidates if d not in queued],
            limiter=fs.deleter.remote_limiter,
        )
        if present:
            await fs.db(fs.catalog.queue_deletions, present)
            fs.store.deletions_queued()
        left = sorted(queued | {d for d, _ in present} | unknown)
        await fs.db(fs.catalog.checkpoint_leftover, root, left)
        if left:
            log.info("checkpoint %s: %d chunk(s) not yet verified gone from every tier "
                     "(queued for deletion, or held by a file being written); looking again "
                     "later", root, len(left))
            return False
        await fs.db(fs.catalog.checkpoint_set_state, root, "deleted", None)
        log.info("checkpoint %s deleted: verified gone from every tier", root)
        return True

    def _still_there(self, digests: list[bytes]) -> tuple[list[tuple[bytes, str]], set[bytes]]:
        """Blocking (no lock, no catalog): the (chunk, tier) pairs still holding a frame, and
        the chunks a tier could not answer for."""
        present: list[tuple[bytes, str]] = []
        unknown: set[bytes] = set()
        failed: dict[str, str] = {}  # tiers that could not answer: not asked again now
        for d in digests:
            for tier in self.fs.store.tiers.values():
                if tier.name in failed:
                    unknown.add(d)
                    continue
                try:
                    if tier.has(d.hex()):
                        present.append((d, tier.name))
                except CkptfsError as exc:
                    failed[tier.name] = str(exc)
                    unknown.add(d)
        for name, err in failed.items():
            log.warning("tier %s cannot say whether expired chunks are gone: %s", name, err)
        return present, unknown

    async def retry_leftovers(self) -> None:
        fs = self.fs
        for root, digests in (await fs.db(fs.catalog.expired_leftovers)).items():
            await self._finish(root, digests)

    async def _open_under(self, root: str) -> bool:
        fs = self.fs
        inos = sorted({h.file.ino for h in fs.handles.values()})
        for ino in inos:
            path = await fs.db(fs.catalog.path_of, ino)
            if path == root or path.startswith(root.rstrip("/") + "/"):
                return True
        return False
