"""Offline consistency check of the catalog against the tiers.

Finds: orphaned chunk frames (on a tier but referenced by no committed file, e.g. after a
crash mid-write), leftover temp files, replica rows whose frame is gone, chunks no tier
holds (damaged files, reported by path), frames that fail verification (``--verify``),
and inodes that lost their last name. ``--repair`` fixes what can be fixed without losing
data: it deletes orphans and unreferenced rows, forgets missing or corrupt replicas, and
never touches a chunk a committed file references while it is the only copy. Without
``--repair``, a copy found missing, corrupt or unreadable is recorded bad (as a read
records it: ``ckptfs latest`` then counts it as no copy), and ``--verify`` records a copy
marked bad whose frame verifies as valid again.

Remote tiers (the ones the catalog records, kind "s3") are checked too, unless
``remote=False`` (``--local-only``): the objects under ``<prefix>/chunks/`` are listed and
compared with the replica rows. A row whose object is missing is forgotten by ``--repair``,
and the upload is queued again if a local tier holds a valid copy (the next mount makes
it); an object no file references is an orphan, deleted by ``--repair`` unless an upload
job for it is pending, a node's move of it uncommitted is recorded (catalog/moves.py), or
another node wrote the prefix last (its writer lease names another writer: the orphan may
be that node's chunk); ``--verify`` reads every object and
checks its frame; an object the server fails to serve while it answers for others is
reported as unreadable and the check goes on (tiers/s3.py tells the two apart). A remote
that cannot be reached is reported (exit 1) and changes nothing; its recorded copies count
as unchecked, not lost. A remote whose writer lease is
held by a live node is not checked at all (upload/lease.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..catalog import SqliteCatalog
from ..catalog.protocols import (
    ContentsCatalog,
    DeletionQueue,
    MetaCatalog,
    MoveCatalog,
    NamespaceCatalog,
    ReplicaCatalog,
    UploadQueue,
)
from ..catalog.recorded import remote_tier_of
from ..chunks.residency import Residency
from ..codec import frame
from ..config import Config, S3TierConfig, TierConfig
from ..errors import CkptfsError, CorruptChunk, ObjectUnreadable, TierError, TransientTierError
from ..keys.ring import load_keyring
from ..statedir import state_lock
from ..tiers.base import Tier
from ..tiers.local import LocalTier

if TYPE_CHECKING:
    from ..tiers.s3 import S3Tier

log = logging.getLogger("ckptfs.fsck")

SKIPPED = "skipped (--local-only)"  # FsckReport.remote_unchecked: not a problem


@dataclass
class FsckReport:
    orphans: int = 0
    orphan_bytes: int = 0
    missing_replicas: int = 0
    corrupt_replicas: int = 0
    lost_chunks: int = 0
    damaged_files: set[str] = field(default_factory=set)
    unlinked_inodes: int = 0
    repaired: int = 0
    problems: list[str] = field(default_factory=list)
    remote_checked: list[str] = field(default_factory=list)  # remote tiers fully checked
    remote_unchecked: dict[str, str] = field(default_factory=dict)  # tier -> why not
    unreachable: list[str] = field(default_factory=list)  # remote tiers fsck could not reach
    requeued_uploads: int = 0  # upload jobs queued again for copies missing on a remote
    kept: int = 0  # problems --repair left alone on purpose (see the messages)
    queued_deletions: int = 0  # unreferenced frames the deletion queue will remove: no problem
    out_of_residency: int = 0  # copies outside their chunk's allowed locations
    marked_bad: int = 0  # copies found missing or corrupt, recorded bad (not --repair)
    revalidated: int = 0  # copies recorded bad that --verify found valid: recorded valid

    @property
    def clean(self) -> bool:
        return not self.problems

    def unresolved(self, repaired: bool) -> bool:
        if not repaired:
            return bool(self.problems)
        unchecked = any(why != SKIPPED for why in self.remote_unchecked.values())
        return self.lost_chunks > 0 or self.kept > 0 or unchecked


def _recorded_tiers(catalog: MetaCatalog, cfg: Config) -> list[LocalTier]:
    configured = {t.name: t for t in cfg.tiers}
    tiers = []
    for rec in catalog.recorded_tiers():
        if rec.get("kind", "local") != "local":
            continue  # remote tiers: _recorded_remotes
        tc = configured.get(rec["name"]) or TierConfig(
            name=rec["name"], kind=rec.get("kind", "local"), path=Path(rec["path"]),
            location=rec.get("location", "local"),
        )
        tier = LocalTier(tc)
        tiers.append(tier)
    return tiers


def _recorded_remotes(catalog: MetaCatalog, cfg: Config) -> list[S3TierConfig]:
    """Every remote tier the catalog records (its replica rows name them). A configured
    tier of the same name and bucket/prefix overrides how to reach it (endpoint, region,
    profile, ...); one naming another bucket or prefix is not this catalog's: ignored."""
    configured = {t.name: t for t in cfg.remote_tiers}
    remotes = []
    for rec in catalog.recorded_tiers():
        if rec.get("kind") != "s3":
            continue
        prefix = rec.get("prefix", "")
        current = configured.get(rec["name"])
        if current is not None and (current.bucket, current.prefix) != (rec["bucket"], prefix):
            log.warning("remote tier %s: the catalog records s3://%s/%s, not s3://%s/%s; "
                        "checking the recorded one", rec["name"], rec["bucket"], prefix,
                        current.bucket, current.prefix)
            current = None
        remotes.append(current or remote_tier_of(rec))
    return remotes


