"""Mount lifecycle and the composition root: lock the state dir, open tiers and catalog,
build the daemon's components (``build``), serve, shut down in order (``running``).

``build`` is the one place that constructs the chunk store, upload and deletion queues,
checkpoint tracker, janitor, filesystem and telemetry, each given only what it uses; the
tests build through it too. One nursery owns every background task; the shutdown order is
documented at ``running`` and in docs/architecture.md ("Composition root").
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pyfuse3
import trio
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from . import __version__, preflight, service, statedir
from .catalog import Catalog, SqliteCatalog
from .catalog.audit import AuditRecord
from .catalog.binding import node_tiers, redact
from .catalog.engines import open_shared_catalog
from .catalog.rows import ChunkRef
from .checkpoints.detectors import DetectorSet
from .checkpoints.janitor import GcRequests, Janitor
from .checkpoints.tracker import CheckpointTracker
from .chunks.guard import ChunkGuard
from .chunks.residency import Residency
from .chunks.room import Room
from .chunks.store import ChunkStore, SharedState, StoreHooks, StorePolicy, stats_for
from .codec import frame
from .codec.frame import Buffer
from .config import (
    CheckpointConfig,
    Config,
    DurabilityPolicy,
    FuseConfig,
    ReadConfig,
    RetentionConfig,
    S3TierConfig,
    TierConfig,
    UploadConfig,
)
from .config.model import GovernanceConfig, NamespaceConfig, WriteBehind
from .config.recorded_access import access_record
from .errors import (
    EXIT_USAGE,
    CatalogUnavailable,
    CkptfsError,
    ConfigError,
    PermanentTierError,
    TierError,
    UsageError,
)
from .fuse.ops import SHARED, SINGLE_NODE, FuseOps
from .keys.ring import NamespaceKeys
from .metrics.exporter import Endpoint
from .metrics.exporter import serve as serve_metrics
from .metrics.requests import APP
from .metrics.telemetry import FsCollector, Telemetry
from .session import NodeSession
from .stats import STATS_FILE, Stats
from .supervise import supervised
from .tiers.base import Tier
from .tiers.local import LocalTier
from .upload.auditing import AuditFlusher, AuditSealer
from .upload.commits import CommitStream
from .upload.deleter import Deleter
from .upload.seal import SealStore, load_signing_key
from .upload.uploader import SNAPSHOT_NAME, Uploader
from .vfs.access import Access
from .vfs.filesystem import Filesystem, HandleTable
from .vfs.openfile import MemoryBudget, OpenFiles
from .vfs.pagepush import PagePush, StorePages
from .vfs.quota import Quotas
from .vfs.refusals import Refusals
from .wakeup import Wakeup

if TYPE_CHECKING:
    from .upload.lease import WriterLeases

log = logging.getLogger("ckptfs.mount")


class MountError(CkptfsError):
    """The mount could not be set up (busy state dir, bad mountpoint, FUSE failure)."""


READ_AHEAD_KB = 8192
# With page-cache pushes (vfs/pagepush.py): the kernel's own read-ahead asks for pages the
# push is about to fill (the push stops where the requests are), so keep it short.
READ_AHEAD_PUSH_KB = 1024


def tune_read_ahead(mountpoint: Path, kb: int = READ_AHEAD_KB) -> None:
    """Raise the kernel read-ahead of our FUSE mount (128 KiB by default) so sequential
    reads arrive as 1 MiB requests. Best effort: needs root; found via mountinfo, because
    a stat() of our own mountpoint here would wait for the loop that serves it."""
    real = statedir.real_mountpoint(mountpoint)
    try:
        with open("/proc/self/mountinfo") as f:
            devs = [ln.split()[2] for ln in f if statedir.unescape_mounts(ln.split()[4]) == real]
        if devs:
            Path(f"/sys/class/bdi/{devs[-1]}/read_ahead_kb").write_text(f"{kb}\n")
    except OSError as exc:
        log.info("could not raise read-ahead for %s: %s", mountpoint, exc.strerror)


def detach(mountpoint: Path) -> None:
    subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], capture_output=True, check=False)


def clean_stale_mount(mountpoint: Path, state_dir: Path) -> None:
    """A daemon killed with -9 leaves a dead mount: detach it. A ckptfs mount of our own
    state dir is dead by definition, since we hold the state dir's lock."""
    found = statedir.find_mount(mountpoint)
    ours = found is not None and found == (statedir.fsname(state_dir), statedir.FSTYPE)
    if ours or statedir.is_stale(mountpoint):
        log.warning("cleaning up stale mount at %s (its daemon died)", mountpoint)
        detach(mountpoint)
        if statedir.is_stale(mountpoint) or (ours and statedir.find_mount(mountpoint) == found):
            raise MountError(f"stale mount at {mountpoint} could not be removed")


def pool_size(cfg: Config) -> int:
    """Connections of a remote tier's pool: every GET and upload that may run at once
    (a GET waiting for a free connection would waste its place under remote_io)."""
    return max(32, cfg.reads.remote_concurrency + cfg.upload.concurrency + 4)


