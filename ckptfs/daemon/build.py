"""The composition root: the daemon's services, built from the config sections, the
opened tiers and the opened catalog (``build``; ``build_for_config`` with a whole Config).

``build`` is the one place that constructs the chunk store, upload and deletion queues,
checkpoint tracker, janitor, filesystem and telemetry, each given only what it uses and
every hook it needs at construction; the tests build through it too. The wake-ups the
catalog and the chunk guard call from worker threads (``Wakeups``) are made before the
catalog is opened, which gets them as its hooks (``Wakeups.catalog_hooks``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..catalog import Catalog
from ..catalog.hooks import CatalogHooks
from ..checkpoints.detectors import DetectorSet
from ..checkpoints.janitor import GcRequests, Janitor
from ..checkpoints.tracker import CheckpointTracker
from ..chunks.guard import ChunkGuard
from ..chunks.residency import Residency
from ..chunks.room import Room
from ..chunks.store import ChunkStore, SharedState, StoreHooks, StorePolicy, stats_for
from ..config import (
    CheckpointConfig,
    Config,
    DurabilityPolicy,
    ReadConfig,
    RetentionConfig,
    UploadConfig,
)
from ..config.model import DrillConfig, GovernanceConfig, ScrubConfig, StoreConfig
from ..drill.principal import Principal
from ..drill.service import AccessCheck, DrillService, SaveGate
from ..errors import PermissionDenied
from ..keys.ring import NamespaceKeys
from ..metrics.drills import DrillMetrics
from ..metrics.exporter import Endpoint
from ..metrics.requests import APP
from ..metrics.telemetry import Telemetry
from ..scrub.service import Scrubber
from ..session import NodeSession
from ..stats import STATS_FILE, Stats
from ..tiers.base import Tier
from ..upload.auditing import AuditFlusher, AuditSealer
from ..upload.commits import CommitStream
from ..upload.deleter import Deleter
from ..upload.seal import SealStore
from ..upload.uploader import Uploader
from ..vfs.access import Access
from ..vfs.context import RequestContext
from ..vfs.fileservices import MemoryBudget
from ..vfs.filesystem import Filesystem, HandleTable
from ..vfs.openfile import OpenFiles
from ..vfs.options import FsGovernance, FsKernel, FsOptions, FsPeers
from ..vfs.pagepush import PagePush, StorePages
from ..vfs.quota import Quotas
from ..vfs.refusals import Refusals
from ..wakeup import ThreadWakeup, Wakeup
from .restore import fetch_snapshot

log = logging.getLogger("ckptfs.mount")  # the mount's log, as before the split


@dataclass(frozen=True)
class Wakeups:
    """What worker threads poke, made before the catalog is opened: the catalog's hooks
    (a change: the uploader's snapshot; an audit note: the flusher) and the chunk guard's
    release (the deleter), with this node's name for the audit records."""

    touched: ThreadWakeup = field(default_factory=ThreadWakeup)
    audit_noted: ThreadWakeup = field(default_factory=ThreadWakeup)
    released: ThreadWakeup = field(default_factory=ThreadWakeup)
    node: str = field(default_factory=socket.gethostname)

    def catalog_hooks(self) -> CatalogHooks:
        """What the catalog is opened with (catalog/hooks.py)."""
        return CatalogHooks(on_touch=self.touched.set, on_audit_note=self.audit_noted.set,
                            on_audit_pending=self.audit_noted.set, node=self.node)


@dataclass(frozen=True)
class Kernel:
    """What the services tell the kernel (mount.py's FUSE notifications; none in tests):
    an inode's cached pages, a name, pages pushed into its cache."""

    invalidate: Callable[[int], None] | None = None
    invalidate_entry: Callable[[int, bytes], None] | None = None
    store_pages: StorePages | None = None


@dataclass
class Daemon:
    """The components of a mounted filesystem, as ``build`` wired them."""

    catalog: Catalog
    db_limiter: trio.CapacityLimiter
    store: ChunkStore
    uploader: Uploader
    deleter: Deleter
    tracker: CheckpointTracker | None
    gc: GcRequests
    janitor: Janitor
    budget: MemoryBudget
    fs: Filesystem
    telemetry: Telemetry
    auditor: AuditFlusher
    stats_path: Path | None = None
    session: NodeSession | None = None  # this node's, with a shared catalog
    sealer: AuditSealer | None = None  # with audit.signing_key_file
    keys: NamespaceKeys | None = None  # encrypted namespaces' keys, followed in the catalog
    refusals: Refusals | None = None  # refused access, aggregated for the audit log
    scrubber: Scrubber | None = None  # every copy checked in the background ([scrub])
    drill: DrillService | None = None  # restore drills (ckptfs drill, [drill] interval)


@dataclass
class _Shared:
    """State made first and shared by the store, the queues and the VFS: two needs run
    against the build order (the store wakes the uploader and the deleter, which use the
    store's state; the tracker and the filesystem ask the janitor for passes, and the
    janitor deletes through the filesystem), so they go through objects built before
    both sides."""

    db_limiter: trio.CapacityLimiter
    guard: ChunkGuard
    stats: Stats
    residency: Residency
    upload_wake: Wakeup
    delete_wake: Wakeup
    commits: CommitStream
    room: Room
    synced: set[bytes]
    open_files: OpenFiles
    handles: HandleTable
    budget: MemoryBudget


def _shared_state(
    catalog: Catalog, tiers: Sequence[Tier], store: StoreConfig, gov: GovernanceConfig,
    wakeups: Wakeups,
) -> _Shared:
    # Catalog calls run in worker threads, this many at once: one for the embedded SQLite
    # file (one connection); a shared catalog's connection pool size.
    db_limiter = trio.CapacityLimiter(catalog.concurrency)
    # State shared by the store, the uploader and the deleter; a pin's release wakes the
    # deleter (from any thread).
    guard = ChunkGuard((t.name for t in tiers if t.kind == "local"), wakeups.released.set)
    stats = stats_for(tiers)
    # Where copies of each chunk may be (namespaces' allowed_locations): the store, the
    # uploader and the telemetry ask it; load_residency fills it from the catalog.
    residency = Residency(gov, {t.name: t.location for t in tiers}, stats)
    upload_wake = Wakeup()
    # The VFS's tables, shared with the memory budget, the tracker and the janitor.
    open_files, handles = OpenFiles(), HandleTable()
    return _Shared(
        db_limiter, guard, stats, residency, upload_wake, Wakeup(),
        CommitStream(),  # new upload jobs, one after another: a save of small files
        Room(on_wait=upload_wake.set),  # uploads deferred to a save go ahead for a writer
        set(),  # frames known fsynced (the deleter forgets deleted ones)
        open_files, handles, MemoryBudget(store.memory_budget, spill=open_files.spill_all),
    )


def _queues(
    catalog: Catalog, tiers: Sequence[Tier], s: _Shared, upload: UploadConfig,
    wakeups: Wakeups, session: NodeSession | None, shared: bool,
) -> tuple[Deleter, Uploader]:
    deleter = Deleter(catalog, tiers, s.db_limiter, guard=s.guard, stats=s.stats, room=s.room,
                      forget_frames=s.synced.difference_update, wake=s.delete_wake,
                      released=wakeups.released,
                      on_done=s.upload_wake.set,  # an upload may wait for a deletion
                      # Other nodes queue and end rows (a shared catalog; None: SQLite).
                      listener=catalog.listen_deletions(),
                      # Its claims name it: a restart of this node takes them back.
                      owner=None if session is None else (lambda: (session.node, session.sid)),
                      one_daemon=not shared)
    budget = s.budget
    uploader = Uploader(
        catalog, tiers, s.db_limiter, upload, guard=s.guard, stats=s.stats, room=s.room,
        deleter=deleter, wake=s.upload_wake, touches=wakeups.touched,
        saving=lambda: budget.used > 0,  # chunk buffers in memory: a save runs
        save_over=budget.wait_empty, residency=s.residency, commits=s.commits,
        held=catalog.listen_held_uploads(),  # other nodes' claims' ends (None: SQLite)
    )
    return deleter, uploader


def _chunk_store(
    catalog: Catalog, tiers: Sequence[Tier], s: _Shared, chunk_size: int, store: StoreConfig,
    reads: ReadConfig, deleter: Deleter, uploader: Uploader, session: NodeSession | None,
) -> ChunkStore:
    return ChunkStore(
        tiers, catalog, s.db_limiter,
        StorePolicy(
            io_threads=store.io_threads,
            cache_bytes=max(store.memory_budget // 2, 2 * chunk_size),
            on_local_full=store.on_local_full, local_full_timeout_s=store.local_full_timeout_s,
            remote_copies=store.remote_copies, remote_reads=reads.remote_concurrency,
            peer_wait_s=reads.peer_wait_s, write_behind=store.write_behind,
        ),
        shared=SharedState(guard=s.guard, stats=s.stats, room=s.room, synced=s.synced),
        deleter=deleter,
        # A full local tier moves the writers' uncommitted chunks to the remote through it.
        spill_copy=uploader.copy_uncommitted,
        hooks=StoreHooks(on_requeue=s.commits.queued, on_deletions=s.delete_wake.set),
        node="" if session is None else session.node, residency=s.residency,
    )


def _filesystem(
    catalog: Catalog, s: _Shared, chunk_size: int, parts: _Parts, sections: Sections,
    kernel: Kernel, session: NodeSession | None, access: Access, shared: bool,
) -> Filesystem:
    store, reads, gov = parts.store, sections.reads, sections.governance
    db_limiter = s.db_limiter

    async def ns_used(ns: str) -> int:  # a namespace's usage, read again before a refusal
        return await trio.to_thread.run_sync(catalog.namespace_used, ns, limiter=db_limiter)

    quotas = None
    if gov.namespaces:  # each namespace's usage as counted at mount (count_namespaces)
        quotas = Quotas(gov.namespaces, ns_used,
                        {u.ns: u.bytes for u in catalog.namespace_usage()})
    push = kernel.store_pages
    return Filesystem(
        catalog, store,
        FsOptions(chunk_size, sections.policies, reads.readahead, reads.copy_back, shared),
        db_limiter=db_limiter, budget=s.budget, open_files=s.open_files, handles=s.handles,
        peers=FsPeers(store.view, parts.uploader, parts.gc, parts.tracker, session,
                      parts.scrubber, parts.drill),
        kernel=FsKernel(kernel.invalidate, kernel.invalidate_entry,
                        None if push is None or not reads.page_cache_push
                        else PagePush.make(push, s.stats.count, _delivered)),
        governance=FsGovernance(access, quotas, sealed_namespaces(gov)),
    )


@dataclass(frozen=True)
class Sections:
    """The config sections ``build`` reads (config/model.py); ``checkpoints`` None: no
    detectors, no tracker."""

    store: StoreConfig = field(default_factory=StoreConfig)
    upload: UploadConfig = field(default_factory=UploadConfig)
    reads: ReadConfig = field(default_factory=ReadConfig)
    checkpoints: CheckpointConfig | None = None
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    policies: tuple[DurabilityPolicy, ...] = ()
    governance: GovernanceConfig = field(default_factory=GovernanceConfig)
    scrub: ScrubConfig = field(default_factory=ScrubConfig)
    drill: DrillConfig = field(default_factory=DrillConfig)  # scratch None: a temp dir

    @staticmethod
    def of(cfg: Config) -> Sections:
        drill = dataclasses.replace(cfg.drill, scratch=cfg.drill_scratch)
        return Sections(cfg.store, cfg.upload, cfg.reads, cfg.checkpoints, cfg.retention,
                        cfg.policies, cfg.governance, cfg.scrub, drill)


@dataclass
class _Parts:
    """What the filesystem is given of the services built before it."""

    store: ChunkStore
    uploader: Uploader
    gc: GcRequests
    tracker: CheckpointTracker | None
    scrubber: Scrubber
    drill: DrillService


def _drill_access(access: Access) -> AccessCheck:
    """The namespace rules of the mount, for a drill's principal (the VFS's Access: a
    refusal is counted for the audit log like any other)."""

    async def check(who: Principal, ino: int) -> str | None:
        try:
            await access.inode(RequestContext(who.uid, who.gid), ino, "drill")
        except PermissionDenied as exc:
            return str(exc)
        return None

    return check


def _drill_service(catalog: Catalog, tiers: Sequence[Tier], s: _Shared, sec: Sections,
                   chunk_size: int, access: Access, uploader: Uploader, node: str) -> DrillService:
    """A save, as the upload queue defers to it (chunk buffers in memory, or a stream of
    commits), is what a drill yields to."""
    scratch = sec.drill.scratch or Path(tempfile.gettempdir()) / f"ckptfs-drill-{os.getuid()}"
    return DrillService(
        catalog, s.db_limiter, [t for t in tiers if t.kind != "local"], sec.drill, scratch,
        chunk_size, sec.governance, _drill_access(access),
        SaveGate(saving=uploader.saving, save_over=uploader.wait_save_over),
        sink=DrillMetrics(), node=node,
        # A new node of a SQLite mount restores the bucket's catalog snapshot: the drill
        # reads that; a shared catalog a new node reads itself, and so does the drill.
        snapshot=None if catalog.shared else fetch_snapshot)


def build(
    catalog: Catalog,
    tiers: Sequence[Tier],
    *,
    chunk_size: int,
    sections: Sections = Sections(),
    wakeups: Wakeups | None = None,
    kernel: Kernel = Kernel(),
    stats_path: Path | None = None,
    mountpoint: str | None = None,
    session: NodeSession | None = None,
    signing_key: Ed25519PrivateKey | None = None,
    keys: NamespaceKeys | None = None,
    shared: bool | None = None,
) -> Daemon:
    """Build the daemon's object graph, each component given what it uses, in an order
    where whatever a component needs exists before it; nothing is wired afterwards (see
    ``_Shared`` for the two needs that run against that order). ``wakeups``: those the
    catalog was opened with (None: a catalog opened without hooks); ``chunk_size``: the
    catalog's (reconcile_catalog); ``shared``: writers of other nodes are looked for
    (None: when the catalog is shared)."""
    w = wakeups if wakeups is not None else Wakeups(node=catalog.audit_node)
    shared = catalog.shared if shared is None else shared
    sec, gov = sections, sections.governance
    s = _shared_state(catalog, tiers, sec.store, gov, w)
    deleter, uploader = _queues(catalog, tiers, s, sec.upload, w, session, shared)
    store = _chunk_store(catalog, tiers, s, chunk_size, sec.store, sec.reads, deleter,
                         uploader, session)
    gc = GcRequests(retry_deletions=deleter.retry_now)
    cp = sec.checkpoints
    tracker = None if cp is None or not cp.enabled else CheckpointTracker(
        catalog, s.db_limiter, DetectorSet.default(cp.patterns), s.handles.writing_inos,
        cp.partial_after_s,
        on_commit=gc.kick,  # retention after each checkpoint commit
        shared=shared,  # writers and times of every node
        node=w.node,  # its replay point after a crash
    )
    refusals = Refusals(catalog, gov.audit.refusal_window_s)  # refused access, for the audit
    budget = s.budget
    scrubber = Scrubber(catalog, s.db_limiter, store, sec.scrub, shared=shared,
                        node=w.node if session is None else session.node,
                        saving=lambda: budget.used > 0,  # a save's chunks are in memory
                        save_over=budget.wait_empty)
    access = Access(gov, catalog, s.db_limiter, refusals=refusals)
    drill = _drill_service(catalog, tiers, s, sec, chunk_size, access, uploader, w.node)
    fs = _filesystem(catalog, s, chunk_size,
                     _Parts(store, uploader, gc, tracker, scrubber, drill), sec, kernel,
                     session, access, shared)
    high = sec.retention.local_high_watermark
    janitor = Janitor(catalog, s.db_limiter, store, deleter, gc, fs.remove_tree,
                      s.handles.open_inos, sec.retention.policies, high, max(0.5, high - 0.1))
    telemetry = Telemetry(catalog, s.db_limiter, store, uploader, s.budget, mountpoint,
                          Endpoint(), scrub=scrubber.snapshot)
    auditor = AuditFlusher(catalog, s.db_limiter, noted=w.audit_noted)  # the opens' records
    sealer = None if signing_key is None else AuditSealer(
        catalog, s.db_limiter, seal_stores(tiers), signing_key, gov.audit.seal_interval_s,
        auditor)
    return Daemon(catalog, s.db_limiter, store, uploader, deleter, tracker, gc, janitor,
                  s.budget, fs, telemetry, auditor, stats_path, session, sealer, keys, refusals,
                  scrubber, drill)


def _delivered(n: int) -> None:
    APP.read += n  # pages pushed for readers count as read, as replies do (trio thread)


def seal_stores(tiers: Sequence[Tier]) -> list[SealStore]:
    """The remote tiers that can hold seals (S3: create-only metadata objects)."""
    return [cast(SealStore, t) for t in tiers
            if t.kind != "local" and hasattr(t, "put_meta_if") and hasattr(t, "list_meta")]


def sealed_namespaces(gov: GovernanceConfig) -> Callable[[str], str | None] | None:
    """The encrypted namespace of a path inside the mount (None: its chunks are plain);
    None when no namespace is encrypted (a write asks nothing)."""
    if not any(ns.encrypt for ns in gov.namespaces):
        return None

    def of(path: str) -> str | None:
        ns = gov.namespace_for(path)
        return ns.path if ns.encrypt else None

    return of


def build_for_config(
    cfg: Config, catalog: Catalog, tiers: Sequence[Tier], chunk_size: int, *,
    wakeups: Wakeups | None = None, kernel: Kernel = Kernel(),
    mountpoint: Path | None = None, session: NodeSession | None = None,
    signing_key: Ed25519PrivateKey | None = None, keys: NamespaceKeys | None = None,
) -> Daemon:
    """``build`` with a mount's configuration (``session``: this node's, registered;
    ``chunk_size``: the catalog's, which wins over the config's)."""
    daemon = build(
        catalog, tiers, chunk_size=chunk_size, sections=Sections.of(cfg), wakeups=wakeups,
        kernel=kernel, stats_path=cfg.state_dir / STATS_FILE,
        mountpoint=None if mountpoint is None else str(mountpoint),
        session=session, signing_key=signing_key, keys=keys, shared=cfg.catalog.shared,
    )
    load_residency(catalog, daemon.store.residency)
    return daemon


def load_residency(catalog: Catalog, residency: Residency) -> None:
    """Blocking, before the mount serves: which chunks each bound namespace's files name,
    and the copies already outside their allowed locations (a tier relabelled since they
    were made, a bound narrowed), counted and logged per tier."""
    if not residency.enabled:
        return
    residency.load({ns.path: catalog.digests_under([ns.path]) for ns in residency.bound})
    residency.out_counts = residency.out_of_residency(
        {name: catalog.replica_keys(name) for name in residency.locations}
    )
    for name, n in sorted(residency.out_counts.items()):
        log.warning("residency: tier %s (location %s) holds %d cop%s of chunks whose namespace "
                    "does not allow that location; reads skip them, `ckptfs fsck --repair` "
                    "deletes those with an allowed copy", name, residency.locations[name], n,
                    "y" if n == 1 else "ies")
