"""The catalog's roles over nodes and governance (protocols.py says what holds for all of
them): node sessions and the cluster-wide lock, namespace quotas, the audit log and the
wrapped namespace keys."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from .audit import AuditEntry, AuditRecord
from .keys import KeyRow, Wrap
from .quotas import NamespaceUsage
from .rows import (
    Registered,
    SessionEnd,
    SessionRow,
)


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

    # Read from the hooks given at open (hooks.CatalogHooks), never set afterwards: this
    # node's name in the records (``node``), and what is called after each ``audit_note``
    # (in the noting thread).
    @property
    def audit_node(self) -> str:
        ...

    @property
    def on_audit_note(self) -> Callable[[], None] | None:
        ...

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