def open_tiers(cfg: Config) -> tuple[list[Tier], set[str]]:
    """The tiers, and the names of the remote ones that did not answer at once: the
    node mounts without waiting for them (uploads wait, reads of local copies go on)."""
    tiers: list[Tier] = []
    down: set[str] = set()
    for tc in cfg.tiers:
        tier = LocalTier(tc)
        tier.open()
        tiers.append(tier)
    for rc in cfg.remote_tiers:
        # boto3 loads only when a remote tier is configured
        from .tiers.s3 import NoSuchBucket, ReadOnlyCredentials, S3Tier

        remote = S3Tier(rc, max_pool_connections=pool_size(cfg))
        tiers.append(remote)
        # A short probe first: a hung endpoint would hold check() for its read timeout.
        gone = remote.unreachable()
        if gone is not None:
            log.warning("remote tier %s not reachable now (%s); mounting without it: uploads "
                        "wait until it answers, reads of local copies go on", rc.name, gone)
            down.add(rc.name)
            continue
        try:
            remote.check()
            remote.probe_write()
        except (NoSuchBucket, ReadOnlyCredentials) as exc:
            raise UsageError(f"remote {exc}") from exc
        except PermanentTierError as exc:
            # Training must not stop for the remote: mount, keep data local, say why.
            log.error("remote tier %s unusable: %s; chunks stay local until it is fixed",
                      rc.name, exc)
        except TierError as exc:
            log.warning("remote tier %s not reachable now (%s); uploads will retry", rc.name, exc)
    return tiers, down


def restore_catalog(
    path: Path, remotes: list[Tier], governance: GovernanceConfig | None = None,
    down: Collection[str] = (),
) -> None:
    """A new node (empty state dir) with remote tiers: restore the catalog snapshot the
    remote holds, verified, so every file durable there is visible again. If a remote
    cannot be read (``down``: it did not answer at mount), refuse to start empty: an
    empty catalog would later be snapshotted over the remote's."""
    problems = []
    answered = False
    for remote in remotes:
        if remote.name in down:
            problems.append(f"{remote.name}: not reachable")
            continue
        try:
            raw = remote.get_meta(SNAPSHOT_NAME)  # type: ignore[attr-defined]
        except TierError as exc:
            problems.append(f"{remote.name}: {exc}")
            continue
        answered = True
        if raw is None:
            continue
        try:
            data = frame.decode(raw)
        except CkptfsError as exc:
            problems.append(f"{remote.name}: catalog snapshot damaged: {exc}")
            continue
        tmp = path.with_name(path.name + ".restore")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        restored = SqliteCatalog(path)
        try:
            files, removed = restored.adopt_snapshot([r.name for r in remotes])
            # The snapshot's local tiers were the lost node's (or, from a shared catalog,
            # other nodes'): their replicas are forgotten, and so are they.
            kept = [t for t in restored.recorded_tiers() if t.get("kind", "local") != "local"]
            restored.set_meta("tiers", json.dumps(kept))
            if governance is not None:
                forget_disallowed_remote_rows(restored, remotes, governance)
            restored.audit_append(AuditRecord(
                "restore", "/", 0, os.getpid(),
                detail={"tier": remote.name, "files": files, "not_restored": len(removed)}))
        finally:
            restored.close()
        log.info("restored the catalog (%d files) from remote tier %s", files, remote.name)
        for p in removed:
            log.warning("not restored (its upload had not finished when the remote "
                        "snapshot was taken): %s", p)
        return
    if problems and not answered:
        raise MountError(
            "the state dir is empty and no remote tier could be read ("
            + "; ".join(problems) + "); refusing to start with an empty catalog"
        )


def forget_disallowed_remote_rows(
    catalog: Catalog, remotes: list[Tier], governance: GovernanceConfig
) -> None:
    """A restored catalog records every chunk on every remote tier (a guess: reads fall
    back); residency narrows the guess: a bound chunk is not looked for, nor counted as a
    copy, on a remote its namespace does not allow."""
    residency = Residency(governance, {r.name: r.location for r in remotes})
    if not residency.enabled:
        return
    residency.load({ns.path: catalog.digests_under([ns.path]) for ns in residency.bound})
    for r in remotes:
        for digest in catalog.replica_keys(r.name):
            if not residency.permits(digest, r.name):
                catalog.remove_replica(digest, r.name)


def tier_record(t: TierConfig | S3TierConfig) -> dict[str, Any]:
    """What the catalog remembers of a tier (a remount with only --state-dir uses it)."""
    if isinstance(t, S3TierConfig):
        rec = {"name": t.name, "kind": "s3", "bucket": t.bucket, "prefix": t.prefix,
               "region": t.region, "addressing_style": t.addressing_style,
               "location": t.location, "url": f"s3://{t.bucket}/{t.prefix}"}
        if t.endpoint_url:
            rec["endpoint_url"] = t.endpoint_url
        return rec
    local: dict[str, Any] = {"name": t.name, "kind": t.kind, "path": str(t.path),
                             "location": t.location}
    if t.allow_shared_device:  # a remount with only --state-dir keeps the decision
        local["allow_shared_device"] = True
    if not t.direct_io:  # likewise the I/O choices that differ from the default
        local["direct_io"] = False
    if t.verify_writes != "memory":
        local["verify_writes"] = t.verify_writes
    return local


