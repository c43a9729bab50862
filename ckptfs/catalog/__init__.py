"""The catalog: inodes, directory entries, file extents, chunks and their replicas, upload
jobs, the deletion queue, checkpoint rows and meta.

protocols.py is its surface (a Protocol per concern, ``protocols.Catalog`` the whole);
rows.py the rows every engine returns; sql.py the logic, once, in SQL both engines take
(assembled from a module per role over conn.py, which owns connections and transactions);
hooks.py what an engine calls back, given when it is opened; sqlite.py the SQLite engine (a file in the state dir), postgres.py the PostgreSQL engine (a
database shared by nodes). ``Catalog`` here is the Protocol; engines.py picks an engine
(``open_catalog``), and imports postgres.py (psycopg) only when one is a database.
durability.py is the one definition of "durable on the remote", read through the protocols
(no SQL: every engine shares it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import protocols
from .catalog import (
    Catalog,
    SqlCatalog,
    SqliteCatalog,
    is_database_url,
    open_catalog,
    read_recorded_tiers,
)
from .engines import postgres_engine
from .recorded import recorded_tiers
from .rows import ROOT_INODE, Around, CheckpointRow, CheckpointState, ChunkRef, Inode

if TYPE_CHECKING:
    from .postgres import PostgresCatalog

    def _implements(s: SqliteCatalog, p: PostgresCatalog) -> tuple[protocols.Catalog, protocols.Catalog]:
        return s, p  # mypy checks here that both engines implement every Protocol

else:

    def __getattr__(name: str) -> Any:
        # ``PostgresCatalog`` is loaded when first asked for (engines.postgres_engine).
        if name == "PostgresCatalog":
            return postgres_engine()
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ROOT_INODE", "Around", "Catalog", "CheckpointRow", "CheckpointState", "ChunkRef", "Inode",
    "PostgresCatalog", "SqlCatalog", "SqliteCatalog", "is_database_url", "open_catalog",
    "protocols", "read_recorded_tiers", "recorded_tiers",
]
