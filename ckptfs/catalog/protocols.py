"""The catalog's surface, as Protocols by concern.

Callers can be typed against the narrow Protocol they use; ``Catalog`` is all of them (what
an engine implements). Every method that changes something is one transaction (all of it
or nothing); a read that takes several statements sees one state (SQLite: the daemon's one
connection, used by one thread at a time; PostgreSQL: one REPEATABLE READ transaction).
Namespace errors are the errno carrying ones of ckptfs/errors.py (AlreadyExists, NotFound,
NotEmpty, ...); a server engine whose database cannot be reached raises CatalogUnavailable
(EIO). The engines, both the logic of sql.py and both run by
tests/support/catalog_conformance.py: sqlite.py (SqliteCatalog) and postgres.py
(PostgresCatalog). Rows are the engine-neutral dataclasses of rows.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from .audit import AuditEntry, AuditRecord
from .deletion_events import Listener
from .hooks import CatalogHooks
from .keys import KeyRow, Wrap
from .quotas import Charge, NamespaceUsage
from .rows import (
    Around,
    Backlog,
    CheckpointRow,
    CheckpointState,
    ChunkRef,
    Deletion,
    DeletionBacklog,
    ExtentReplicas,
    Inode,
    Registered,
    SessionEnd,
    SessionRow,
    UploadJob,
)
from .wants import WantListener


class NamespaceCatalog(Protocol):
    """Inodes, directory entries and extended attributes: what the VFS's namespace
    operations, path lookups and fsck's namespace checks ask."""

    def get_inode(self, ino: int) -> Inode:
        ...

    def lookup(self, parent: int, name: bytes) -> Inode:
        ...

    def create(
        self, parent: int, name: bytes, mode: int, uid: int, gid: int, target: bytes | None = None,
        rdev: int = 0, *, audit: AuditRecord | None = None, around: Around | None = None,
    ) -> Inode:
        """Create a file, directory, symlink or special file (FIFO, socket, device with
        ``rdev``) entry. EEXIST if the name is taken. ``audit``: recorded in the same
        transaction (AuditCatalog), as on every write method that takes it. ``around``
        (rows.Around): filled with the directory after the change (and its path)."""
        ...

    def link(self, ino: int, parent: int, name: bytes) -> Inode:
        ...

    def unlink(self, parent: int, name: bytes, *, audit: AuditRecord | None = None,
               around: Around | None = None) -> Inode:
        """Remove a non-directory entry; returns the inode with its new link count."""
        ...

    def rmdir(self, parent: int, name: bytes, *, audit: AuditRecord | None = None) -> Inode:
        ...

    def rename(
        self, old_parent: int, old_name: bytes, new_parent: int, new_name: bytes, noreplace: bool,
        *, audit: AuditRecord | None = None, around: Around | None = None,
    ) -> Inode | None:
        """Atomic rename. Returns the replaced inode (with its new link count), if any."""
        ...

    def setattr(
        self,
        ino: int,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        atime_ns: int | None = None,
        mtime_ns: int | None = None,
    ) -> Inode:
        ...

    def readdir(self, parent: int, after_id: int, limit: int = 256) -> list[tuple[int, bytes, Inode]]:
        ...

    def get_xattr(self, ino: int, name: bytes) -> bytes | None:
        ...

    def list_xattrs(self, ino: int) -> list[bytes]:
        ...

    def xattr_inodes(self) -> set[int]:
        """The inodes that have stored extended attributes."""
        ...

    def set_xattr(self, ino: int, name: bytes, value: bytes, *, create: bool = False,
                  replace_only: bool = False, total_max: int | None = None) -> Inode:
        """Store an attribute (and bump the inode's ctime). ``create``: EEXIST if it is
        there; ``replace_only``: ENODATA if it is not; ``total_max``: ENOSPC if the
        inode's attributes would then hold more bytes of names and values. Returns the
        inode."""
        ...

    def remove_xattr(self, ino: int, name: bytes) -> Inode:
        """ENODATA if the inode has no such attribute."""
        ...

    def resolve(self, path: str) -> Inode | None:
        """The inode at ``path`` (absolute inside the mount), or None."""
        ...

    def list_names(self, ino: int) -> list[str]:
        ...

    def path_of(self, ino: int) -> str:
        ...

    def files_under(self, root: str) -> list[Inode]:
        """The regular files at or under ``root`` (a path inside the mount)."""
        ...

    def unlinked_inodes(self) -> list[int]:
        """Inodes with no name left (unlinked while open before a crash or shutdown)."""
        ...

    def dangling_dentries(self) -> list[tuple[int, bytes, int]]:
        ...