def is_ours(name: str, record: dict[str, Any], cfg: Config) -> bool:
    """A tier record of this node: a remote tier, or one of this node's local tiers."""
    if record.get("kind", "local") != "local" or not cfg.catalog.shared:
        return True
    return name.startswith(f"{cfg.catalog.node}:")


def reconcile_catalog(catalog: Catalog, cfg: Config) -> int:
    """Record the tier set and chunk size; return the chunk size to use.

    The extent grid depends on the chunk size, so an existing catalog keeps its own.
    """
    recorded = catalog.get_meta("chunk_size")
    chunk_size = cfg.store.chunk_size
    if recorded is None:
        catalog.set_meta("chunk_size", str(chunk_size))
    elif int(recorded) != chunk_size:
        if cfg.store.chunk_size_set:
            log.warning(
                "chunk_size %d in the config differs from %s in the catalog; keeping %s "
                "(files already stored use that grid)", chunk_size, recorded, recorded,
            )
        chunk_size = int(recorded)
    old = {t["name"]: t for t in catalog.recorded_tiers()}
    configured: list[TierConfig | S3TierConfig] = [*cfg.tiers, *cfg.remote_tiers]
    now = {t.name: tier_record(t) for t in configured}
    for name, t in old.items():
        where = t.get("path") or t.get("url")
        if not is_ours(name, t, cfg):
            continue  # another node's local tier (a shared catalog records every node's)
        if name not in now:
            log.warning("tier %s (%s) is no longer configured: chunks stored only there "
                        "will read as EIO", name, where)
        elif where != (now[name].get("path") or now[name].get("url")):
            log.warning("tier %s moved from %s to %s", name, where,
                        now[name].get("path") or now[name].get("url"))
        if name in now and t.get("location") not in (None, now[name].get("location")):
            log.warning("tier %s relabelled: location %s, was %s (residency applies to the "
                        "copies already there)", name, now[name].get("location"), t["location"])
    merged = {**old, **now}
    catalog.set_meta("tiers", json.dumps(list(merged.values())))
    # For `ckptfs gc --dry-run`, which plans beside the daemon from the catalog alone.
    catalog.set_meta("retention", json.dumps([dataclasses.asdict(p) for p in cfg.retention.policies]))
    # For the commands, which show a caller only the namespaces it may reach.
    catalog.set_meta("access", json.dumps(access_record(cfg.governance)))
    return chunk_size


def run_mount(
    cfg: Config, mountpoint: Path, on_ready: Callable[[str | None], None], *, takeover: bool = False,
    nonempty: bool = False,
) -> int:
    """Mount and serve until unmounted. ``on_ready(None)`` once live, ``on_ready(msg)`` on
    a setup failure. Returns the process exit code (2: refused, bad input; 1: failed).
    ``takeover``: take the writer lease of the remote prefixes even from a live holder
    (upload/lease.py). ``nonempty``: mount over a directory that has entries."""
    mountpoint = mountpoint.absolute()
    cfg = node_tiers(cfg)
    # Everything the daemon creates in the state dir and the tiers is private (0600/0700),
    # whatever umask it was started with.
    os.umask(0o077)
    try:
        with statedir.state_lock(cfg.state_dir):
            return _serve_locked(cfg, mountpoint, on_ready, takeover, nonempty)
    except (UsageError, ConfigError) as exc:
        log.error("mount refused: %s", exc)
        service.notify(f"STATUS=mount refused: {exc}")
        on_ready(str(exc))
        return EXIT_USAGE
    except CkptfsError as exc:
        log.error("mount failed: %s", exc)
        service.notify(f"STATUS=mount failed: {exc}")
        on_ready(str(exc))
        return 1
    except Exception as exc:
        log.exception("mount failed")
        on_ready(f"internal error: {exc!r}")
        return 1


def _serve_locked(
    cfg: Config, mountpoint: Path, on_ready: Callable[[str | None], None], takeover: bool = False,
    nonempty: bool = False,
) -> int:
    clean_stale_mount(mountpoint, cfg.state_dir)
    preflight.check_mountpoint(mountpoint, cfg.state_dir, nonempty=nonempty)
    shared = preflight.prepare_local_tiers(cfg.tiers)
    if shared:
        log.info("local tiers on one device (allowed by allow_shared_device): %s",
                 ", ".join(sorted(shared)))
    fixed = statedir.make_private(cfg.state_dir)
    if fixed:
        log.info("state dir %s made private (0700, files 0600): %s", cfg.state_dir,
                 ", ".join(fixed))
    tiers, down = open_tiers(cfg)
    # One writer per bucket prefix, unless the catalog is shared: then the nodes that share
    # it write the prefix together, coordinated by the database. The lease of a remote
    # that did not answer is taken in the background; writes to it wait until then.
    leases = None if cfg.catalog.shared else take_writer_leases(cfg.state_dir, tiers,
                                                                 takeover, down)
    try:
        return _serve_tiers(cfg, mountpoint, on_ready, tiers, leases, down)
    finally:
        if leases is not None:
            leases.release()  # after the uploader stopped: the next writer may take over


