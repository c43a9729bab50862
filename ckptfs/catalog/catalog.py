"""The catalog's engines by the names callers import: ``SqliteCatalog`` (sqlite.py, one
file in the state dir), ``PostgresCatalog`` (postgres.py, one database shared by nodes),
both the logic of sql.py behind the Protocols of protocols.py; ``open_catalog`` picks one.

``Catalog`` is the Protocol (protocols.Catalog): what every component is typed against;
an engine is constructed by its own name or through open_catalog().
"""

from __future__ import annotations

from pathlib import Path

from .postgres import PostgresCatalog
from .protocols import Catalog as CatalogProtocol
from .rows import (
    ROOT_INODE,
    Backlog,
    CheckpointRow,
    CheckpointState,
    ChunkRef,
    Deletion,
    DeletionBacklog,
    ExtentReplicas,
    Inode,
    UploadJob,
)
from .sql import SCHEMA_VERSION, SqlCatalog
from .sqlite import SqliteCatalog, read_recorded_tiers

__all__ = [
    "ROOT_INODE", "SCHEMA_VERSION", "Backlog", "Catalog", "CheckpointRow", "CheckpointState",
    "ChunkRef", "Deletion", "DeletionBacklog", "ExtentReplicas", "Inode", "PostgresCatalog",
    "SqlCatalog", "SqliteCatalog", "UploadJob", "is_database_url", "open_catalog",
    "read_recorded_tiers",
]

Catalog = CatalogProtocol


def is_database_url(where: str | Path) -> bool:
    """Whether ``where`` names a PostgreSQL database (a libpq URI) rather than a file."""
    return isinstance(where, str) and where.startswith(("postgresql://", "postgres://"))


def open_catalog(where: Path | str, readonly: bool = False, *, pool_size: int = 4) -> SqlCatalog:
    """The catalog at ``where``: a SQLite file (a path), or a PostgreSQL database (a
    ``postgresql://`` URI, with ``pool_size`` connections)."""
    if is_database_url(where):
        return PostgresCatalog(str(where), pool_size=pool_size, readonly=readonly)
    return SqliteCatalog(Path(where), readonly=readonly)
