"""The daemon's audit services (docs/governance.md "Audit log"): the flusher, which writes
the noted open-for-read records (catalog/audit.py ``audit_note``) together in one catalog
transaction shortly after the opens, and the sealer, which signs the head of the chain
every ``seal_interval_s`` (when it moved) and stores the seal on the remote tiers
(upload/seal.py)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Protocol

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..catalog.audit import AuditEntry
from ..catalog.protocols import AuditCatalog, MetaCatalog
from ..errors import CatalogUnavailable, CkptfsError
from ..wakeup import ThreadWakeup
from .seal import SealStore, make_seal, store_seal

log = logging.getLogger("ckptfs.audit")

# Opens noted within this long of each other go into one transaction: an open costs no
# catalog write of its own, and a restore opening thousands of files costs a few.
FLUSH_DELAY_S = 0.5


class SealCatalog(AuditCatalog, MetaCatalog, Protocol):
    """What the sealer reads: the head and the fs_id."""


class AuditFlusher:
    """Writes the noted records: woken by the first note after a flush, waits
    FLUSH_DELAY_S for more, writes them all; at the end (``run`` cancelled, or
    ``flush_now`` at shutdown) writes what is left."""

    def __init__(self, catalog: AuditCatalog, db_limiter: trio.CapacityLimiter,
                 delay_s: float = FLUSH_DELAY_S, *, noted: ThreadWakeup | None = None) -> None:
        """``noted``: set by the catalog's on_audit_note hook (any thread), given when
        the catalog was opened (catalog/hooks.py)."""
        self.catalog = catalog
        self.db_limiter = db_limiter
        self.delay_s = delay_s
        self._wake = noted if noted is not None else ThreadWakeup()

    async def flush_now(self) -> int:
        return await trio.to_thread.run_sync(self.catalog.audit_flush, limiter=self.db_limiter)

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            await trio.sleep(self.delay_s)
            self._wake.clear()
            try:
                await self.flush_now()
            except CatalogUnavailable as exc:
                # Kept noted: written by the next flush once the catalog answers.
                log.warning("audit: %d open record(s) not written yet: %s",
                            self.catalog.audit_pending(), exc)
                self._wake.set()
                await trio.sleep(1.0)


class AuditSealer:
    """Every ``interval_s``: if the head of the log moved since the last seal, sign it and
    store the seal on every remote tier (create-only). A failure is logged and retried at
    the next interval."""

    def __init__(self, catalog: SealCatalog, db_limiter: trio.CapacityLimiter,
                 remotes: Sequence[SealStore], key: Ed25519PrivateKey, interval_s: float,
                 flusher: AuditFlusher | None = None) -> None:
        self.catalog = catalog
        self.db_limiter = db_limiter
        self.remotes = list(remotes)
        self.key = key
        self.interval_s = interval_s
        self.flusher = flusher
        self.sealed_seq = 0  # the head last sealed on every remote
        self.seals = 0  # seals stored by this node (tests, status)

    async def run(self) -> None:
        if not self.remotes:
            log.warning("audit.signing_key_file is set, but there is no remote tier: the "
                        "head of the audit log is not sealed")
            return
        while True:
            await trio.sleep(self.interval_s)
            await self.seal_once()

    async def seal_once(self) -> int | None:
        """Seal the head now if it moved; the seq sealed (None: nothing new, or failed)."""
        if self.flusher is not None:
            with contextlib.suppress(CatalogUnavailable):
                await self.flusher.flush_now()

        def head() -> tuple[AuditEntry | None, str]:
            return self.catalog.audit_head(), self.catalog.get_meta("fs_id") or ""

        entry, fs_id = await trio.to_thread.run_sync(head, limiter=self.db_limiter)
        if entry is None or entry.seq <= self.sealed_seq:
            return None
        seal = make_seal(self.key, fs_id, entry, self.catalog.audit_node, time.time_ns())
        ok = True
        for tier in self.remotes:
            try:
                await trio.to_thread.run_sync(store_seal, tier, seal)
            except CkptfsError as exc:
                ok = False
                log.warning("audit: seal of record %d not stored on %s: %s", seal.seq,
                            tier.name, exc)
        if not ok:
            return None
        self.sealed_seq = seal.seq
        self.seals += 1
        log.info("audit: sealed record %d (%s)", seal.seq, seal.digest.hex()[:16])
        return seal.seq