def run_fsck(
    cfg: Config, *, repair: bool, verify: bool, say: Callable[[str], None] = print,
    remote: bool = True,
) -> FsckReport:
    """``remote=False`` (``--local-only``): leave the remote tiers alone."""
    if not cfg.catalog_path.exists():
        raise CkptfsError(f"no catalog at {cfg.catalog_path}: nothing was ever mounted there")
    with state_lock(cfg.state_dir):
        catalog = SqliteCatalog(cfg.catalog_path)
        try:
            if verify:  # sealed frames open only with their namespace keys (codec/seal.py)
                load_keyring(catalog, cfg.governance)
            configs = _recorded_remotes(catalog, cfg)
            tiers = _recorded_tiers(catalog, cfg)
            residency = Residency(cfg.governance, {
                **{t.name: t.location for t in tiers}, **{r.name: r.location for r in configs}
            })
            if residency.enabled:
                residency.load({ns.path: catalog.digests_under([ns.path])
                                for ns in residency.bound})
            remotes = _RemoteCheck(configs, enabled=remote, state_dir=cfg.state_dir,
                                   residency=residency)
            return _check(catalog, tiers, repair, verify, say, remotes, residency)
        finally:
            catalog.close()


class FsckCatalog(NamespaceCatalog, ContentsCatalog, ReplicaCatalog, UploadQueue, DeletionQueue,
                  MoveCatalog, MetaCatalog, Protocol):
    """What fsck reads and repairs: the names, the file contents, the replica rows and upload
    jobs, the deletion queue, the moves in flight (no orphans yet) and the recorded tiers."""


@dataclass
class _Pass:
    """One fsck run: the catalog, the report, where it speaks, what it may do."""

    catalog: FsckCatalog
    rep: FsckReport
    say: Callable[[str], None]
    repair: bool
    verify: bool
    referenced: set[bytes] = field(default_factory=set)  # digests a committed file uses

    def problem(self, msg: str) -> None:
        self.rep.problems.append(msg)
        self.say(msg)


def _mark_bad(catalog: ReplicaCatalog, rep: FsckReport, digest: bytes, tier: str) -> None:
    """A copy found missing or corrupt is recorded bad, as a read records it (readers try
    it last; ``ckptfs latest`` counts it as no copy), unless --repair forgets it."""
    catalog.mark_replica_bad(digest, tier)
    rep.marked_bad += 1