class ContentsCatalog(Protocol):
    """File contents: extents, chunk rows and the commit of a file."""

    def extents(self, ino: int) -> dict[int, ChunkRef]:
        ...

    def commit_file(
        self,
        ino: int,
        size: int,
        mtime_ns: int,
        ctime_ns: int,
        chunk_size: int,
        changes: dict[int, ChunkRef | None],
        synced: bool = False,
        uploads: dict[bytes, list[str]] | None = None,
        charge: Charge | None = None,
        *,
        audit: AuditRecord | None = None,
    ) -> list[bytes]:
        """Commit a file's new size, times and changed extents in one transaction.

        Extents past the end are dropped. Returns the digests that lost a reference
        (candidates for garbage collection). ``charge``: the file's namespace counts its
        new size in the same transaction (quotas.py), which raises QuotaExceeded, and
        commits nothing, if that takes the namespace past ``charge.quota``.
        """
        ...

    def delete_inode(self, ino: int) -> list[bytes]:
        """Drop an inode whose last link and last open handle are gone (not while any
        node's session holds it open: the last closer drops it, sessions.py)."""
        ...

    def drop_unreferenced(
        self, digests: Iterable[bytes], extra_tiers: dict[bytes, set[str]] | None = None
    ) -> dict[bytes, list[str]]:
        """Drop the chunk, replica and upload rows of chunks no extent references, and queue
        the deletion of their frames (from the recorded tiers, the tiers in ``extra_tiers``
        a caller just wrote them to, and the remotes an upload may have reached) in the same
        transaction. Returns digest -> tiers queued."""
        ...

    def has_chunk(self, digest: bytes) -> bool:
        """Whether a committed file names this chunk (its row exists)."""
        ...

    def chunk_length(self, digest: bytes) -> int:
        ...

    def digests_under(self, roots: Iterable[str]) -> dict[bytes, int]:
        """Chunks (digest -> length) named by the files at or under these paths."""
        ...

    def referenced_digests(self) -> set[bytes]:
        ...

    def all_extents(self) -> list[tuple[int, int, bytes, int]]:
        ...

    def extent_replicas(self, inos: Sequence[int], tiers: Sequence[str]) -> list[ExtentReplicas]:
        """Every extent of these files, with whether a valid copy of its chunk is on one of
        ``tiers`` (``ckptfs prefetch``). Queried in batches (SQLite's variable limit)."""
        ...


