"""The namespace's SQL, once for every engine: inodes, directory entries and extended
attributes (protocols.NamespaceCatalog). What each method does is said on its Protocol;
comments here say how."""

from __future__ import annotations

import errno
import stat
import time
from collections.abc import Callable
from dataclasses import replace

from ..errors import (
    AlreadyExists,
    CkptfsError,
    InvalidArgument,
    IsADirectory,
    NoAttribute,
    NotADirectory,
    NotEmpty,
    NotFound,
    NotPermitted,
)
from .audit import AuditRecord, AuditSql
from .conn import Conn
from .rows import ROOT_INODE, Around, Inode
from .sessions import note_open_in
from .tree import (
    INODE_COLS,
    files_under,
    get_inode,
    inode_of,
    path_from,
    path_of,
    path_up,
    resolve,
)

__all__ = ["NamespaceSql"]

_INODE_COLS_I = ", ".join("i." + x.strip() for x in INODE_COLS.split(","))
_INODE_COLS_P = ", ".join("p." + x.strip() for x in INODE_COLS.split(","))
_N_INODE_COLS = len(INODE_COLS.split(","))


class _Paths:
    """Directory paths read in one transaction, each at most once (an audit record and
    the caller's ``Around`` need the same ones)."""

    __slots__ = ("c", "got")

    def __init__(self, c: Conn) -> None:
        self.c = c
        self.got: dict[int, str] = {}

    def of(self, ino: int) -> str:
        path = self.got.get(ino)
        if path is None:
            path = self.got[ino] = path_of(self.c, ino)
        return path

    def entry(self, parent: int, name: bytes) -> Callable[[], str]:
        """The path of entry ``name`` of ``parent``, when asked (for an audit record)."""
        return lambda: self.of(parent).rstrip("/") + "/" + name.decode(errors="surrogateescape")


def _tell(around: Around | None, paths: _Paths, dirs: dict[int, Inode],
          named: tuple[int, ...], moved: Inode | None = None) -> None:
    """Fill ``around`` (if any) with a change's directories after it and the paths of
    the directories it ``named``."""
    if around is None:
        return
    around.dirs = dirs
    around.moved = moved
    around.dir_paths = {d: paths.of(d) for d in named} if around.paths else {}


def _touched(pdir: Inode, now: int, nlink_delta: int = 0) -> Inode:
    """``pdir`` as ``_touch_dir`` leaves it (in the transaction that read it)."""
    return replace(pdir, mtime_ns=now, ctime_ns=now, nlink=pdir.nlink + nlink_delta)