def _revalidate(catalog: ReplicaCatalog, rep: FsckReport, digest: bytes, tier: str, say: Callable[[str], None]) -> None:
    """--verify found a copy recorded bad valid (its tier was away, say): valid again."""
    catalog.add_replica(digest, tier, -1)
    rep.revalidated += 1
    say(f"chunk {digest.hex()[:16]} on tier {tier}, recorded bad, is valid: recorded valid again")


def _check(
    catalog: FsckCatalog, tiers: list[LocalTier], repair: bool, verify: bool, say: Callable[[str], None],
    remotes: _RemoteCheck | None = None, residency: Residency | None = None,
) -> FsckReport:
    run = _Pass(catalog, FsckReport(), say, repair, verify)
    rep = run.rep
    _check_names(run)
    run.referenced = referenced = catalog.referenced_digests()
    valid_somewhere = _check_local_tiers(run, tiers)

    if remotes is not None:
        for tier_name, digests in remotes.run(run, set(valid_somewhere)).items():
            for digest in digests:
                valid_somewhere.setdefault(digest, []).append(tier_name)

    if residency is not None and residency.enabled:
        _check_residency(catalog, tiers, residency, valid_somewhere, rep, run.problem, say, repair)
    if rep.queued_deletions:
        say(f"{rep.queued_deletions} unreferenced chunk(s) wait in the deletion queue "
            "(removed by the daemon; not a problem)")
    _check_extents(run, valid_somewhere)
    if repair:
        catalog.drop_unreferenced(
            d for d in catalog.replica_keys_all() if d not in referenced
        )
        catalog.sync()
    return rep


def _check_names(run: _Pass) -> None:
    """Inodes with no name left hold chunks nobody can reach; entries naming no inode."""
    catalog, rep = run.catalog, run.rep
    for ino in catalog.unlinked_inodes():
        rep.unlinked_inodes += 1
        run.problem(f"unlinked inode {ino} still holds data")
        if run.repair:
            catalog.delete_inode(ino)
            rep.repaired += 1
    for parent, name, ino in catalog.dangling_dentries():
        run.problem(f"directory entry {name!r} in inode {parent} names missing inode {ino}")


def _check_local_tiers(run: _Pass, tiers: list[LocalTier]) -> dict[bytes, list[str]]:
    """Each local tier's frames against its replica rows: the tiers holding a valid copy of
    each chunk, in the order found."""
    valid_somewhere: dict[bytes, list[str]] = {}
    listed = _Listed()  # the local tiers name their first 20 orphans together
    for tier in tiers:
        try:
            tier.check()
        except CkptfsError as exc:
            run.problem(f"tier {tier.name}: {exc}")
            continue
        for digest in _ChunkScan(run, tier, f"tier {tier.name}", listed).scan(tier.list_keys()):
            valid_somewhere.setdefault(digest, []).append(tier.name)
    if listed.orphans > 20:
        run.say(f"... {listed.orphans} orphan chunks in all")
    return valid_somewhere


def _check_extents(run: _Pass, valid_somewhere: dict[bytes, list[str]]) -> None:
    """A file chunk with no valid copy on any tier: the file is damaged (reads give EIO)."""
    catalog, rep = run.catalog, run.rep
    for ino, idx, digest, _length in catalog.all_extents():
        if digest not in valid_somewhere:
            rep.lost_chunks += 1
            path = catalog.path_of(ino)
            rep.damaged_files.add(path)
            run.problem(f"file {path}: chunk {idx} ({digest.hex()[:16]}) has no valid copy; reads of it give EIO")


@dataclass
class _Listed:
    """Orphans found in one listing: the first 20 are named, then only counted."""

    orphans: int = 0


