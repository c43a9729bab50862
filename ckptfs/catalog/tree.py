"""Reads of the directory tree inside a caller's transaction (its connection, never the
engine's, which may be another transaction): an inode's row, its path, the inode at a
path, the files under one. Every role's SQL that names an inode by path uses these
(namespace.py, contents.py, checkpoint_rows.py, quotas.py, sessions.py, audit.py)."""

from __future__ import annotations

import stat
from collections.abc import Sequence
from typing import Any

from ..errors import CkptfsError, NotFound
from ..names import path_bytes
from .conn import Conn
from .rows import ROOT_INODE, Inode

__all__ = ["INODE_COLS", "files_under", "get_inode", "inode_of", "path_from", "path_of",
           "path_up", "resolve"]

INODE_COLS = "ino, mode, uid, gid, size, nlink, atime_ns, mtime_ns, ctime_ns, target, rdev"

# A path from an inode up to the root: one row (parent, name, depth) per level, the
# inode's own name first. A directory has one name; a file with several links takes one.
_MAX_DEPTH = 4096
_PATH_UP = (
    "WITH RECURSIVE up(parent, name, depth) AS ("
    "SELECT * FROM (SELECT parent, name, 1 FROM dentries WHERE ino=? LIMIT 1) AS leaf "
    "UNION ALL SELECT d.parent, d.name, up.depth + 1 FROM up JOIN dentries d ON d.ino = up.parent "
    "WHERE up.parent != ? AND up.depth < ?) "
    "SELECT parent, name FROM up ORDER BY depth"
)


def path_up(ino: int) -> tuple[str, tuple[int, int, int]]:
    """The statement (and its parameters) whose rows ``path_from`` spells as ``ino``'s path."""
    return _PATH_UP, (ino, ROOT_INODE, _MAX_DEPTH)


def path_from(rows: Sequence[Any]) -> str:
    """The path _PATH_UP's rows spell (``<unlinked>/...`` if they do not reach the root)."""
    parts = [bytes(r[1]).decode(errors="surrogateescape") for r in reversed(rows)]
    if (not rows or int(rows[-1][0]) != ROOT_INODE) and len(rows) < _MAX_DEPTH:
        return "<unlinked>/" + "/".join(parts)
    return "/" + "/".join(parts)


def inode_of(row: tuple[object, ...]) -> Inode:
    return Inode(*row)  # type: ignore[arg-type]


def get_inode(c: Conn, ino: int) -> Inode:
    row = c.execute(f"SELECT {INODE_COLS} FROM inodes WHERE ino=?", (ino,)).fetchone()
    if row is None:
        raise NotFound(f"inode {ino}")
    return inode_of(row)


def path_of(c: Conn, ino: int) -> str:
    """The path of ``ino`` (one of its names if it has several), in one statement
    whatever its depth; ``<unlinked>/...`` from where the chain of names ends."""
    if ino == ROOT_INODE:
        return "/"
    return path_from(c.execute(*path_up(ino)).fetchall())


def resolve(c: Conn, path: str) -> Inode | None:
    ino = ROOT_INODE
    for part in [p for p in path.split("/") if p]:
        row = c.execute(
            "SELECT ino FROM dentries WHERE parent=? AND name=?", (ino, path_bytes(part))
        ).fetchone()
        if row is None:
            return None
        ino = int(row[0])
    try:
        return get_inode(c, ino)
    except CkptfsError:
        return None


def files_under(c: Conn, root: str) -> list[Inode]:
    top = resolve(c, root)
    out: list[Inode] = []
    stack = [] if top is None else [top]
    while stack:
        inode = stack.pop()
        if stat.S_ISDIR(inode.mode):
            for r in c.execute("SELECT ino FROM dentries WHERE parent=?", (inode.ino,)).fetchall():
                stack.append(get_inode(c, int(r[0])))
        elif stat.S_ISREG(inode.mode):
            out.append(inode)
    return out