class ReplicaCatalog(Protocol):
    """Where chunk copies are (replica rows: valid or bad), and local eviction."""

    def replica_tiers(self, digest: bytes) -> tuple[str, ...]:
        ...

    def stored_by_tier(self) -> dict[str, tuple[int, int]]:
        """Per tier, the valid copies the catalog records there: (chunks, plaintext bytes).
        One scan of the replicas: for `ckptfs status`, beside the daemon, not in it."""
        ...

    def stored_on_tier(self, tier: str) -> tuple[int, int]:
        """The valid copies the catalog records on one tier: (chunks, plaintext bytes)."""
        ...

    def mark_replica_bad(self, digest: bytes, tier: str) -> None:
        """A read, ``ckptfs verify`` or fsck found this copy missing or corrupt: readers
        skip it (tried last, when no valid copy is left) and it counts as no copy
        (checkpoints/reach.py) until it is healed or found valid again."""
        ...

    def bad_replica_tiers(self, digest: bytes) -> tuple[str, ...]:
        """The tiers whose copy of this chunk is recorded bad."""
        ...

    def bad_replica_keys(self, tier: str) -> set[bytes]:
        """The chunks whose copy on ``tier`` is recorded bad (fsck)."""
        ...

    def add_replica_if_known(self, digest: bytes, tier: str) -> bool:
        """Record a (healed or copied back) valid copy of a chunk the catalog still knows.
        False if the chunk was dropped meanwhile: the copy is queued for deletion."""
        ...

    def add_replica(self, digest: bytes, tier: str, length: int) -> None:
        ...

    def remove_replica(self, digest: bytes, tier: str) -> None:
        ...

    def replica_keys(self, tier: str) -> set[bytes]:
        ...

    def replica_keys_all(self) -> set[bytes]:
        ...

    def eviction_candidates(
        self, local_tiers: Sequence[str], remote_tiers: Sequence[str], limit: int
    ) -> list[tuple[bytes, str, int]]:
        """Local replicas that may go: a remote tier holds the chunk and no upload still
        needs the local copy. Chunks of the least recently modified files first (a restart
        reads the newest checkpoint). Returns (digest, local tier, frame body length)."""
        ...

    def forget_local_replica(self, digest: bytes, tier: str, remote_tiers: Sequence[str], *,
                             audit: AuditRecord | None = None) -> bool:
        """Turn a local replica row into a deletion row if a remote copy still backs it and
        no upload needs it (checked again in the transaction)."""
        ...


class UploadQueue(Protocol):
    """The upload jobs that copy chunks to remote tiers (upload/uploader.py runs them)."""

    def requeue_upload(self, digest: bytes, tier: str) -> bool:
        """Copy a chunk to a remote tier again (its copy there is missing or corrupt)."""
        ...

    def queue_upload(self, digest: bytes, tier: str) -> bool:
        """Queue the copy of a known chunk to a remote tier (the row commit_file writes),
        leaving its replica rows alone. False if a job is queued already or the chunk is
        not known."""
        ...

    def upload_job_pairs(self) -> set[tuple[bytes, str]]:
        """Every (digest, tier) with an upload job (``ckptfs fsck --remote``)."""
        ...

    def due_uploads(
        self, now_ns: int, limit: int, skip: set[tuple[bytes, str]],
        sources: Sequence[str] | None = None,
    ) -> list[UploadJob]:
        """Jobs ready to run, oldest commit first. ``sources``: only jobs of chunks with a
        valid replica on one of these tiers (a node of a shared catalog uploads what its
        own local tiers hold; None: every job)."""
        ...

    def due_uploads_of(
        self, digests: Iterable[bytes], now_ns: int, limit: int, skip: set[tuple[bytes, str]],
        sources: Sequence[str] | None = None,
    ) -> list[UploadJob]:
        """Ready jobs for the given chunks only (someone waits for them: expedite)."""
        ...

    def pending_digests(self, digests: Iterable[bytes]) -> int:
        """How many of these chunks still have an upload job."""
        ...

    def pending_uploads_for(self, inos: Iterable[int]) -> int:
        """Upload jobs still open for chunks the given files name."""
        ...

    def not_durable_files(self) -> dict[str, set[int]]:
        """Files naming a chunk with an upload still open (not on every remote yet), by
        the local tier holding that chunk: what a node's loss would take with it
        (docs/multinode.md)."""
        ...

    def next_upload_due_ns(
        self, skip: set[tuple[bytes, str]], sources: Sequence[str] | None = None
    ) -> int | None:
        """Earliest retry time among jobs not running now (of ``sources`` as above); a job
        held by a claimed deletion of its pair counts at the claim's lease end, and not at
        all once that has passed (the deleter that takes the row over ends the claim: an
        event, not a deadline)."""
        ...

    def finish_upload(self, digest: bytes, tier: str) -> bool:
        """Record a finished copy. False if the job was cancelled meanwhile (the chunk was
        deleted): the caller then removes the copy it made. Touches the catalog: the next
        remote snapshot must know the chunk is there."""
        ...

    def finish_uploads(
        self, done: Sequence[tuple[bytes, str]], jobs: Mapping[tuple[bytes, str], int] | None = None
    ) -> dict[tuple[bytes, str], bool]:
        """``finish_upload`` of each (digest, tier) in one transaction: which were kept.
        One whose deletion is claimed (its DELETE may land after this PUT) is not recorded:
        False, and its job stays, to run again once the deletion is done. ``jobs``: the
        ``enqueued_ns`` of the job each upload ran for; a pair whose job is another one now
        (queued again after its chunk was dropped and deleted) is not recorded either."""
        ...

    def postpone_upload(
        self, digest: bytes, tier: str, next_try_ns: int, error: str, blocked: bool
    ) -> None:
        ...

    def retry_uploads_now(self, tier: str) -> int:
        """Make the postponed uploads to ``tier`` due at once (not those blocked by a
        permanent refusal): the tier works again. Returns how many."""
        ...

    def backlog(self) -> Backlog:
        ...

    def drop_upload_jobs(self, digests: Iterable[bytes], tier: str | None = None) -> int:
        """Forget pending uploads of these chunks (a superseded checkpoint's; ``tier``:
        only those to that tier, which residency does not allow)."""
        ...