def open_catalog_of(cfg: Config, tiers: list[Tier], down: Collection[str] = ()) -> Catalog:
    """The catalog engine the config names: the state dir's SQLite file (restored from a
    remote tier's snapshot on a new node), or the shared PostgreSQL database (whose first
    opener creates the schema), bound to this state dir from now on."""
    if cfg.catalog.shared:
        catalog = open_shared_catalog(cfg.catalog.url, pool_size=cfg.catalog.pool_size)
        statedir.write_binding(cfg.state_dir, cfg.catalog.url, cfg.catalog.node)
        log.info("catalog: shared, %s, node %s", redact(cfg.catalog.url), cfg.catalog.node)
        return catalog
    if not cfg.catalog_path.exists():
        restore_catalog(cfg.catalog_path, [t for t in tiers if t.kind != "local"],
                        cfg.governance, down)
    catalog = SqliteCatalog(cfg.catalog_path)
    # The catalog (and its WAL and shm, which SQLite creates with the db's mode) may
    # have been made just now, or restored from a snapshot.
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(f"{cfg.catalog_path}{suffix}", statedir.FILE_MODE)
    return catalog


def take_writer_leases(
    state_dir: Path, tiers: list[Tier], takeover: bool, down: Collection[str] = (),
) -> WriterLeases | None:
    """One writer per bucket prefix: take the writer lease of every remote tier (of those
    in ``down``, which did not answer at mount, in the background: never wait for them)."""
    from .tiers.s3 import S3Tier
    from .upload.lease import WriterLeases

    remotes = [t for t in tiers if isinstance(t, S3Tier)]
    if not remotes:
        return None
    leases = WriterLeases(remotes, state_dir, takeover=takeover)
    leases.acquire(later=down)
    return leases


def _serve_tiers(
    cfg: Config, mountpoint: Path, on_ready: Callable[[str | None], None], tiers: list[Tier],
    leases: WriterLeases | None, down: Collection[str] = (),
) -> int:
    key_file = cfg.governance.audit.signing_key_file  # refused before the catalog is touched
    signing_key = None if key_file is None else load_signing_key(key_file)
    catalog = open_catalog_of(cfg, tiers, down)
    catalog.audit_node = cfg.catalog.node
    session = None
    try:
        if cfg.catalog.shared:  # first: refused while the node name has a live session
            # The state dir records its session ids: this daemon holds its lock, so a live
            # session of an earlier daemon of this state dir is a dead one's, ended at once.
            session = NodeSession(catalog, cfg.catalog.node, cfg.catalog.session_timeout_s,
                                  info=f"host {socket.gethostname()}, pid {os.getpid()}",
                                  state_dir=cfg.state_dir)
            session.register()
        chunk_size = reconcile_catalog(catalog, cfg)  # records this node's tiers
        count_namespaces(catalog, cfg.governance.namespaces)
        record_mount(catalog, cfg, mountpoint)
        keys = None
        if cfg.governance.keys.configured:
            # Before the loop runs (nothing waits on this thread yet): the KEK is read (a
            # bad key file refuses the mount, exit 2), missing namespace keys are made and
            # every live one is unwrapped into memory (keys/ring.py).
            keys = NamespaceKeys(catalog, cfg.governance)
            keys.load()
        daemon = build_for_config(cfg, catalog, tiers, chunk_size, mountpoint, session,
                                  signing_key, keys)
        options = fuse_options(cfg.fuse, cfg.state_dir)
        try:
            timeouts = SHARED if cfg.catalog.shared else SINGLE_NODE
            pyfuse3.init(FuseOps(daemon.fs, timeouts), str(mountpoint), options)
        except RuntimeError as exc:
            raise MountError(f"FUSE mount at {mountpoint} failed: {exc}") from exc
        pid_file = statedir.write_pid(cfg.state_dir)
        records = [tier_record(t) for t in cfg.tiers] + [tier_record(t) for t in cfg.remote_tiers]
        log.info(
            "ckptfs %s mounted at %s: tiers %s, chunk size %d, state %s",
            __version__, mountpoint,
            ", ".join(f"{r['name']}={r.get('path') or r.get('url')}" for r in records),
            chunk_size, cfg.state_dir,
        )
        metrics = serve_metrics(cfg.metrics.address, FsCollector(daemon.telemetry),
                                cfg.state_dir, daemon.telemetry.endpoint)
        unmounted = False
        try:
            trio.run(_serve, daemon, mountpoint, on_ready, leases)
            unmounted = statedir.find_mount(mountpoint) is None
        finally:
            pyfuse3.close(unmount=not unmounted)
            if metrics is not None:
                metrics.stop()
            with contextlib.suppress(OSError):
                pid_file.unlink()
        log.info("ckptfs unmounted from %s", mountpoint)
        return 0
    finally:
        if session is not None:
            session.close_blocking()  # if serving failed before the session was closed
        catalog.close()


