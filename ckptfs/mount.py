"""The mount's lifecycle and the kernel's callbacks: lock the state dir, open the tiers
and the catalog (with the daemon's wake-ups as its hooks), build the daemon
(daemon/build.py), serve FUSE while its services run (daemon/services.py ``running``),
unmount and shut down in order (documented at ``running`` and in docs/architecture.md,
"Composition root").
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import socket
import subprocess
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING

import pyfuse3
import trio

from . import __version__, preflight, service, statedir
from .catalog import Catalog, SqliteCatalog
from .catalog.binding import node_tiers, redact
from .catalog.engines import open_shared_catalog
from .catalog.hooks import CatalogHooks
from .codec.frame import Buffer
from .config import Config, FuseConfig
from .daemon.build import Daemon, Kernel, Wakeups, build_for_config
from .daemon.provision import provision_namespaces
from .daemon.restore import (
    count_namespaces,
    reconcile_catalog,
    record_mount,
    restore_catalog,
    tier_record,
)
from .daemon.services import running
from .direct.server import DirectServer
from .errors import (
    EXIT_USAGE,
    CkptfsError,
    ConfigError,
    PermanentTierError,
    TierError,
    UsageError,
)
from .fuse.conn import tune_connection
from .fuse.notify import SessionPages
from .fuse.ops import SHARED, SINGLE_NODE, FuseOps
from .keys.ring import NamespaceKeys
from .metrics.exporter import serve as serve_metrics
from .metrics.health import MountProbe
from .metrics.telemetry import FsCollector
from .session import NodeSession
from .supervise import supervised
from .tiers.base import Tier
from .tiers.local import LocalTier
from .upload.seal import load_signing_key

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


def open_catalog_of(
    cfg: Config, tiers: list[Tier], down: Collection[str] = (), hooks: CatalogHooks | None = None,
) -> Catalog:
    """The catalog engine the config names: the state dir's SQLite file (restored from a
    remote tier's snapshot on a new node), or the shared PostgreSQL database (whose first
    opener creates the schema), bound to this state dir from now on; opened with the
    daemon's ``hooks``."""
    if cfg.catalog.shared:
        catalog = open_shared_catalog(cfg.catalog.url, pool_size=cfg.catalog.pool_size,
                                      hooks=hooks)
        statedir.write_binding(cfg.state_dir, cfg.catalog.url, cfg.catalog.node)
        log.info("catalog: shared, %s, node %s", redact(cfg.catalog.url), cfg.catalog.node)
        return catalog
    if not cfg.catalog_path.exists():
        restore_catalog(cfg.catalog_path, [t for t in tiers if t.kind != "local"],
                        cfg.governance, down)
    catalog = SqliteCatalog(cfg.catalog_path, hooks=hooks)
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
    # Made before the catalog: its hooks poke them from worker threads (daemon/build.py).
    wakeups = Wakeups(node=cfg.catalog.node)
    catalog = open_catalog_of(cfg, tiers, down, wakeups.catalog_hooks())
    session = None
    try:
        session = _session_of(cfg, catalog)
        if session is not None:  # first: refused while the node name has a live session
            session.register()
        chunk_size = reconcile_catalog(catalog, cfg)  # records this node's tiers
        count_namespaces(catalog, cfg.governance.namespaces)
        provision_namespaces(catalog, cfg.governance.namespaces)  # missing roots made
        record_mount(catalog, cfg, mountpoint)
        keys = None
        if cfg.governance.keys.configured:
            # Before the loop runs (nothing waits on this thread yet): the KEK is read (a
            # bad key file refuses the mount, exit 2), missing namespace keys are made and
            # every live one is unwrapped into memory (keys/ring.py).
            keys = NamespaceKeys(catalog, cfg.governance, on_change=wakeups.touched.set)
            keys.load()
        daemon = build_for_config(cfg, catalog, tiers, chunk_size, wakeups=wakeups,
                                  kernel=kernel_callbacks(), mountpoint=mountpoint, session=session,
                                  signing_key=signing_key, keys=keys)
        return _serve_daemon(cfg, daemon, mountpoint, on_ready, leases, chunk_size)
    finally:
        if session is not None:
            session.close_blocking()  # if serving failed before the session was closed
        catalog.close()


def _session_of(cfg: Config, catalog: Catalog) -> NodeSession | None:
    """With a shared catalog, this node's session (not yet registered). The state dir
    records its session ids: this daemon holds its lock, so a live session of an earlier
    daemon of this state dir is a dead one's, ended at once."""
    if not cfg.catalog.shared:
        return None
    return NodeSession(catalog, cfg.catalog.node, cfg.catalog.session_timeout_s,
                       info=f"host {socket.gethostname()}, pid {os.getpid()}",
                       state_dir=cfg.state_dir)


def _serve_daemon(
    cfg: Config, daemon: Daemon, mountpoint: Path, on_ready: Callable[[str | None], None],
    leases: WriterLeases | None, chunk_size: int,
) -> int:
    """Mount FUSE, serve until unmounted, then unmount; 0."""
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
                            cfg.state_dir, daemon.telemetry.endpoint,
                            health=MountProbe(mountpoint).check)
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


def _invalidate_entry(parent: int, name: bytes) -> None:
    # Queued, not waited for: the kernel takes the parent's lock to drop the name, and a
    # request on that directory may hold it while it waits for retention (a synchronous
    # invalidation there would never return).
    pyfuse3.invalidate_entry_async(
        pyfuse3.InodeT(parent), pyfuse3.FileNameT(name), ignore_enoent=True
    )


def _notify_store(ino: int, offset: int, data: Buffer) -> None:
    # FUSE_NOTIFY_STORE through pyfuse3 (it releases the GIL too): used only when the session's
    # /dev/fuse descriptor cannot be found (fuse/notify.py writes it without the GIL).
    # Its stub says bytes; it takes any contiguous buffer (PyObject_GetBuffer).
    pyfuse3.notify_store(pyfuse3.InodeT(ino), offset, data)  # type: ignore[arg-type]


def _invalidate_inode(ino: int) -> None:
    try:
        pyfuse3.invalidate_inode(pyfuse3.InodeT(ino))
    except OSError as exc:
        if exc.errno != errno.ENOENT:  # the kernel had nothing cached: fine
            log.warning("could not invalidate inode %d in the kernel: %s", ino, exc)


def kernel_callbacks() -> Kernel:
    """What the daemon tells the kernel (daemon/build.py Kernel), for one mount: its pushes
    find that mount's /dev/fuse descriptor at the first push."""
    return Kernel(invalidate=_invalidate_inode, invalidate_entry=_invalidate_entry,
                  store_pages=SessionPages(_notify_store).store)


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
        nursery.start_soon(_serve_direct, daemon, mountpoint)
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
    tune_connection(mountpoint)  # many readers' read-ahead in flight at once (fuse/conn.py)
    on_ready(None)


async def _serve_direct(daemon: Daemon, mountpoint: Path) -> None:
    """The direct data path's socket (docs/direct-path.md); without it clients use the
    mount. Its data copies run under the store's I/O limiter."""
    try:
        await DirectServer(daemon.fs, daemon.store.limiters.io).serve(mountpoint)
    except OSError as exc:  # e.g. a runtime dir this user may not write: not a fault
        log.info("direct path unavailable (clients use the mount): %s", exc)


async def _watch_signals() -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("signal %d: unmounting", signum)
            service.notify("STOPPING=1", f"STATUS=signal {signum}: unmounting")
            pyfuse3.terminate()
            return