class DeletionQueue(Protocol):
    """Chunk frames to delete from tiers (chunks/deleter.py)."""

    def queue_deletions(self, pairs: Iterable[tuple[bytes, str]]) -> int:
        """Queue frames to delete (frames found left over, e.g. of an expired checkpoint).
        Safe for any pair: the deleter cancels a row whose chunk is wanted on its tier."""
        ...

    def due_deletions(
        self, now_ns: int, limit: int, skip: set[tuple[bytes, str]], tiers: Sequence[str]
    ) -> list[Deletion]:
        """Rows of these tiers ready to run, oldest first."""
        ...

    def next_deletion_due_ns(self, skip: set[tuple[bytes, str]], tiers: Sequence[str]) -> int | None:
        """Earliest retry time among rows of these tiers not running now."""
        ...

    def claim_deletions(
        self, pairs: Sequence[tuple[bytes, str]], lease_until_ns: int | None = None,
        owner: tuple[str, str] | None = None,
    ) -> list[tuple[bytes, str]]:
        """The pairs whose frame may be deleted now. A row whose chunk is wanted again on
        its tier (a valid replica row, an upload job, or a node's move of its uncommitted
        chunk there, for the same pair) is cancelled (if its claim's lease had run out,
        the jobs that claim held may run: they are told);
        a row that is gone (done by someone else) or leased by another deleter is skipped.
        ``lease_until_ns`` (wall clock): mark the rows returned as claimed until then
        (remote tiers: another node could upload the same object meanwhile), or until
        finished, postponed or released with that value; no upload of a claimed pair is
        due or recorded. The value names the claim: a caller that could not learn whether
        its claim committed (the database went away) releases exactly that claim.
        ``owner`` (node, session): recorded with each claim, so that a restart of that
        node takes back the claims its dead daemon left (catalog/claims.py)."""
        ...

    def adopt_deletion_claims(
        self, node: str, sid: str, until_by_tier: Mapping[str, int], every: bool = False,
    ) -> list[tuple[bytes, str, int]]:
        """At a daemon's start: claim again, as (``node``, ``sid``)'s and until its tier's
        value in ``until_by_tier``, the claimed rows of those tiers that a dead daemon of
        ``node`` left (an owner row naming ``node`` and a session that is not alive;
        ``every``: every claimed row, for a catalog only one daemon uses at a time).
        Returns (digest, tier, lease value) of each (catalog/claims.py)."""
        ...

    def finish_deletions(
        self, pairs: Iterable[tuple[bytes, str]], lease_until_ns: int | None = None
    ) -> None:
        """The frames of these pairs are deleted: drop their rows (with ``lease_until_ns``,
        only rows still claimed with that value)."""
        ...

    def release_deletion_claims(
        self, pairs: Iterable[tuple[bytes, str]], lease_until_ns: int
    ) -> int:
        """End the claims made with ``lease_until_ns`` without deleting (nothing was sent
        to the tier, or what was sent can no longer land): those rows are due again, and
        the upload jobs they held may run. Rows claimed otherwise are left. Returns
        how many were released."""
        ...

    def postpone_deletion(
        self, digest: bytes, tier: str, next_try_ns: int, error: str,
        lease_until_ns: int | None = None, *, keep_claim: bool = False,
    ) -> None:
        """The deletion failed: count the attempt, keep ``error``, retry at ``next_try_ns``
        (with ``lease_until_ns``, only if the row is still claimed with that value).
        ``keep_claim``: the DELETE may still land (it failed in doubt), so the row stays
        claimed until ``next_try_ns``, its new lease value: no upload of the pair is due
        or recorded before; it is then due again, as any lease that ran out is."""
        ...

    def retry_deletions_now(self, tier: str | None = None) -> int:
        """Make postponed rows due at once (a tier works again; ``ckptfs gc``)."""
        ...

    def deletions_pending(self, digests: Iterable[bytes], due_before_ns: int | None = None) -> set[bytes]:
        """Which of these chunks still have deletion rows (only rows due by then, if given)."""
        ...

    def deletion_keys(self, tier: str) -> set[bytes]:
        ...

    def deletion_backlog(self) -> list[DeletionBacklog]:
        """The deletion queue per tier (empty for a read-only catalog that predates it)."""
        ...

    def listen_deletions(self) -> Listener | None:
        """Where this node hears that another node queued, made due or ended deletion rows
        (its own connection; catalog/deletion_events.py); None when no other node can
        (SQLite)."""
        ...

    def listen_held_uploads(self) -> Listener | None:
        """Where this node hears that another node's claim ended while an upload job of
        its pair waited; None when no other node can claim (SQLite)."""
        ...