class NamespaceSql(AuditSql):
    """The namespace methods of SqlCatalog. Helpers that read inside a transaction take
    its connection (``_dir_entry(c, ...)``, tree.py's ``get_inode(c, ...)``)."""

    def get_inode(self, ino: int) -> Inode:
        rows = self._query(f"SELECT {INODE_COLS} FROM inodes WHERE ino=?", (ino,))
        if not rows:
            raise NotFound(f"inode {ino}")
        return inode_of(rows[0])

    def _dir(self, c: Conn, ino: int) -> Inode:
        inode = get_inode(c, ino)
        if not inode.is_dir:
            raise NotADirectory(f"inode {ino}")
        return inode

    @staticmethod
    def _entry(c: Conn, parent: int, name: bytes) -> Inode | None:
        row = c.execute(
            f"SELECT {_INODE_COLS_I} FROM dentries d JOIN inodes i ON i.ino = d.ino "
            "WHERE d.parent=? AND d.name=?",
            (parent, name),
        ).fetchone()
        return None if row is None else inode_of(row)

    def _named(self, c: Conn, parent: int, name: bytes) -> tuple[Inode, Inode]:
        """Directory ``parent`` and the inode its entry ``name`` names; NotFound if none."""
        pdir, inode = self._dir_entry(c, parent, name)
        if inode is None:
            raise NotFound(name.decode(errors="replace"))
        return pdir, inode

    @staticmethod
    def _dir_entry(c: Conn, parent: int, name: bytes) -> tuple[Inode, Inode | None]:
        """Directory ``parent`` and the inode of its entry ``name`` (None: no such entry),
        in one statement; NotFound / NotADirectory for a parent that is none."""
        row = c.execute(
            f"SELECT {_INODE_COLS_P}, {_INODE_COLS_I} FROM inodes p LEFT JOIN dentries d "
            "ON d.parent = p.ino AND d.name = ? LEFT JOIN inodes i ON i.ino = d.ino WHERE p.ino = ?",
            (name, parent),
        ).fetchone()
        if row is None:
            raise NotFound(f"inode {parent}")
        pdir = inode_of(row[:_N_INODE_COLS])
        if not pdir.is_dir:
            raise NotADirectory(f"inode {parent}")
        entry = row[_N_INODE_COLS:]
        return pdir, None if entry[0] is None else inode_of(entry)

    def lookup(self, parent: int, name: bytes) -> Inode:
        # One statement: the parent's mode, and the entry's inode if there is one.
        rows = self._query(
            f"SELECT p.mode, {_INODE_COLS_I} FROM inodes p LEFT JOIN dentries d "
            "ON d.parent = p.ino AND d.name = ? LEFT JOIN inodes i ON i.ino = d.ino WHERE p.ino = ?",
            (name, parent),
        )
        if not rows:
            raise NotFound(f"inode {parent}")
        if not stat.S_ISDIR(int(rows[0][0])):
            raise NotADirectory(f"inode {parent}")
        if rows[0][1] is None:
            raise NotFound(name.decode(errors="replace"))
        return inode_of(rows[0][1:])

    @staticmethod
    def _touch_dir(c: Conn, ino: int, now: int, nlink_delta: int = 0) -> None:
        c.execute(
            "UPDATE inodes SET mtime_ns=?, ctime_ns=?, nlink=nlink+? WHERE ino=?",
            (now, now, nlink_delta, ino),
        )

    def _touch_dir_times(self, c: Conn, ino: int, now: int) -> None:
        """A directory's mtime and ctime after a file was added to it (its link count
        stays). After the commit on PostgreSQL (``_after_commit``): every create in a
        directory writes its row, and in the transaction concurrent creates (of all nodes)
        conflicted on it and ran again."""
        self._after_commit(c, "UPDATE inodes SET mtime_ns=?, ctime_ns=? WHERE ino=?",
                           (now, now, ino))

    def create(
        self, parent: int, name: bytes, mode: int, uid: int, gid: int, target: bytes | None = None,
        rdev: int = 0, *, audit: AuditRecord | None = None, around: Around | None = None,
        open_for: str = "",
    ) -> Inode:
        now = time.time_ns()
        is_dir = stat.S_ISDIR(mode)
        size = len(target) if target is not None else 0

        def body(c: Conn) -> Inode:
            paths = _Paths(c)
            pdir, taken = self._dir_entry(c, parent, name)
            if taken is not None:
                raise AlreadyExists(name.decode(errors="replace"))
            m, g = mode, gid
            if pdir.mode & stat.S_ISGID:
                # A setgid directory gives new entries its group, and subdirectories its setgid.
                g = pdir.gid
                if is_dir:
                    m |= stat.S_ISGID
            row = c.execute(
                "INSERT INTO inodes (mode, uid, gid, size, nlink, atime_ns, mtime_ns, ctime_ns, target,"
                f" rdev) VALUES (?,?,?,?,?,?,?,?,?,?) RETURNING {INODE_COLS}",
                (m, uid, g, size, 2 if is_dir else 1, now, now, now, target, rdev),
            ).fetchone()
            inode = inode_of(row)
            c.execute("INSERT INTO dentries (parent, name, ino) VALUES (?,?,?)", (parent, name, inode.ino))
            if open_for:  # the creator's open, noted in the same transaction
                note_open_in(c, open_for, inode.ino, True)
            if is_dir:  # its link count: in the transaction
                self._touch_dir(c, parent, now, 1)
            else:
                self._touch_dir_times(c, parent, now)
            self._audit_in(c, audit, paths.entry(parent, name), ino=inode.ino, mode=m)
            _tell(around, paths, {parent: _touched(pdir, now, 1 if is_dir else 0)}, (parent,))
            return inode

        return self._write(body, touch=True)

    def link(self, ino: int, parent: int, name: bytes) -> Inode:
        now = time.time_ns()

        def body(c: Conn) -> Inode:
            self._dir(c, parent)
            inode = get_inode(c, ino)
            if inode.is_dir:
                raise NotPermitted("hard links to directories are not allowed")
            if inode.nlink <= 0:
                # As Linux: no new name for a file whose last one went (another node's
                # kernel may still think it has one); its drop may be under way.
                raise NotFound(f"inode {ino} has no name left")
            if self._entry(c, parent, name) is not None:
                raise AlreadyExists(name.decode(errors="replace"))
            c.execute("INSERT INTO dentries (parent, name, ino) VALUES (?,?,?)", (parent, name, ino))
            c.execute("UPDATE inodes SET nlink=nlink+1, ctime_ns=? WHERE ino=?", (now, ino))
            self._touch_dir(c, parent, now)
            return get_inode(c, ino)

        return self._write(body, touch=True)

    def unlink(self, parent: int, name: bytes, *, audit: AuditRecord | None = None,
               around: Around | None = None) -> Inode:
        now = time.time_ns()

        def body(c: Conn) -> Inode:
            paths = _Paths(c)
            pdir, inode = self._named(c, parent, name)
            if inode.is_dir:
                raise IsADirectory(name.decode(errors="replace"))
            c.execute("DELETE FROM dentries WHERE parent=? AND name=?", (parent, name))
            c.execute("UPDATE inodes SET nlink=nlink-1, ctime_ns=? WHERE ino=?", (now, inode.ino))
            self._touch_dir(c, parent, now)
            self._audit_in(c, audit, paths.entry(parent, name), ino=inode.ino,
                           nlink=inode.nlink - 1)
            _tell(around, paths, {parent: _touched(pdir, now)}, (parent,))
            return replace(inode, nlink=inode.nlink - 1, ctime_ns=now)

        return self._write(body, touch=True)

    def rmdir(self, parent: int, name: bytes, *, audit: AuditRecord | None = None) -> Inode:
        now = time.time_ns()

        def body(c: Conn) -> Inode:
            paths = _Paths(c)
            _, inode = self._named(c, parent, name)
            if not inode.is_dir:
                raise NotADirectory(name.decode(errors="replace"))
            if c.execute("SELECT 1 FROM dentries WHERE parent=? LIMIT 1", (inode.ino,)).fetchone():
                raise NotEmpty(name.decode(errors="replace"))
            c.execute("DELETE FROM dentries WHERE parent=? AND name=?", (parent, name))
            c.execute("UPDATE inodes SET nlink=0, ctime_ns=? WHERE ino=?", (now, inode.ino))
            self._touch_dir(c, parent, now, -1)
            self._audit_in(c, audit, paths.entry(parent, name), ino=inode.ino)
            return replace(inode, nlink=0)

        return self._write(body, touch=True)

    @staticmethod
    def _is_ancestor(c: Conn, anc: int, ino: int) -> bool:
        """True if ``anc`` is ``ino`` or one of its ancestors (directories have one parent)."""
        while True:
            if ino == anc:
                return True
            if ino == ROOT_INODE:
                return False
            row = c.execute("SELECT parent FROM dentries WHERE ino=? LIMIT 1", (ino,)).fetchone()
            if row is None:
                return False
            ino = int(row[0])

    def rename(
        self, old_parent: int, old_name: bytes, new_parent: int, new_name: bytes, noreplace: bool,
        *, audit: AuditRecord | None = None, around: Around | None = None,
    ) -> Inode | None:
        """``around``: the directories after the rename (none if a directory moved or was
        replaced: their own rows changed too), the renamed inode after it, and with
        ``paths`` the paths of both directories."""
        now = time.time_ns()

        def body(c: Conn) -> Inode | None:
            paths = _Paths(c)
            old_dir, src = self._dir_entry(c, old_parent, old_name)
            new_dir, dst = self._dir_entry(c, new_parent, new_name)
            if src is None:
                raise NotFound(old_name.decode(errors="replace"))
            old_path = paths.entry(old_parent, old_name)() if audit is not None else ""
            if src.is_dir and self._is_ancestor(c, src.ino, new_parent):
                raise InvalidArgument("cannot move a directory into itself")
            replaced: Inode | None = None
            named = (old_parent, new_parent)
            if dst is not None:
                if noreplace:
                    raise AlreadyExists(new_name.decode(errors="replace"))
                if dst.ino == src.ino:
                    # Both names link the same inode: POSIX says do nothing.
                    _tell(around, paths, {old_parent: old_dir, new_parent: new_dir}, named, src)
                    return None
                if src.is_dir:
                    if not dst.is_dir:
                        raise NotADirectory(new_name.decode(errors="replace"))
                    if c.execute("SELECT 1 FROM dentries WHERE parent=? LIMIT 1", (dst.ino,)).fetchone():
                        raise NotEmpty(new_name.decode(errors="replace"))
                elif dst.is_dir:
                    raise IsADirectory(new_name.decode(errors="replace"))
                c.execute("DELETE FROM dentries WHERE parent=? AND name=?", (new_parent, new_name))
                new_nlink = 0 if dst.is_dir else dst.nlink - 1
                c.execute("UPDATE inodes SET nlink=?, ctime_ns=? WHERE ino=?", (new_nlink, now, dst.ino))
                if dst.is_dir:
                    self._touch_dir(c, new_parent, now, -1)
                replaced = replace(dst, nlink=new_nlink)
            c.execute(
                "UPDATE dentries SET parent=?, name=? WHERE parent=? AND name=?",
                (new_parent, new_name, old_parent, old_name),
            )
            c.execute("UPDATE inodes SET ctime_ns=? WHERE ino=?", (now, src.ino))
            moved_dir = src.is_dir and old_parent != new_parent
            self._touch_dir(c, old_parent, now, -1 if moved_dir else 0)
            if new_parent != old_parent:
                self._touch_dir(c, new_parent, now, 1 if moved_dir else 0)
            self._audit_in(c, audit, paths.entry(new_parent, new_name), ino=src.ino,
                           src=old_path, replaced=None if replaced is None else replaced.ino)
            dirs = {} if src.is_dir or (replaced is not None and replaced.is_dir) else {
                old_parent: _touched(old_dir, now), new_parent: _touched(new_dir, now)}
            _tell(around, paths, dirs, named, replace(src, ctime_ns=now))
            return replaced

        return self._write(body, touch=True)

    def setattr(
        self,
        ino: int,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        atime_ns: int | None = None,
        mtime_ns: int | None = None,
    ) -> Inode:
        now = time.time_ns()

        def body(c: Conn) -> Inode:
            inode = get_inode(c, ino)
            m = mode if mode is None else stat.S_IFMT(inode.mode) | stat.S_IMODE(mode)
            new = replace(
                inode,
                mode=inode.mode if m is None else m,
                uid=inode.uid if uid is None else uid,
                gid=inode.gid if gid is None else gid,
                atime_ns=inode.atime_ns if atime_ns is None else atime_ns,
                mtime_ns=inode.mtime_ns if mtime_ns is None else mtime_ns,
                ctime_ns=now,
            )
            c.execute(
                "UPDATE inodes SET mode=?, uid=?, gid=?, atime_ns=?, mtime_ns=?, ctime_ns=? WHERE ino=?",
                (new.mode, new.uid, new.gid, new.atime_ns, new.mtime_ns, new.ctime_ns, ino),
            )
            return new

        return self._write(body, touch=True)

    def readdir(self, parent: int, after_id: int, limit: int = 256) -> list[tuple[int, bytes, Inode]]:
        rows = self._query(
            f"SELECT d.id, d.name, {_INODE_COLS_I} FROM dentries d JOIN inodes i ON i.ino = d.ino "
            "WHERE d.parent=? AND d.id>? ORDER BY d.id LIMIT ?",
            (parent, after_id, limit),
        )
        return [(int(r[0]), bytes(r[1]), inode_of(r[2:])) for r in rows]

    def get_xattr(self, ino: int, name: bytes) -> bytes | None:
        rows = self._query("SELECT value FROM xattrs WHERE ino=? AND name=?", (ino, name))
        return bytes(rows[0][0]) if rows else None

    def list_xattrs(self, ino: int) -> list[bytes]:
        return [bytes(r[0]) for r in self._query("SELECT name FROM xattrs WHERE ino=? ORDER BY name", (ino,))]

    def xattr_inodes(self) -> set[int]:
        return {int(r[0]) for r in self._query("SELECT DISTINCT ino FROM xattrs")}

    def set_xattr(self, ino: int, name: bytes, value: bytes, *, create: bool = False,
                  replace_only: bool = False, total_max: int | None = None) -> Inode:
        now = time.time_ns()

        def body(c: Conn) -> Inode:
            inode = get_inode(c, ino)
            exists = c.execute("SELECT 1 FROM xattrs WHERE ino=? AND name=?", (ino, name)).fetchone()
            if create and exists:
                raise AlreadyExists(name.decode(errors="replace"))
            if replace_only and not exists:
                raise NoAttribute(name.decode(errors="replace"))
            if total_max is not None:
                # In the transaction: two setxattrs at once cannot both take the last room.
                others = c.execute("SELECT COALESCE(SUM(LENGTH(name) + LENGTH(value)), 0) "
                                   "FROM xattrs WHERE ino=? AND name<>?", (ino, name)).fetchone()
                total = int(others[0]) + len(name) + len(value)
                if total > total_max:
                    raise CkptfsError(f"inode {ino}: its xattrs would hold {total} bytes, more "
                                      f"than {total_max}", errno=errno.ENOSPC)
            c.execute("INSERT INTO xattrs VALUES (?, ?, ?) ON CONFLICT (ino, name) DO UPDATE SET "
                      "value=excluded.value", (ino, name, value))
            c.execute("UPDATE inodes SET ctime_ns=? WHERE ino=?", (now, ino))
            return replace(inode, ctime_ns=now)

        return self._write(body, touch=True)

    def remove_xattr(self, ino: int, name: bytes) -> Inode:
        now = time.time_ns()

        def body(c: Conn) -> Inode:
            inode = get_inode(c, ino)
            if not c.execute("DELETE FROM xattrs WHERE ino=? AND name=?", (ino, name)).rowcount:
                raise NoAttribute(name.decode(errors="replace"))
            c.execute("UPDATE inodes SET ctime_ns=? WHERE ino=?", (now, ino))
            return replace(inode, ctime_ns=now)

        return self._write(body, touch=True)

    def resolve(self, path: str) -> Inode | None:
        with self._reading() as c:
            return resolve(c, path)

    def list_names(self, ino: int) -> list[str]:
        with self._reading() as c:
            rows = c.execute("SELECT name FROM dentries WHERE parent=? ORDER BY id", (ino,)).fetchall()
        return [bytes(r[0]).decode(errors="surrogateescape") for r in rows]

    def files_under(self, root: str) -> list[Inode]:
        with self._reading() as c:
            return files_under(c, root)

    def unlinked_inodes(self) -> list[int]:
        return [int(r[0]) for r in self._query("SELECT ino FROM inodes WHERE nlink<=0")]

    def dangling_dentries(self) -> list[tuple[int, bytes, int]]:
        with self._reading() as c:
            return [
                (int(p), bytes(n), int(i))
                for p, n, i in c.execute(
                    "SELECT parent, name, ino FROM dentries d WHERE NOT EXISTS "
                    "(SELECT 1 FROM inodes i WHERE i.ino = d.ino)"
                )
            ]

    def path_of(self, ino: int) -> str:
        # One statement, so one snapshot without a read transaction around it.
        if ino == ROOT_INODE:
            return "/"
        return path_from(self._query(*path_up(ino)))