class _ChunkScan:
    """The one pass over a tier's chunk keys against the catalog's rows for that tier:
    stray names, orphans (no committed file uses them), copies that fail ``--verify``,
    copies not recorded, and rows whose copy is gone. A local tier uses it as is;
    _RemoteScan says what differs on an object store."""

    digest_size: int | None = None  # a file name of another length is an orphan here
    stray = "stray file {key!r} in the chunk directory"

    def __init__(self, run: _Pass, tier: Tier, where: str, listed: _Listed) -> None:
        self.run = run
        self.tier = tier
        self.name = tier.name
        self.where = where  # "tier NAME" / "remote tier NAME", as the messages say it
        self.listed = listed
        catalog = run.catalog
        self.known = catalog.replica_keys(self.name)
        self.marked = catalog.bad_replica_keys(self.name)
        self.queued = catalog.deletion_keys(self.name)  # the next mount's deleter removes them

    def scan(self, keys: Iterable[str]) -> list[bytes]:
        """Check every key; return the chunks this tier holds a valid copy of (verified with
        ``--verify``), in listing order."""
        run, rep = self.run, self.run.rep
        on_tier: set[bytes] = set()
        valid: list[bytes] = []
        for key in keys:
            try:
                digest = bytes.fromhex(key)
                if self.digest_size is not None and len(digest) != self.digest_size:
                    raise ValueError(key)
            except ValueError:
                run.problem(f"{self.where}: " + self.stray.format(key=key))
                continue
            on_tier.add(digest)
            if digest not in run.referenced and digest in self.queued:
                rep.queued_deletions += 1
                continue
            if digest not in run.referenced:
                self._orphan(key, digest)
                continue
            if run.verify:
                if not self._copy_ok(key, digest):
                    continue
                if digest in self.marked:
                    _revalidate(run.catalog, rep, digest, self.name, run.say)
            elif digest in self.marked:
                continue  # recorded bad and not read again: no valid copy known here
            valid.append(digest)
            if digest not in self.known and not self._in_flight(digest):
                # A referenced frame the catalog did not list here: record the replica.
                if run.repair:
                    run.catalog.add_replica(digest, self.name, -1)
                    rep.repaired += 1
                else:
                    run.problem(f"chunk {key[:16]} on {self.where} is not recorded as a replica")
        self._listing_done()
        for digest in sorted(self.known - on_tier):
            self._missing(digest)
        return valid

    def _listing_done(self) -> None:
        """After the keys, before the missing copies (the local tiers count their orphans
        together: _check_local_tiers says how many after the last one)."""

    def _orphan(self, key: str, digest: bytes) -> None:
        rep = self.run.rep
        self.listed.orphans += 1
        rep.orphans += 1
        note = ""
        kept = self._keep_orphan(digest)
        if self.run.repair and kept:
            rep.kept += 1
            note = f" (kept: {kept})"
        elif self.run.repair:
            rep.orphan_bytes += self.tier.delete(key)
            rep.repaired += 1
            note = " (reclaimed)"
        if self.listed.orphans <= 20:
            self.run.say(f"orphan chunk {key[:16]} on {self.where}{note}")
        rep.problems.append(self._orphan_problem(key))

    def _orphan_problem(self, key: str) -> str:
        return f"orphan {key}"

    def _keep_orphan(self, digest: bytes) -> str | None:
        """Why --repair must leave this orphan alone (None: it may delete it)."""
        return None

    def _in_flight(self, digest: bytes) -> bool:
        """A copy not recorded that is on its way to a row (an upload job, a move)."""
        return False

    def _copy_ok(self, key: str, digest: bytes) -> bool:
        """--verify: read the frame and check it; a bad copy is handled here (False)."""
        try:
            self._read_frame(key, digest)
        except CkptfsError as exc:
            self._corrupt(key, digest, exc)
            return False
        return True

    def _read_frame(self, key: str, digest: bytes) -> None:
        raw = self.tier.get(key)
        if raw is None:
            raise CorruptChunk("vanished during the check")
        frame.decode(raw, digest)

    def _corrupt(self, key: str, digest: bytes, exc: CkptfsError) -> None:
        run, rep = self.run, self.run.rep
        rep.corrupt_replicas += 1
        run.problem(f"corrupt chunk {key[:16]} on {self.where}: {exc}")
        if run.repair:
            run.catalog.remove_replica(digest, self.name)
            self.tier.delete(key)
            rep.repaired += 1
            self._forgotten(digest)
        elif digest in self.known and digest not in self.marked:
            _mark_bad(run.catalog, rep, digest, self.name)

    def _missing(self, digest: bytes) -> None:
        """A row whose copy is not on the tier: forgotten by --repair, else recorded bad."""
        run, rep = self.run, self.run.rep
        rep.missing_replicas += 1
        run.problem(f"chunk {digest.hex()[:16]} recorded on {self.where} is missing there")
        if run.repair:
            run.catalog.remove_replica(digest, self.name)
            rep.repaired += 1
            self._forgotten(digest)
        elif digest not in self.marked:
            _mark_bad(run.catalog, rep, digest, self.name)

    def _forgotten(self, digest: bytes) -> None:
        """--repair forgot this tier's copy of ``digest`` (a local tier: nothing more)."""