class CheckpointCatalog(Protocol):
    """The checkpoint rows the detectors record and retention changes."""

    def checkpoint_begin(
        self, root: str, framework: str, step: int | None, t_ns: int, *,
        keep_newer_commit: bool = False,
    ) -> bool:
        """A checkpoint is being written. A committed or partial one at the same path that
        is written again (an overwrite) starts over; with ``keep_newer_commit`` (a shared
        catalog: another node's begin may land late) a committed one whose commit is not
        older than ``t_ns`` stays committed. True if the row changed."""
        ...

    def checkpoint_commit(
        self, root: str, framework: str, step: int | None, t_ns: int, reason: str, *,
        audit: AuditRecord | None = None,
    ) -> None:
        ...

    def checkpoint_set_state(
        self, root: str, state: CheckpointState | str, reason: str | None = None, *,
        only_from: CheckpointState | None = None, audit: AuditRecord | None = None,
    ) -> bool:
        """``state``: a CheckpointState (a string naming none is refused: InvalidArgument);
        ``only_from``: change it only if it is in that state now (another node may have
        changed it since it was read). True if the row changed."""
        ...

    def checkpoint_leftover(self, root: str, digests: list[bytes]) -> None:
        ...

    def expired_leftovers(self) -> dict[str, list[bytes]]:
        ...

    def checkpoint_tag(self, root: str, tag: str, *, audit: AuditRecord | None = None) -> bool:
        ...

    def checkpoint_rows(self, under: str = "/") -> list[CheckpointRow]:
        """Checkpoint rows at or under ``under``, oldest first."""
        ...

    def rename_checkpoints(self, old: str, new: str) -> None:
        """A directory or file was renamed: checkpoints at or under it move with it."""
        ...


