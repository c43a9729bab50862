"""The catalog's engines by the names callers import: ``SqliteCatalog`` (sqlite.py, one
file in the state dir) and the logic of sql.py behind the Protocols of protocols.py;
``open_catalog`` picks an engine (engines.py; the PostgreSQL one, postgres.py, is imported
only for a ``postgresql://`` URI).

``Catalog`` is the Protocol (protocols.Catalog): what every component is typed against;
an engine is constructed by its own name or through open_catalog().
"""

from __future__ import annotations

from .engines import is_database_url, open_catalog
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
    "ChunkRef", "Deletion", "DeletionBacklog", "ExtentReplicas", "Inode", "SqlCatalog",
    "SqliteCatalog", "UploadJob", "is_database_url", "open_catalog", "read_recorded_tiers",
]

Catalog = CatalogProtocol
