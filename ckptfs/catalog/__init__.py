"""The catalog: inodes, directory entries, file extents, chunks and their replicas, upload
jobs, the deletion queue, checkpoint rows and meta.

protocols.py is its surface (a Protocol per concern, ``protocols.Catalog`` the whole);
rows.py the rows every engine returns; catalog.py the SQLite engine. ``Catalog`` here is the
SQLite engine still (callers construct it by that name); ``open_catalog`` is the factory to
construct through. durability.py is the one definition of "durable on the remote", read
through the protocols (no SQL: every engine shares it).
"""

from . import protocols
from .catalog import Catalog, SqliteCatalog, open_catalog, read_recorded_tiers
from .recorded import recorded_tiers
from .rows import ROOT_INODE, CheckpointRow, CheckpointState, ChunkRef, Inode


def _implements(c: SqliteCatalog) -> protocols.Catalog:
    return c  # mypy checks here that the SQLite engine implements every Protocol


__all__ = [
    "ROOT_INODE", "Catalog", "CheckpointRow", "CheckpointState", "ChunkRef", "Inode",
    "SqliteCatalog", "open_catalog", "protocols", "read_recorded_tiers", "recorded_tiers",
]
