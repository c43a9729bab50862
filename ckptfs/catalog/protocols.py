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

The role Protocols are written in roles_files.py (namespace, contents, checkpoints, meta),
roles_chunks.py (replicas, upload queue, deletion queue, wants, moves) and roles_nodes.py
(sessions, quotas, audit, keys); callers import them from here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from .checks import ReplicaChecks
from .drills import DrillCatalog
from .hooks import CatalogHooks
from .roles_chunks import DeletionQueue, MoveCatalog, ReplicaCatalog, UploadQueue, WantCatalog
from .roles_files import CheckpointCatalog, ContentsCatalog, MetaCatalog, NamespaceCatalog
from .roles_nodes import AuditCatalog, ExclusiveLock, KeyCatalog, QuotaCatalog, SessionCatalog

__all__ = [
    "AuditCatalog", "Catalog", "CheckpointCatalog", "ContentsCatalog", "DeletionQueue",
    "DrillCatalog",
    "ExclusiveLock", "KeyCatalog", "MetaCatalog", "MoveCatalog", "NamespaceCatalog",
    "QuotaCatalog", "ReplicaCatalog", "ReplicaChecks", "SessionCatalog", "UploadQueue", "WantCatalog",
]


class Catalog(
    NamespaceCatalog, ContentsCatalog, ReplicaCatalog, UploadQueue, DeletionQueue,
    CheckpointCatalog, MetaCatalog, SessionCatalog, WantCatalog, MoveCatalog, QuotaCatalog,
    AuditCatalog, KeyCatalog, ReplicaChecks, DrillCatalog, Protocol,
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

    @property
    def on_touch(self) -> Callable[[], None] | None:
        """``hooks.on_touch``: read-only, given at open."""
        ...
