"""The catalog's roles over the file tree (protocols.py says what holds for all of them):
the namespace, file contents, checkpoint rows and meta."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from .audit import AuditRecord
from .quotas import Charge
from .rows import (
    Around,
    CheckpointRow,
    CheckpointState,
    ChunkRef,
    ExtentReplicas,
    Inode,
)


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
        open_for: str = "",
    ) -> Inode:
        """Create a file, directory, symlink or special file (FIFO, socket, device with
        ``rdev``) entry. EEXIST if the name is taken. ``audit``: recorded in the same
        transaction (AuditCatalog), as on every write method that takes it. ``around``
        (rows.Around): filled with the directory after the change (and its path).
        ``open_for``: a session id (shared catalog): the new inode is noted open for
        writing under it in the same transaction (SessionCatalog.note_open)."""
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

        A remote tier the snapshot names keeps the snapshot's replica rows; on a configured
        remote it does not name, every chunk the snapshot records on any remote is recorded
        (reads try each); local replicas and upload jobs are forgotten. A file naming a chunk no remote held when the
        snapshot was taken (its upload was still pending) cannot be recovered: it is
        removed. Returns (files kept, paths of files removed)."""
        ...

    def close(self) -> None:
        ...