def count_namespaces(catalog: Catalog, namespaces: Sequence[NamespaceConfig]) -> None:
    """Record the namespaces' quotas; count the usage of one declared for the first time
    (an existing state dir, or a namespace added to the config) from its files."""
    if not namespaces:
        return
    for path in catalog.count_namespaces([(ns.path, ns.quota) for ns in namespaces]):
        log.info("namespace %s: usage counted from its files (first mount declaring it)", path)


def record_mount(catalog: Catalog, cfg: Config, mountpoint: Path) -> None:
    """The audit record of this mount, with the digest of its governance policy (the
    namespaces, access, keys and audit settings); a policy that differs from the last
    mount's is recorded as a policy change."""
    policy = hashlib.sha256(repr(cfg.governance).encode()).hexdigest()
    before = catalog.get_meta("audit_policy")
    records = [AuditRecord("mount", str(mountpoint), 0, os.getpid(),
                           detail={"version": __version__, "policy": policy})]
    if before is not None and before != policy:
        records.append(AuditRecord("policy_change", "/", 0, os.getpid(),
                                   detail={"before": before, "after": policy}))
    catalog.audit_append(records)
    if before != policy:
        catalog.set_meta("audit_policy", policy)


# -- the composition root --------------------------------------------------------------------


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


def build(
    catalog: Catalog,
    tiers: Sequence[Tier],
    *,
    chunk_size: int,
    memory_budget: int,
    io_threads: int,
    invalidate: Callable[[int], None] | None = None,
    invalidate_entry: Callable[[int, bytes], None] | None = None,
    store_pages: StorePages | None = None,
    remote_copies: int = 1,
    on_local_full: str = "block",
    local_full_timeout_s: float = 600.0,
    write_behind: WriteBehind = "never",
    upload: UploadConfig = UploadConfig(),
    reads: ReadConfig = ReadConfig(),
    policies: tuple[DurabilityPolicy, ...] = (),
    stats_path: Path | None = None,
    detectors: DetectorSet | None = None,
    partial_after_s: float = 600.0,
    retention: RetentionConfig = RetentionConfig(),
    mountpoint: str | None = None,
    shared: bool = False,
    catalog_slots: int = 1,
    session: NodeSession | None = None,
    namespaces: Sequence[NamespaceConfig] = (),
    governance: GovernanceConfig | None = None,
    signing_key: Ed25519PrivateKey | None = None,
    seal_interval_s: float = 3600.0,
    keys: NamespaceKeys | None = None,
) -> Daemon:
    """Build the daemon's object graph, each component given what it uses, in an order
    where whatever a component needs exists before it; nothing is wired afterwards. Two
    needs run against that order (the store wakes the uploader and the deleter, which use
    the store's state; the tracker and the filesystem ask the janitor for passes, and the
    janitor deletes through the filesystem): they go through objects built before both
    sides (the store's shared state, Wakeups, GcRequests, the handle and open-file tables).
    """
    # Catalog calls run in worker threads, this many at once: one for the embedded SQLite
    # file (one connection); a shared catalog's connection pool size.
    db_limiter = trio.CapacityLimiter(catalog_slots)
    # State shared by the store, the uploader and the deleter.
    guard = ChunkGuard(t.name for t in tiers if t.kind == "local")
    stats = stats_for(tiers)
    # Where copies of each chunk may be (namespaces' allowed_locations): the store, the
    # uploader and the telemetry ask it; load_residency fills it from the catalog.
    gov = governance or GovernanceConfig()
    residency = Residency(gov, {t.name: t.location for t in tiers},
                          stats)
    upload_wake, delete_wake = Wakeup(), Wakeup()
    commits = CommitStream()  # new upload jobs, one after another: a save of small files
    room = Room(on_wait=upload_wake.set)  # uploads deferred to a save go ahead for a writer
    synced: set[bytes] = set()  # frames known fsynced (the deleter forgets deleted ones)
    # The VFS's tables, shared with the memory budget, the tracker and the janitor.
    open_files, handles = OpenFiles(), HandleTable()
    budget = MemoryBudget(memory_budget, spill=open_files.spill_all)
    deleter = Deleter(catalog, tiers, db_limiter, guard=guard, stats=stats, room=room,
                      forget_frames=synced.difference_update, wake=delete_wake,
                      on_done=upload_wake.set,  # an upload may wait for a deletion
                      # Other nodes queue and end rows (a shared catalog; None: SQLite).
                      listener=catalog.listen_deletions(),
                      # Its claims name it: a restart of this node takes them back.
                      owner=None if session is None else (lambda: (session.node, session.sid)),
                      one_daemon=not shared)
    uploader = Uploader(
        catalog, tiers, db_limiter, upload, guard=guard, stats=stats, room=room,
        deleter=deleter, wake=upload_wake,
        saving=lambda: budget.used > 0,  # chunk buffers in memory: a save runs
        save_over=budget.wait_empty, residency=residency, commits=commits,
        held=catalog.listen_held_uploads(),  # other nodes' claims' ends (None: SQLite)
    )
    # -- the chunk service (chunks/store.py) --
    store = ChunkStore(
        tiers, catalog, db_limiter,
        StorePolicy(
            io_threads=io_threads, cache_bytes=max(memory_budget // 2, 2 * chunk_size),
            on_local_full=on_local_full, local_full_timeout_s=local_full_timeout_s,
            remote_copies=remote_copies, remote_reads=reads.remote_concurrency,
            peer_wait_s=reads.peer_wait_s, write_behind=write_behind,
        ),
        shared=SharedState(guard=guard, stats=stats, room=room, synced=synced),
        deleter=deleter,
        # A full local tier moves the writers' uncommitted chunks to the remote through it.
        spill_copy=uploader.copy_uncommitted,
        hooks=StoreHooks(on_requeue=commits.queued, on_deletions=delete_wake.set),
        node="" if session is None else session.node, residency=residency,
    )
    # -- end of the chunk service --
    gc = GcRequests(retry_deletions=deleter.retry_now)
    tracker = None if detectors is None else CheckpointTracker(
        catalog, db_limiter, detectors, handles.writing_inos, partial_after_s,
        on_commit=gc.kick,  # retention after each checkpoint commit
        shared=shared,  # writers and times of every node
        node=catalog.audit_node,  # its replay point after a crash
    )

    async def ns_used(ns: str) -> int:  # a namespace's usage, read again before a refusal
        return await trio.to_thread.run_sync(catalog.namespace_used, ns, limiter=db_limiter)

    refusals = Refusals(catalog, gov.audit.refusal_window_s)  # refused access, for the audit
    quotas = None
    if namespaces:  # each namespace's usage as counted at mount (count_namespaces)
        quotas = Quotas(namespaces, ns_used, {u.ns: u.bytes for u in catalog.namespace_usage()})
    fs = Filesystem(
        catalog, store, db_limiter=db_limiter, budget=budget, open_files=open_files,
        tier_view=store.view,  # the local tiers' roots and usage (statfs, syncfs at shutdown)
        handles=handles, chunk_size=chunk_size, uploader=uploader, gc=gc, tracker=tracker,
        invalidate=invalidate, invalidate_entry=invalidate_entry, policies=policies,
        readahead=reads.readahead, copy_back=reads.copy_back, shared=shared, session=session,
        quotas=quotas,
        access=Access(gov, catalog, db_limiter, refusals=refusals),
        sealed_namespace=sealed_namespaces(gov),
        page_push=None if store_pages is None or not reads.page_cache_push
        else PagePush.make(store_pages, stats.count, _delivered),
    )
    high = retention.local_high_watermark
    janitor = Janitor(catalog, db_limiter, store, deleter, gc, fs.remove_tree,
                      handles.open_inos, retention.policies, high, max(0.5, high - 0.1))
    telemetry = Telemetry(catalog, db_limiter, store, uploader, budget, mountpoint, Endpoint())
    auditor = AuditFlusher(catalog, db_limiter)  # the opens' records
    # The remote tiers that can hold seals (S3: create-only metadata objects).
    seal_stores = [cast(SealStore, t) for t in tiers
                   if t.kind != "local" and hasattr(t, "put_meta_if") and hasattr(t, "list_meta")]
    sealer = None if signing_key is None else AuditSealer(
        catalog, db_limiter, seal_stores, signing_key, seal_interval_s, auditor)
    return Daemon(catalog, db_limiter, store, uploader, deleter, tracker, gc, janitor, budget,
                  fs, telemetry, auditor, stats_path, session, sealer,
                  keys, refusals)


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
    cfg: Config, catalog: Catalog, tiers: Sequence[Tier], chunk_size: int,
    mountpoint: Path | None = None, session: NodeSession | None = None,
    signing_key: Ed25519PrivateKey | None = None,
    keys: NamespaceKeys | None = None,
) -> Daemon:
    """``build`` with a mount's configuration (``session``: this node's, registered)."""
    store = cfg.store  # its chunk_size is the config's; the catalog's wins (chunk_size)
    daemon = build(
        catalog, tiers, chunk_size=chunk_size, memory_budget=store.memory_budget,
        io_threads=store.io_threads, invalidate=_invalidate_inode,
        invalidate_entry=_invalidate_entry, store_pages=_store_pages,
        remote_copies=store.remote_copies,
        on_local_full=store.on_local_full, local_full_timeout_s=store.local_full_timeout_s,
        write_behind=store.write_behind, upload=cfg.upload, reads=cfg.reads, policies=cfg.policies,
        stats_path=cfg.state_dir / STATS_FILE, detectors=detectors_for(cfg.checkpoints),
        partial_after_s=cfg.checkpoints.partial_after_s, retention=cfg.retention,
        mountpoint=None if mountpoint is None else str(mountpoint),
        shared=cfg.catalog.shared,
        catalog_slots=catalog.concurrency, session=session,
        namespaces=cfg.governance.namespaces, governance=cfg.governance,
        signing_key=signing_key, seal_interval_s=cfg.governance.audit.seal_interval_s, keys=keys,
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


class _Services:
    """Background services started together and stopped together, in their own cancel
    scopes inside the mount's nursery; ``stop`` returns once every one has ended. No
    service's error ends the daemon (supervise.py): an outage of the catalog pauses it, an
    unexpected error is logged, counted in ``stats`` (status: degraded) and it starts again,
    both after a backoff."""

    def __init__(self, nursery: trio.Nursery, stats: Stats | None = None) -> None:
        self._nursery = nursery
        self._stats = stats
        self._scopes: list[trio.CancelScope] = []
        self._running = 0
        self._ended = trio.Event()

    def start(self, name: str, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        scope = trio.CancelScope()
        self._scopes.append(scope)
        self._running += 1
        self._nursery.start_soon(self._run, scope, name, fn, args)

    async def _run(
        self, scope: trio.CancelScope, name: str, fn: Callable[..., Awaitable[object]],
        args: tuple[object, ...],
    ) -> None:
        try:
            with scope:
                await supervised(self._stats, name, fn, *args)
        finally:
            self._running -= 1
            if self._running == 0:
                self._ended.set()

    async def stop(self) -> None:
        for scope in self._scopes:
            scope.cancel()
        if self._running:
            await self._ended.wait()



@contextlib.asynccontextmanager
async def running(daemon: Daemon, *, drain: bool = True) -> AsyncIterator[trio.Nursery]:
    """Run the daemon's background services in one nursery around the body (which serves
    FUSE, or a test's requests). The shutdown order, once the body returns:

    1. the body ends: FUSE has stopped (the kernel sends no more requests);
    2. writers drain: open files are committed and synced (``Filesystem.shutdown``;
       ``drain=False``, as in tests that stop as a crash would, skips it);
    3. the tracker and the janitor stop (no new retention, evictions or deletions); the
       node's session (shared catalog) stops its heartbeat and is closed (after the last
       commit: what only this node held open and has no name left is dropped); then the
       upload and deletion queues and the statistics;
    4. the nursery's remaining tasks (chunk writes, heals, copy-backs, readahead) are
       cancelled; the caller closes the catalog last, after ``running`` returned.
    """
    d = daemon

    async def collect(digests: Sequence[bytes]) -> None:  # chunks of inodes a session dropped
        await d.store.collect(ChunkRef(x, 0, ()) for x in digests)

    async with trio.open_nursery() as nursery:
        if not d.catalog.shared:
            # One node: every move of an uncommitted chunk still recorded is an earlier
            # run's that died before its end (a shared catalog ends a node's with its session).
            await trio.to_thread.run_sync(d.catalog.release_moves, None, limiter=d.db_limiter)
        d.store.attach(nursery)  # heals and copy-backs
        d.fs.attach(nursery)  # the open files' chunk writes and readahead
        stats = d.store.stats  # where a service's unexpected errors are counted
        producers, queues = _Services(nursery, stats), _Services(nursery, stats)
        queues.start("uploader", d.uploader.run)  # replays the jobs left by an earlier run
        queues.start("deleter", d.deleter.run)  # drains rows left by an earlier run at once
        queues.start("auditor", d.auditor.run)  # the opens' records
        if d.refusals is not None:
            queues.start("refusals", d.refusals.run)  # refused access, one record per window
        if d.sealer is not None:
            queues.start("sealer", d.sealer.run)
        if d.tracker is not None:
            producers.start("tracker", d.tracker.run)
        producers.start("janitor", d.janitor.run)
        if d.stats_path is not None:
            queues.start("telemetry", d.telemetry.publish, d.stats_path)
        if d.keys is not None:
            producers.start("keys", d.keys.run, d.db_limiter, d.store.forget_keys)
        heartbeat = _Services(nursery, stats)
        if d.session is not None:
            heartbeat.start("session", d.session.run, d.db_limiter, collect,
                            d.fs.sync_open_rows)
        await d.fs.replay_signals()  # commit signals a crash kept from the tracker
        await d.fs.recover()
        yield nursery
        if drain:
            await d.fs.shutdown()
            await d.store.moves.end_now()  # the files are closed: their moves' records end
        await producers.stop()
        if drain and d.tracker is not None:
            await d.tracker.drain()  # what is queued is recorded; the next mount replays nothing
        if drain:  # (a crash, drain=False, loses the noted opens)
            await _last_audit(d)
        await heartbeat.stop()
        if d.session is not None and drain:
            await d.session.close(d.db_limiter, collect)
        await queues.stop()
        nursery.cancel_scope.cancel()


async def _last_audit(d: Daemon) -> None:
    """At shutdown, FUSE stopped: close the windows of refused access, write the records
    still noted, and seal the head."""
    if d.refusals is not None:
        d.refusals.close()
    try:
        await d.auditor.flush_now()
    except CatalogUnavailable as exc:
        log.warning("audit: %d open record(s) lost at shutdown: %s",
                    d.catalog.audit_pending(), exc)
        return
    if d.sealer is not None:
        await d.sealer.seal_once()


def fuse_options(cfg: FuseConfig, state_dir: Path) -> set[str]:
    """The FUSE mount options: pyfuse3's defaults (default_permissions), our names,
    allow_other as configured."""
    options = set(pyfuse3.default_options)
    options |= {f"fsname={statedir.fsname(state_dir)}", "subtype=ckptfs"}
    if cfg.allow_other:
        options.add("allow_other")
    if not cfg.default_permissions:
        options.discard("default_permissions")
        if cfg.allow_other:
            log.warning("allow_other without default_permissions: every user may read and "
                        "write every file (ckptfs does not check the mode bits itself)")
    return options


def detectors_for(cfg: CheckpointConfig) -> DetectorSet | None:
    """The detectors a mount runs: the configured patterns and the built-in ones, or
    none with ``checkpoints = false``."""
    return DetectorSet.default(cfg.patterns) if cfg.enabled else None


def _invalidate_entry(parent: int, name: bytes) -> None:
    # Queued, not waited for: the kernel takes the parent's lock to drop the name, and a
    # request on that directory may hold it while it waits for retention (a synchronous
    # invalidation there would never return).
    pyfuse3.invalidate_entry_async(
        pyfuse3.InodeT(parent), pyfuse3.FileNameT(name), ignore_enoent=True
    )


def _delivered(n: int) -> None:
    APP.read += n  # pages pushed for readers count as read, as replies do (trio thread)


def _store_pages(ino: int, offset: int, data: Buffer) -> None:
    # FUSE_NOTIFY_STORE (vfs/pagepush.py); pyfuse3 releases the GIL around it.
    # Its stub says bytes; it takes any contiguous buffer (PyObject_GetBuffer).
    pyfuse3.notify_store(pyfuse3.InodeT(ino), offset, data)  # type: ignore[arg-type]


def _invalidate_inode(ino: int) -> None:
    try:
        pyfuse3.invalidate_inode(pyfuse3.InodeT(ino))
    except OSError as exc:
        if exc.errno != errno.ENOENT:  # the kernel had nothing cached: fine
            log.warning("could not invalidate inode %d in the kernel: %s", ino, exc)


async def _serve(
    daemon: Daemon, mountpoint: Path, on_ready: Callable[[str | None], None],
    leases: WriterLeases | None = None,
) -> None:
    async with running(daemon) as nursery:
        if leases is not None:
            async def writable(tier: str) -> None:  # a fence lifted: held writes go now
                await daemon.uploader.tier_writable(tier)
                daemon.deleter.tier_works(tier)

            # Heartbeats and watchdogs, cancelled after the uploader.
            nursery.start_soon(supervised, daemon.store.stats, "leases", leases.run, writable)
        nursery.start_soon(_watch_signals)
        ra_kb = READ_AHEAD_KB if daemon.fs.page_push is None else READ_AHEAD_PUSH_KB
        nursery.start_soon(_after_init, mountpoint, on_ready, ra_kb)
        nursery.start_soon(service.watchdog)
        await pyfuse3.main(min_tasks=4, max_tasks=64)  # FUSE stops first: the unmount
        service.notify("STOPPING=1", f"STATUS=unmounted from {mountpoint}; committing open files")


async def _after_init(
    mountpoint: Path, on_ready: Callable[[str | None], None], ra_kb: int = READ_AHEAD_KB
) -> None:
    """Once the kernel's INIT is answered (a statvfs of our own mount waits for it), raise
    the read-ahead (INIT caps it at the kernel's default) and report the mount ready."""
    try:
        await trio.to_thread.run_sync(os.statvfs, mountpoint)
    except OSError as exc:
        log.warning("self-check of %s failed: %s", mountpoint, exc)
        service.notify(f"STATUS=self-check of {mountpoint} failed: {exc}")
    else:
        # systemd (Type=notify): the mount answers now, so units ordered after us may start.
        service.notify("READY=1", f"STATUS=serving {mountpoint}")
    tune_read_ahead(mountpoint, ra_kb)
    on_ready(None)


async def _watch_signals() -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("signal %d: unmounting", signum)
            service.notify("STOPPING=1", f"STATUS=signal {signum}: unmounting")
            pyfuse3.terminate()
            return
