"""The catalog's logic, once for every SQL engine: ``SqlCatalog``, assembled from one
module per role, each over conn.py (connections, cursors, transactions):

=====================  ====================================================================
namespace.py           inodes, directory entries, extended attributes (NamespaceCatalog)
contents.py            extents, chunk rows, the commit of a file (ContentsCatalog)
replicas.py            replica rows, local eviction (ReplicaCatalog)
uploads.py             upload jobs (UploadQueue)
deletion_queue.py      the deletion queue (DeletionQueue); claims.py the claims' owners,
                       deletion_events.py what other nodes hear of it
checkpoint_rows.py     checkpoint rows (CheckpointCatalog)
meta.py                meta, sync, a restored snapshot (MetaCatalog)
sessions.py            node sessions, open handles (SessionCatalog)
wants.py, moves.py     wants (WantCatalog), moves (MoveCatalog)
quotas.py, audit.py    namespace usage (QuotaCatalog), the audit log (AuditCatalog)
keys.py                wrapped namespace keys (KeyCatalog)
drills.py              restore drills' records (DrillCatalog)
=====================  ====================================================================

tree.py reads the directory tree inside a transaction (an inode, its path); schema.py is
the schema every engine stores. No role's module imports this one: each stands on conn.py
and the helpers below it.

What each public method does is said once, on its Protocol (protocols.py, where a caller's
type leads); comments in the role modules say how. Every public method is one transaction
(conn.py: ``_write``, ``_reading``, ``_query``). Helpers that read inside a transaction
take its connection (``get_inode(c, ...)``, ``path_of(c, ...)``): never the engine's,
which may be another transaction.

The SQL is what both SQLite (3.35 and later) and PostgreSQL accept: ``INSERT ... ON
CONFLICT``, ``RETURNING``, ``count(*) FILTER (WHERE ...)``, ``?`` placeholders. What an
engine translates or provides (sqlite.py, postgres.py):

* placeholders (PostgreSQL's ``%s``) and ``group_concat`` (PostgreSQL's ``string_agg``):
  ``postgres.translate``, once per statement text;
* the DDL (``schema.SCHEMA`` is SQLite's; PostgreSQL's is translated from it: BIGINT,
  BYTEA, identity columns), its creation and migration;
* transactions, connections, retries and the mapping of its errors;
* ``backup_bytes``: the snapshot stored on the remotes, always a SQLite catalog file.

Inode numbers, ``dentries.id`` (readdir cookies, in insertion order) and checkpoint ids come
from the engine's sequence and are never reused: the kernel may still cache an old inode
number, the metrics remember checkpoint ids.
"""

from __future__ import annotations

from .audit import AuditSql
from .checkpoint_rows import CheckpointSql
from .checks import ReplicaCheckSql
from .claims import ClaimsSql
from .conn import Conn, Cursor
from .contents import ContentsSql
from .deletion_queue import CLAIM_LEASE_NS, DeletionQueueSql
from .drills import DrillsSql
from .keys import KeysSql
from .meta import MetaSql
from .moves import MovesSql
from .namespace import NamespaceSql
from .quotas import QuotasSql
from .replicas import ReplicaSql
from .rows import ROOT_INODE
from .schema import (
    CHECKPOINT_STATES,
    MARK_CHANGED,
    SCHEMA,
    SCHEMA_VERSION,
    SEQUENCES,
    TABLES,
    checkpoints_ddl,
    init_rows,
    newer_schema,
)
from .sessions import SessionsSql
from .tree import INODE_COLS
from .uploads import UploadQueueSql
from .wants import WantsSql

# The names callers imported from here before the split (issue 34) stay importable.
__all__ = [
    "CHECKPOINT_STATES", "CLAIM_LEASE_NS", "INODE_COLS", "MARK_CHANGED", "ROOT_INODE", "SCHEMA",
    "SCHEMA_VERSION", "SEQUENCES", "TABLES", "Conn", "Cursor", "SqlCatalog", "checkpoints_ddl",
    "init_rows", "newer_schema",
]


class SqlCatalog(NamespaceSql, ContentsSql, ReplicaSql, UploadQueueSql, DeletionQueueSql,
                 CheckpointSql, MetaSql, SessionsSql, WantsSql, MovesSql, ClaimsSql, QuotasSql,
                 DrillsSql, AuditSql, KeysSql, ReplicaCheckSql):
    """The catalog on an engine (sqlite.py, postgres.py), which provides ``_transaction``,
    ``_reading``, ``_query``, ``backup_bytes`` and ``close`` (conn.SqlBase)."""
