"""The SQLite catalog: inodes, directory entries, file extents, chunks and their replicas."""

from .catalog import Catalog, ChunkRef, Inode

__all__ = ["Catalog", "ChunkRef", "Inode"]