class MetaCatalog(Protocol):
    """Key/value meta (fs id, recorded tiers, snapshot times), durability and the
    catalog snapshot stored on the remotes."""

    def get_meta(self, key: str) -> str | None:
        ...

    def set_meta(self, key: str, value: str) -> None:
        ...

    def recorded_tiers(self) -> list[dict[str, str]]:
        """The tiers the catalog was last mounted with (meta ``tiers``, mount.tier_record)."""
        ...

    def sync(self) -> None:
        """Make every earlier commit synced to disk (a no-op write in a FULL transaction)."""
        ...

    def snapshot_of_ns(self) -> int | None:
        """When the catalog state last stored on the remotes was taken (None: never)."""
        ...

    def snapshot_is_current(self) -> bool:
        """The remote catalog snapshot includes every namespace and content change."""
        ...

    def backup_bytes(self) -> bytes:
        """A consistent copy of the whole catalog: the snapshot stored on the remotes, a
        SQLite catalog file for every engine (a bucket restore opens it as SQLite)."""
        ...

    def adopt_snapshot(self, remote_tiers: list[str]) -> tuple[int, list[str]]:
        """Turn a catalog restored from a remote snapshot into this node's catalog.

        A chunk the snapshot records on any remote tier is recorded on every configured
        remote tier (reads try each; striping may differ on this node); local replicas
        and upload jobs are forgotten. A file naming a chunk no remote held when the
        snapshot was taken (its upload was still pending) cannot be recovered: it is
        removed. Returns (files kept, paths of files removed)."""
        ...

    def close(self) -> None:
        ...


class ExclusiveLock(Protocol):
    """A cluster-wide lock held by one caller on any node (``SessionCatalog.try_exclusive``).
    ``held`` is a catalog round trip (call it in a worker thread); ``release`` is not."""

    def held(self) -> bool:
        """Still held: False once the connection that holds it was lost (the database
        restarted), when another node may have taken it."""
        ...

    def release(self) -> None:
        """Free it without a round trip (the connection holding it closes)."""
        ...


class SessionCatalog(Protocol):
    """Node sessions of a shared catalog (catalog/sessions.py; docs/multinode.md): the
    daemon registers one, its heartbeat extends it, a live node cleans up expired ones; the
    VFS notes the inodes it holds open (only when the catalog is ``shared``). Every time is
    the database's clock."""

    def register_session(
        self, node: str, timeout_s: float, info: str = "", sid: str | None = None,
        earlier: str = "",
    ) -> Registered:
        """A new session of ``node``, expiring ``timeout_s`` after now unless a heartbeat
        extends it. A live session of the same node name: UsageError naming the node; an
        expired one is ended first (as its cleanup would). ``sid``: the id the caller chose
        for this registration (a new one if None); a live session with that id is this
        caller's own earlier attempt, whose reply was lost: it is extended and returned.
        ``earlier``: the id of the caller's own earlier session (the one its state dir
        names, of a daemon that held that state dir's lock and is dead): a live session of
        the node with that id is ended first too, like an expired one (``previous``)."""
        ...

    def heartbeat_session(self, sid: str, timeout_s: float) -> bool:
        """Push the session's expiry to ``timeout_s`` after now; False if it is gone
        (expired and cleaned up by another node, or closed)."""
        ...

    def close_session(self, sid: str) -> SessionEnd:
        """End this node's session (a clean unmount, after its last commit)."""
        ...

    def cleanup_expired_sessions(self) -> list[SessionEnd]:
        """End every session whose expiry passed, if this caller wins the cleanup (one at a
        time: the others get [] at once). Each is ended exactly once."""
        ...

    def sessions(self) -> list[SessionRow]:
        ...

    def database_now_ns(self) -> int:
        """The database's clock (what session expiries are measured in)."""
        ...

    def note_open(self, sid: str, ino: int, writing: bool = False) -> None:
        """Session ``sid`` holds ``ino`` open (for writing, if ``writing``). NotFound if the
        inode is gone (dropped by another node meanwhile); nothing if the session is gone
        (its heartbeat registers again and notes its open inodes anew)."""
        ...

    def note_open_many(self, sid: str, inos: Sequence[tuple[int, bool]]) -> None:
        """``note_open`` of several (ino, writing); inodes gone meanwhile are skipped."""
        ...

    def release_inode(self, sid: str, ino: int) -> list[bytes] | None:
        """Session ``sid`` closed its last handle of ``ino``. If the inode has no name left
        and no other session holds it open, it is dropped: the digests its extents named
        (to collect); None if it stays."""
        ...

    def open_inodes(self) -> set[int]:
        """Every inode some session holds open (retention never expires what is open)."""
        ...

    def open_writer_paths(self) -> list[str]:
        """The paths of the inodes any session holds open for writing (empty without
        sessions: the embedded catalog)."""
        ...