class _ResidencyCatalog(ReplicaCatalog, DeletionQueue, Protocol):
    """Deleting a copy outside its allowed locations: its row, and a remote object through
    the deletion queue."""


def _check_residency(
    catalog: _ResidencyCatalog, tiers: list[LocalTier], residency: Residency,
    valid_somewhere: dict[bytes, list[str]], rep: FsckReport, problem: Callable[[str], None],
    say: Callable[[str], None], repair: bool,
) -> None:
    """Copies outside their chunk's allowed locations (a tier relabelled, a bound narrowed):
    reported; ``repair`` deletes those whose chunk has a valid copy where it is allowed
    (a local frame at once, a remote object through the deletion queue at the next
    mount) and keeps the others (the only copies: deleting them would lose the data)."""
    local = {t.name: t for t in tiers}
    for digest, holders in valid_somewhere.items():
        out = [t for t in holders if not residency.permits(digest, t)]
        if not out:
            continue
        kept_by = [t for t in holders if t not in out]
        for name in out:
            rep.out_of_residency += 1
            where = f"tier {name} (location {residency.locations.get(name)})"
            problem(f"chunk {digest.hex()[:16]} on {where} is outside its namespace's "
                    f"allowed locations {sorted(residency.allowed(digest) or ())}")
            if not repair:
                continue
            if not kept_by:
                rep.kept += 1
                say(f"chunk {digest.hex()[:16]} on {where} kept: it has no copy in an allowed "
                    "location")
                continue
            catalog.remove_replica(digest, name)
            if name in local:
                local[name].delete(digest.hex())
            else:
                catalog.queue_deletions([(digest, name)])
            rep.repaired += 1
            say(f"chunk {digest.hex()[:16]} on {where} deleted (a copy stays on "
                f"{', '.join(kept_by)})")
        if repair and kept_by:
            valid_somewhere[digest] = kept_by


# -- remote tiers ------------------------------------------------------------------------------


def _is_checksum_error(exc: TierError) -> bool:
    import botocore.exceptions as bce

    return isinstance(exc.__cause__, bce.FlexibleChecksumError | bce.ChecksumError)


def _read_object(tier: S3Tier, key: str) -> bytes | None:
    """One object's body. A body that twice fails the S3 checksum the server stored is
    damaged at rest: CorruptChunk (a TierError means the remote failed)."""
    try:
        return tier.get(key)
    except TransientTierError as exc:
        if not _is_checksum_error(exc):
            raise
    try:
        return tier.get(key)
    except TransientTierError as exc:
        if _is_checksum_error(exc):
            raise CorruptChunk(f"the stored object fails its S3 checksum: {exc}") from exc
        raise


