"""Namespace usage and quotas (issue 15; docs/governance.md "Quotas"): the SQL, once for
every engine.

A namespace's usage is the logical size (st_size) of its regular files: a row of
``ns_usage`` per namespace path, changed in the transaction that changes a counted size,
so nodes sharing a catalog count together (PostgreSQL SERIALIZABLE: two commits that
change one row conflict, the second runs again and sees the first):

* a file's commit (``commit_file`` with a ``Charge``) adds its new size minus the size
  last counted, and refuses (``QuotaExceeded``, EDQUOT; the transaction rolls back, so
  nothing of the version is committed) a growth that takes the namespace past its quota;
* the drop of an inode (its last name and its last open handle gone: ``delete_inode``, the
  sessions' last-closer drop, a restore that lost it) subtracts its size.

``ns_files`` says which namespace each counted file is charged to (rows only for files in
a namespace). A namespace is counted from the files under its path the first time a mount
declares it (``count_namespaces``): an existing state dir gets its usage at its first
mount with the namespace, and a file charged to another namespace (a changed config) moves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import QuotaExceeded
from .conn import Conn, SqlBase
from .tree import files_under

__all__ = ["QUOTAS_DDL", "Charge", "NamespaceUsage", "QuotasSql", "charge_commit",
           "uncharge_inode"]

# A namespace's usage is one of the catalog's signed 64-bit integers: a growth past it is
# refused like a quota (SQLite would turn the sum into an inexact float, PostgreSQL fail).
USAGE_MAX = 2**63 - 1

QUOTAS_DDL = """
-- Usage of each [[namespace]] (catalog/quotas.py): the st_size of its regular files, and
-- its quota as the last mount declaring it configured it (NULL: none), for status.
CREATE TABLE IF NOT EXISTS ns_usage (
    ns    TEXT PRIMARY KEY,
    bytes INTEGER NOT NULL DEFAULT 0,
    files INTEGER NOT NULL DEFAULT 0,
    quota INTEGER
);
-- The namespace each counted file is charged to, and the bytes charged (its size at its
-- last commit counted there), for files of namespaces only.
CREATE TABLE IF NOT EXISTS ns_files (
    ino   INTEGER PRIMARY KEY,
    ns    TEXT NOT NULL,
    bytes INTEGER NOT NULL
);
"""


@dataclass
class Charge:
    """What a file's commit counts against: namespace ``ns`` with ``quota`` (None: no cap).
    The transaction sets ``used``: the namespace's usage after the commit."""

    ns: str
    quota: int | None
    used: int | None = None


@dataclass(frozen=True)
class NamespaceUsage:
    """A row of ``ns_usage``."""

    ns: str
    bytes: int
    files: int
    quota: int | None


def _add(c: Conn, ns: str, nbytes: int, files: int) -> int:
    """Add to a namespace's counters; its usage after."""
    row = c.execute(
        "INSERT INTO ns_usage (ns, bytes, files) VALUES (?, ?, ?) ON CONFLICT (ns) DO UPDATE "
        "SET bytes=ns_usage.bytes+excluded.bytes, files=ns_usage.files+excluded.files "
        "RETURNING bytes", (ns, nbytes, files),
    ).fetchone()
    return int(row[0])


def _used(c: Conn, ns: str) -> int:
    row = c.execute("SELECT bytes FROM ns_usage WHERE ns=?", (ns,)).fetchone()
    return 0 if row is None else int(row[0])


def charge_commit(c: Conn, ino: int, size: int, charge: Charge) -> None:
    """In a file's commit, before its size is written: count ``size`` instead of the size
    last counted (a rewrite counts its new size, not old + new). QuotaExceeded if the
    growth takes the namespace past its quota."""
    row = c.execute(
        "SELECT n.ns, n.bytes FROM inodes i LEFT JOIN ns_files n ON n.ino = i.ino WHERE i.ino=?",
        (ino,),
    ).fetchone()
    if row is None:
        return  # gone: commit_file's update changes nothing either
    old_ns, old_bytes = row[0], 0 if row[1] is None else int(row[1])
    if old_ns is not None and old_ns != charge.ns:
        _add(c, str(old_ns), -old_bytes, -1)  # charged elsewhere (the config changed): move
        old_ns, old_bytes = None, 0
    delta = size - old_bytes
    used = _used(c, charge.ns)
    if delta > 0 and charge.quota is not None and used + delta > charge.quota:
        raise QuotaExceeded(
            f"namespace {charge.ns}: {used} of {charge.quota} bytes used, this version "
            f"needs {delta} more"
        )
    if delta > 0 and used + delta > USAGE_MAX:
        raise QuotaExceeded(
            f"namespace {charge.ns}: {used} bytes used, this version needs {delta} more: "
            f"past the {USAGE_MAX} bytes a namespace's usage can count"
        )
    c.execute("INSERT INTO ns_files (ino, ns, bytes) VALUES (?, ?, ?) ON CONFLICT (ino) DO "
              "UPDATE SET ns=excluded.ns, bytes=excluded.bytes", (ino, charge.ns, size))
    charge.used = _add(c, charge.ns, delta, 1 if old_ns is None else 0)


def uncharge_inode(c: Conn, ino: int) -> None:
    """In the transaction that drops inode ``ino`` (before its row goes): its namespace
    no longer counts its size."""
    row = c.execute("SELECT ns, bytes FROM ns_files WHERE ino=?", (ino,)).fetchone()
    if row is None:
        return
    _add(c, str(row[0]), -int(row[1]), -1)
    c.execute("DELETE FROM ns_files WHERE ino=?", (ino,))


class QuotasSql(SqlBase):
    """The usage methods of SqlCatalog."""

    def count_namespaces(self, namespaces: Sequence[tuple[str, int | None]]) -> list[str]:
        """Record each namespace's (path, quota); one not counted before is counted now
        from the regular files under its path. Returns the paths counted now."""
        todo = list(namespaces)

        def body(c: Conn) -> list[str]:
            counted = []
            for ns, quota in todo:
                # Two nodes mounting at once: one inserts and counts, the other updates.
                if c.execute("INSERT INTO ns_usage (ns, bytes, files, quota) VALUES (?, 0, 0, ?) "
                             "ON CONFLICT (ns) DO NOTHING RETURNING ns", (ns, quota)).fetchone() is None:
                    c.execute("UPDATE ns_usage SET quota=? WHERE ns=?", (quota, ns))
                    continue
                seen: set[int] = set()
                for inode in files_under(c, ns):
                    if inode.ino in seen:
                        continue  # two names of one file: counted once
                    seen.add(inode.ino)
                    charge_commit(c, inode.ino, inode.size, Charge(ns, None))
                counted.append(ns)
            return counted

        return self._write(body)

    def namespace_usage(self) -> list[NamespaceUsage]:
        """Every namespace counted so far, by path (empty for a catalog of an older
        schema opened read-only)."""
        with self._reading() as c:
            try:
                rows = c.execute(
                    "SELECT ns, bytes, files, quota FROM ns_usage ORDER BY ns").fetchall()
            except self._missing_table:
                return []
        return [NamespaceUsage(str(n), int(b), int(f), None if q is None else int(q))
                for n, b, f, q in rows]

    def namespace_used(self, ns: str) -> int:
        """One namespace's usage now (0 if not counted)."""
        with self._reading() as c:
            return _used(c, ns)