class WantCatalog(Protocol):
    """Chunks a node's reader waits for that only other nodes' local tiers hold
    (catalog/wants.py; docs/multinode.md): the holders upload them first. Times are the
    database's clock."""

    def want_chunks(self, digests: Iterable[bytes], waiter: str, ttl_s: float) -> None:
        """``waiter`` waits for these chunks for at most ``ttl_s`` more seconds (renews its
        earlier want); the other nodes are told at the commit (listen_wants)."""
        ...

    def unwant_chunks(self, digests: Iterable[bytes], waiter: str) -> None:
        ...

    def wanted_uploads(self, sources: Sequence[str] | None, limit: int = 1000) -> list[bytes]:
        """Chunks a live want names with an upload job of ``sources`` (as due_uploads),
        the longest wanted first."""
        ...

    def chunk_wants(self) -> list[tuple[bytes, str, int]]:
        """Every live want: (digest, waiter, ns until it expires)."""
        ...

    def listen_wants(self) -> WantListener | None:
        """Where this node hears of other nodes' new wants (its own connection); None
        when no other node can want anything (SQLite)."""
        ...

    def try_exclusive(self, name: str) -> ExclusiveLock | None:
        """Take the cluster-wide lock ``name`` (the retention pass: one node at a time), or
        None if another caller, on any node, holds it. It is held until ``release``, or
        until the holder's node dies (its connection ends). One node's engine (SQLite)
        grants it always."""
        ...


class MoveCatalog(Protocol):
    """Uncommitted chunks a node moved to a remote tier because its local tiers were full
    (catalog/moves.py; docs/multinode.md "One chunk, two nodes"): while a move is
    recorded, no node claims a deletion of its (digest, tier)."""

    def begin_move(self, digest: bytes, length: int, tiers: Sequence[str], node: str) -> bool:
        """Before the PUT: False (nothing written) if a deletion of one of the pairs is
        claimed; else cancel their unclaimed deletion rows, record the moves, True."""
        ...

    def end_moves(self, pairs: Iterable[tuple[bytes, str]], node: str) -> int:
        """The chunks are no longer uncommitted on ``node``: end its moves; queue the
        deletion of each object nothing else wants. Returns the deletions queued."""
        ...

    def release_moves(self, node: str | None = None) -> int:
        """End every move of ``node`` (None: of all) left by a run that did not end them."""
        ...

    def chunk_moves(self) -> list[tuple[bytes, str, str]]:
        """Every recorded move: (digest, tier, node)."""
        ...