class _RemoteCheck:
    """The remote half of fsck: one pass per remote tier the catalog records."""

    def __init__(self, configs: list[S3TierConfig], *, enabled: bool, state_dir: Path,
                 residency: Residency | None = None) -> None:
        self.configs = configs
        self.enabled = enabled
        self.state_dir = state_dir
        self.residency = residency

    def run(self, run: _Pass, local_valid: set[bytes]) -> dict[str, set[bytes]]:
        """Check every remote tier; return the chunks each one holds (verified with
        ``verify``). A tier not checked vouches for the copies recorded on it."""
        catalog, rep = run.catalog, run.rep
        held: dict[str, set[bytes]] = {}
        # An object a node moved uncommitted (catalog/moves.py) is no orphan yet either.
        pending = catalog.upload_job_pairs() | {(d, t) for d, t, _ in catalog.chunk_moves()}
        for rc in self.configs:
            found = None
            if not self.enabled:
                rep.remote_unchecked[rc.name] = SKIPPED
            else:
                found = self._check_tier(run, rc, local_valid, pending)
            held[rc.name] = found if found is not None else catalog.replica_keys(rc.name)
        return held

    def _check_tier(
        self, run: _Pass, rc: S3TierConfig, local_valid: set[bytes],
        pending: set[tuple[bytes, str]],
    ) -> set[bytes] | None:
        from ..tiers.s3 import S3Tier
        from ..upload.lease import (
            describe_holder,
            held_elsewhere,
            lease_timing,
            read_lease,
            writer_id,
        )

        rep, name = run.rep, rc.name
        url = f"s3://{rc.bucket}/{rc.prefix}" + (f" at {rc.endpoint_url}" if rc.endpoint_url else "")
        timing = lease_timing()
        tier: S3Tier | None = None
        try:
            tier = S3Tier(rc)
            tier.check()
            lease = read_lease(tier)
            me = writer_id(self.state_dir, create=False)
            now = time.time()
            if held_elsewhere(lease, me, timing, now):
                why = (f"in use by another writer ({describe_holder(lease, now)}); check it "
                       "from that node, or after it unmounts")
                rep.remote_unchecked[name] = why
                run.problem(f"remote tier {name} ({url}) not checked: {why}")
                return None
            # Another node wrote the prefix last: objects our catalog does not know may be
            # its chunks. Report them, never delete them from here.
            foreign = None
            if lease.lease is not None and lease.lease.writer_id != me:
                foreign = describe_holder(lease, now)
            return self._compare(run, tier, local_valid, pending, foreign)
        except TierError as exc:
            rep.unreachable.append(name)
            rep.remote_unchecked[name] = "cannot be reached (see above)"
            run.problem(f"remote tier {name} ({url}) cannot be reached: {exc}; its copies were not "
                    "checked (nothing was changed for it)")
            return None
        finally:
            if tier is not None:
                tier.close()

    def _compare(self, run: _Pass, tier: S3Tier, local_valid: set[bytes],
                 pending: set[tuple[bytes, str]], foreign: str | None) -> set[bytes]:
        keys = list(tier.list_keys())  # the whole listing first: a failure changes nothing
        scan = _RemoteScan(run, tier, pending=pending, foreign=foreign, local_valid=local_valid,
                           residency=self.residency)
        valid = set(scan.scan(keys))
        run.rep.remote_checked.append(tier.name)
        return valid


