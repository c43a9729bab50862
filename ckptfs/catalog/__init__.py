"""The catalog: inodes, directory entries, file extents, chunks and their replicas, upload
jobs, the deletion queue, checkpoint rows and meta.

protocols.py is its surface (a Protocol per concern, ``protocols.Catalog`` the whole);
rows.py the rows every engine returns; sql.py the logic, once, in SQL both engines take;
sqlite.py the SQLite engine (a file in the state dir), postgres.py the PostgreSQL engine (a
database shared by nodes). ``Catalog`` here is the SQLite engine still (callers construct
it by that name); ``open_catalog`` is the factory to construct through (catalog.py).
durability.py is the one definition of "durable on the remote", read through the protocols
(no SQL: every engine shares it).
"""

from . import protocols
from .catalog import (
    Catalog,
    PostgresCatalog,
    SqlCatalog,
    SqliteCatalog,
    is_database_url,
    open_catalog,
    read_recorded_tiers,
)
from .recorded import recorded_tiers
from .rows import ROOT_INODE, CheckpointRow, CheckpointState, ChunkRef, Inode


def _implements(s: SqliteCatalog, p: PostgresCatalog) -> tuple[protocols.Catalog, protocols.Catalog]:
    return s, p  # mypy checks here that both engines implement every Protocol


__all__ = [
    "ROOT_INODE", "Catalog", "CheckpointRow", "CheckpointState", "ChunkRef", "Inode",
    "PostgresCatalog", "SqlCatalog", "SqliteCatalog", "is_database_url", "open_catalog",
    "protocols", "read_recorded_tiers", "recorded_tiers",
]