class QuotaCatalog(Protocol):
    """The usage of each namespace (catalog/quotas.py; docs/governance.md "Quotas"):
    counted in the transactions that change a file's size or drop it."""

    def count_namespaces(self, namespaces: Sequence[tuple[str, int | None]]) -> list[str]:
        """Record each (path, quota) declared; count a namespace not counted before from
        the files under its path. Returns the paths counted now."""
        ...

    def namespace_usage(self) -> list[NamespaceUsage]:
        """Every namespace counted so far: bytes, files and the quota recorded."""
        ...

    def namespace_used(self, ns: str) -> int:
        """A namespace's bytes now (0 if not counted)."""
        ...


class AuditCatalog(Protocol):
    """The audit log (audit.py): records appended to one hash chain. A change is recorded
    by the ``audit`` argument of the write method that makes it (same transaction); an
    event that changes nothing else by ``audit_append``; an open for reading by
    ``audit_note`` (memory only), written by the next ``audit_flush``."""

    # Read from the hooks given at open (hooks.CatalogHooks): this node's name in the
    # records (``node``), and what is called after each ``audit_note`` (the noting thread).
    # Setting either replaces that field of the hooks: kept until the daemon gives its
    # hooks when it opens the catalog (issue 34).
    audit_node: str
    on_audit_note: Callable[[], None] | None

    def audit_append(self, records: AuditRecord | Sequence[AuditRecord]) -> None:
        ...

    def audit_note(self, record: AuditRecord) -> None:
        ...

    def audit_pending(self) -> int:
        ...

    def audit_flush(self) -> int:
        ...

    def audit_genesis(self) -> bytes:
        """The ``prev`` of record 1 (from the catalog's fs_id)."""
        ...

    def audit_head(self) -> AuditEntry | None:
        ...

    def audit_entries(self, since_seq: int = 0, since_ns: int | None = None,
                      limit: int | None = None, last: int | None = None) -> list[AuditEntry]:
        ...


class KeyCatalog(Protocol):
    """Wrapped namespace keys (catalog/keys.py; docs/governance.md): versions by key id,
    shredded ones kept as tombstones; ``keys_gen`` counts changes."""

    def namespace_keys(self, namespace: str | None = None) -> list[KeyRow]:
        ...

    def keys_gen(self) -> int:
        ...

    def ensure_namespace_key(self, namespace: str, wrap: Wrap) -> KeyRow | None:
        ...

    def rotate_namespace_key(self, namespace: str, wrap: Wrap) -> KeyRow:
        ...

    def rewrap_keys(self, rewrap: Callable[[KeyRow], tuple[bytes, str]]) -> int:
        ...

    def shred_namespace_keys(self, namespace: str) -> list[int]:
        ...


class Catalog(
    NamespaceCatalog, ContentsCatalog, ReplicaCatalog, UploadQueue, DeletionQueue,
    CheckpointCatalog, MetaCatalog, SessionCatalog, WantCatalog, MoveCatalog, QuotaCatalog,
    AuditCatalog, KeyCatalog, Protocol,
):
    """The whole catalog: what an engine implements."""

    path: Path  # SQLite: the file; PostgreSQL: the database's description (not a file)
    # How many transactions may run at once (SQLite 1; PostgreSQL its pool size): the
    # daemon sizes its catalog limiter by it.
    concurrency: int
    # Several nodes may use this catalog at once (PostgreSQL), each with its own local tiers.
    shared: bool

    @property
    def hooks(self) -> CatalogHooks:
        """What the engine calls back (``on_touch`` after every transaction that changed
        the namespace or file contents; ``on_audit_note``) and the node's name in audit
        records: given when the catalog is opened (engines.open_catalog's ``hooks``)."""
        ...

    # Read from ``hooks``. Setting it replaces that field of the hooks: kept until the
    # daemon gives its hooks when it opens the catalog (issue 34).
    on_touch: Callable[[], None] | None