class _RemoteScan(_ChunkScan):
    """_ChunkScan on a remote tier: keys are whole digests; an orphan is kept while an
    upload job or a move of it is pending or while another node wrote the prefix last;
    an object the server fails to serve is unreadable, not corrupt; a copy --repair
    forgets is uploaded again from a valid local copy."""

    digest_size = frame.DIGEST_SIZE
    stray = "stray object {key!r} in the chunk prefix"

    def __init__(self, run: _Pass, tier: S3Tier, *, pending: set[tuple[bytes, str]],
                 foreign: str | None, local_valid: set[bytes],
                 residency: Residency | None) -> None:
        super().__init__(run, tier, f"remote tier {tier.name}", _Listed())
        self.s3 = tier
        self.pending = pending
        self.pending_digests = {d for d, _t in pending}
        self.foreign = foreign
        self.local_valid = local_valid
        self.residency = residency

    def _orphan_problem(self, key: str) -> str:
        return f"orphan {key} on {self.name}"

    def _listing_done(self) -> None:
        if self.listed.orphans > 20:
            self.run.say(f"... {self.listed.orphans} orphan chunks on remote tier {self.name} in all")

    def _keep_orphan(self, digest: bytes) -> str | None:
        if digest in self.pending_digests:
            return "an upload job or a move of it is pending"
        if self.foreign:
            return f"another node wrote this prefix last: {self.foreign}"
        return None

    def _in_flight(self, digest: bytes) -> bool:
        return (digest, self.name) in self.pending

    def _copy_ok(self, key: str, digest: bytes) -> bool:
        try:
            self._read_frame(key, digest)
        except ObjectUnreadable as exc:
            self._unreadable(key, digest, exc)
            return False
        except CorruptChunk as exc:
            self._corrupt(key, digest, exc)
            return False
        return True

    def _read_frame(self, key: str, digest: bytes) -> None:
        raw = _read_object(self.s3, key)
        if raw is None:
            raise CorruptChunk("vanished during the check")
        frame.verify(raw, digest)

    def _unreadable(self, key: str, digest: bytes, exc: ObjectUnreadable) -> None:
        # The server fails this object while it answers for the others: report it and go
        # on. --repair replaces it only from a valid local copy (it may be readable again
        # later: without one, forgetting it loses it).
        run, rep, name = self.run, self.run.rep, self.name
        rep.corrupt_replicas += 1
        run.problem(f"unreadable chunk {key[:16]} on remote tier {name}: {exc}")
        if run.repair and digest in self.known and digest in self.local_valid:
            run.catalog.remove_replica(digest, name)
            self.tier.delete(key)
            rep.repaired += 1
            self._requeue(digest)
        else:
            if run.repair:
                rep.kept += 1
                run.say(f"chunk {key[:16]} on remote tier {name} kept: no valid local "
                        "copy to upload again")
            if digest in self.known and digest not in self.marked:
                _mark_bad(run.catalog, rep, digest, name)

    def _forgotten(self, digest: bytes) -> None:
        if digest in self.known:
            self._requeue(digest)

    def _requeue(self, digest: bytes) -> None:
        name = self.name
        if self.residency is not None and not self.residency.permits(digest, name):
            self.run.say(f"chunk {digest.hex()[:16]}: not uploaded to remote tier {name} again "
                         "(outside its namespace's allowed locations)")
            return
        if digest in self.run.referenced and digest in self.local_valid and (
            self.run.catalog.queue_upload(digest, name)
        ):
            self.run.rep.requeued_uploads += 1
            self.run.say(f"upload of chunk {digest.hex()[:16]} to remote tier {name} queued again")


def cmd_fsck(cfg: Config, *, repair: bool, verify: bool, local_only: bool) -> int:
    """`ckptfs fsck`: check (and with ``repair`` fix) offline; print a summary; exit code."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    rep = run_fsck(cfg, repair=repair, verify=verify, remote=not local_only)
    summary = (
        f"fsck: {rep.orphans} orphan chunk(s) ({rep.orphan_bytes} bytes reclaimed), "
        f"{rep.missing_replicas} missing and {rep.corrupt_replicas} corrupt replica(s), "
        f"{rep.lost_chunks} chunk(s) with no valid copy, {rep.unlinked_inodes} unlinked inode(s)"
    )
    print(summary)
    if rep.marked_bad or rep.revalidated:
        print(f"fsck: {rep.marked_bad} copy(ies) recorded bad, {rep.revalidated} recorded "
              "valid again")
    if rep.remote_checked or rep.requeued_uploads:
        print(f"fsck: remote tier(s) checked: {', '.join(rep.remote_checked) or 'none'}; "
              f"{rep.requeued_uploads} upload(s) re-queued")
    for name, why in sorted(rep.remote_unchecked.items()):
        print(f"fsck: remote tier {name} not checked: {why}")
    if rep.clean:
        print("fsck: clean")
        return 0
    if repair and not rep.unresolved(repaired=True):
        print(f"fsck: repaired {rep.repaired} problem(s)")
        return 0
    if rep.damaged_files:
        print("fsck: damaged files: " + ", ".join(sorted(rep.damaged_files)))
    return 1
