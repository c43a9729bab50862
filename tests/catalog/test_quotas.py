"""Namespace usage in the catalog (catalog/quotas.py), on both engines: counted in the
commit's transaction, refused past the quota with nothing of the version committed, freed
when the inode is dropped (here or by the last closer of a session), counted from the
files of an older catalog (the schema-5 migration) at the first count_namespaces."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import psycopg
import pytest

from tests.support.catalogs import Cat

from ckptfs.catalog import ROOT_INODE, ChunkRef, PostgresCatalog, SqliteCatalog
from ckptfs.catalog.catalog import SCHEMA_VERSION
from ckptfs.catalog.quotas import USAGE_MAX, Charge, NamespaceUsage
from ckptfs.errors import QuotaExceeded

R = ROOT_INODE
D = stat.S_IFDIR | 0o777
F = stat.S_IFREG | 0o644
CS = 16  # chunk size


def _ref(n: int, tag: int) -> ChunkRef:
    return ChunkRef(bytes([tag]) * 32, n, ("a:l",))


def _write(c: Cat, ino: int, size: int, charge: Charge | None, tag: int = 1) -> list[bytes]:
    """A version of ``size`` bytes (at most one chunk of CS)."""
    return c.commit_file(ino, size, 1, 1, CS, {0: _ref(size, tag)}, charge=charge)


def test_a_commit_past_the_quota_commits_nothing_and_a_rewrite_counts_its_new_size(cat: Cat) -> None:
    cat.count_namespaces([("/p", 20)])
    p = cat.create(R, b"p", D, 0, 0)
    f = cat.create(p.ino, b"f", F, 0, 0)
    ch = Charge("/p", 20)
    _write(cat, f.ino, 12, ch)
    assert ch.used == 12
    # 12 -> 16: a rewrite adds 4, not 16.
    _write(cat, f.ino, 16, ch, tag=2)
    assert ch.used == 16 == cat.namespace_used("/p")
    g = cat.create(p.ino, b"g", F, 0, 0)
    with pytest.raises(QuotaExceeded) as exc:
        _write(cat, g.ino, 5, Charge("/p", 20), tag=3)
    assert exc.value.errno == 122  # EDQUOT
    assert cat.get_inode(g.ino).size == 0 and cat.extents(g.ino) == {}
    assert not cat.has_chunk(bytes([3]) * 32)
    _write(cat, g.ino, 4, Charge("/p", 20), tag=3)  # exactly the quota
    assert cat.namespace_usage() == [NamespaceUsage("/p", 20, 2, 20)]
    # Shrinking is never refused, even past a quota lowered below the usage.
    _write(cat, f.ino, 10, Charge("/p", 5), tag=4)
    assert cat.namespace_used("/p") == 14
    # A commit without a charge (an unlinked file's) leaves its count alone: the drop
    # subtracts what was counted.
    cat.unlink(p.ino, b"f")
    _write(cat, f.ino, 3, None, tag=5)
    assert cat.namespace_used("/p") == 14
    cat.delete_inode(f.ino)
    assert cat.namespace_usage() == [NamespaceUsage("/p", 4, 1, 20)]


def test_a_usage_past_the_catalogs_integers_is_refused(cat: Cat) -> None:
    """Without a quota too: SQLite made such a sum an inexact float, PostgreSQL failed."""
    cat.count_namespaces([("/p", None)])
    p = cat.create(R, b"p", D, 0, 0)
    f, g = cat.create(p.ino, b"f", F, 0, 0), cat.create(p.ino, b"g", F, 0, 0)
    cat.commit_file(f.ino, USAGE_MAX - 5, 1, 1, CS, {}, charge=Charge("/p", None))
    with pytest.raises(QuotaExceeded):
        cat.commit_file(g.ino, 6, 1, 1, CS, {0: _ref(6, 1)}, charge=Charge("/p", None))
    assert cat.get_inode(g.ino).size == 0
    _write(cat, g.ino, 5, Charge("/p", None))
    assert cat.namespace_used("/p") == USAGE_MAX


def test_the_last_closer_of_a_session_frees_the_usage(cat: Cat) -> None:
    cat.count_namespaces([("/p", None)])
    p = cat.create(R, b"p", D, 0, 0)
    f = cat.create(p.ino, b"f", F, 0, 0)
    _write(cat, f.ino, 9, Charge("/p", None))
    sid = cat.register_session("n1", 60).sid
    cat.note_open(sid, f.ino, True)
    cat.unlink(p.ino, b"f")
    assert cat.delete_inode(f.ino) == [] and cat.namespace_used("/p") == 9  # still open
    assert cat.release_inode(sid, f.ino) is not None
    assert cat.namespace_usage() == [NamespaceUsage("/p", 0, 0, None)]


def _older(c: Cat) -> tuple[int, int]:
    """A namespace's files in a catalog made before quotas: two files, one hard-linked."""
    p = c.create(R, b"p", D, 0, 0)
    sub = c.create(p.ino, b"run", D, 0, 0)
    a = c.create(sub.ino, b"a", F, 0, 0)
    b = c.create(p.ino, b"b", F, 0, 0)
    out = c.create(R, b"out", F, 0, 0)
    _write(c, a.ino, 10, None)
    _write(c, b.ino, 7, None, tag=2)
    _write(c, out.ino, 15, None, tag=3)
    c.link(a.ino, p.ino, b"a2")
    return a.ino, b.ino


def _counted(c: Cat, a: int) -> None:
    assert c.count_namespaces([("/p", 100), ("/q", None)]) == ["/p", "/q"]
    assert c.namespace_usage() == [NamespaceUsage("/p", 17, 2, 100), NamespaceUsage("/q", 0, 0, None)]
    assert c.count_namespaces([("/p", 50), ("/q", None)]) == []  # counted once
    assert c.namespace_usage()[0] == NamespaceUsage("/p", 17, 2, 50)
    _write(c, a, 12, Charge("/p", 50), tag=4)
    assert c.namespace_used("/p") == 19


def test_a_version_5_sqlite_catalog_is_counted_at_its_first_count(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    c = SqliteCatalog(path)
    a, _ = _older(c)
    c.close()
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE ns_usage")
    conn.execute("DROP TABLE ns_files")
    conn.execute("UPDATE meta SET value='5' WHERE key='schema_version'")
    conn.commit()
    conn.close()
    ro = SqliteCatalog(path, readonly=True)  # status beside a daemon not upgraded yet
    try:
        assert ro.namespace_usage() == []
    finally:
        ro.close()
    c = SqliteCatalog(path)
    try:
        assert c.get_meta("schema_version") == str(SCHEMA_VERSION)
        _counted(c, a)
    finally:
        c.close()


def test_a_version_5_postgres_catalog_is_counted_at_its_first_count(pg_url: str) -> None:
    c = PostgresCatalog(pg_url, pool_size=1)
    a, _ = _older(c)
    c.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP TABLE ns_usage")
        conn.execute("DROP TABLE ns_files")
        conn.execute("UPDATE meta SET value='5' WHERE key='schema_version'")
    with pytest.raises(Exception, match="migration"):
        PostgresCatalog(pg_url, pool_size=1, readonly=True)
    c = PostgresCatalog(pg_url, pool_size=1)
    try:
        assert c.get_meta("schema_version") == str(SCHEMA_VERSION)
        _counted(c, a)
    finally:
        c.close()
