"""The audit log of a shared catalog (issue 35, "Metadata on the shared catalog"; catalog/
audit.py): a change's record is a pending row of its own transaction, chained afterwards by
one node at a time, so audited changes of several nodes no longer conflict on the chain's
head; the chain they make verifies, and an edit of it is found. On a real PostgreSQL. Also:
a file create's directory times, written right after its COMMIT (postgres.py ``_commit``)."""

from __future__ import annotations

import stat
import threading
from collections.abc import Iterator

import psycopg
import pytest

from ckptfs.catalog import ROOT_INODE, PostgresCatalog
from ckptfs.catalog.audit import AuditRecord, verify_chain
from ckptfs.catalog.hooks import CatalogHooks
from ckptfs.catalog.rows import Around
from ckptfs.catalog.sql import Conn
from ckptfs.errors import AlreadyExists

R = ROOT_INODE
F = stat.S_IFREG | 0o644
D = stat.S_IFDIR | 0o755


@pytest.fixture
def two(pg_url: str) -> Iterator[tuple[PostgresCatalog, PostgresCatalog]]:
    """Two nodes' catalogs on one database, each naming its node in its records."""
    a = PostgresCatalog(pg_url, pool_size=2, hooks=CatalogHooks(node="a"))
    b = PostgresCatalog(pg_url, pool_size=2, hooks=CatalogHooks(node="b"))
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def _count(url: str, table: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


def test_two_nodes_recording_at_once_do_not_conflict_and_make_one_chain(
        two: tuple[PostgresCatalog, PostgresCatalog], pg_url: str) -> None:
    """Both transactions have their snapshots before either appends its record (a
    barrier): with the one head read in each transaction (before) the second to append
    ran again (a conflict on audit_log_pkey or a serialization failure); with pending
    records neither does, and the chain holds both."""
    a, b = two
    gate = threading.Barrier(2, timeout=30)
    first = {"a": True, "b": True}
    errors: list[BaseException] = []

    def append(cat: PostgresCatalog, node: str) -> None:
        def body(c: Conn) -> None:
            c.execute("SELECT value FROM meta WHERE key='fs_id'").fetchone()  # the snapshot
            if first[node]:  # the first run only: a rerun passes alone
                first[node] = False
                gate.wait()
            cat._audit_in(c, AuditRecord("event", path=f"/{node}", uid=1))

        try:
            cat._write(body)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=append, args=(cat, node)) for cat, node in ((a, "a"), (b, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert a.conflicts + b.conflicts == 0
    entries = a.audit_entries()
    assert [e.seq for e in entries] == [1, 2]
    assert sorted((e.node, e.path) for e in entries) == [("a", "/a"), ("b", "/b")]
    assert verify_chain(entries, a.audit_genesis()) == []
    assert _count(pg_url, "audit_pending") == 0


def test_a_record_is_pending_with_its_change_and_chained_at_the_next_read(
        two: tuple[PostgresCatalog, PostgresCatalog], pg_url: str) -> None:
    a, b = two
    f = a.create(R, b"f", F, 0, 0, audit=AuditRecord("create", uid=3))
    # Committed with the change, not chained yet: the log has no record of it.
    assert _count(pg_url, "audit_pending") == 1 and _count(pg_url, "audit_log") == 0
    # A failed change leaves no record.
    with pytest.raises(AlreadyExists):
        b.create(R, b"f", F, 0, 0, audit=AuditRecord("create", uid=4))
    assert _count(pg_url, "audit_pending") == 1
    # Any node's read chains it (here the other node's).
    head = b.audit_head()
    assert head is not None and (head.seq, head.node, head.action, head.path, head.uid) == (
        1, "a", "create", "/f", 3)
    assert _count(pg_url, "audit_pending") == 0
    assert f.ino == a.lookup(R, b"f").ino


def test_records_a_closed_node_left_pending_are_chained_by_another(
        two: tuple[PostgresCatalog, PostgresCatalog], pg_url: str) -> None:
    """A node that ends without chaining (a crash right after its commits) loses none of
    its records: the next flush of any node chains them after what was chained before."""
    a, b = two
    b.create(R, b"first", F, 0, 0, audit=AuditRecord("create"))
    assert [e.path for e in b.audit_entries()] == ["/first"]
    for i in range(3):
        a.create(R, f"a{i}".encode(), F, 0, 0, audit=AuditRecord("create"))
    a.close()
    assert _count(pg_url, "audit_pending") == 3
    b.audit_note(AuditRecord("open", path="/first"))
    assert b.audit_flush() == 1
    entries = b.audit_entries()
    assert [(e.seq, e.node, e.path) for e in entries] == [
        (1, "b", "/first"), (2, "a", "/a0"), (3, "a", "/a1"), (4, "a", "/a2"), (5, "b", "/first")]
    assert verify_chain(entries, b.audit_genesis()) == []


def test_an_edit_of_the_chained_records_is_found(
        two: tuple[PostgresCatalog, PostgresCatalog], pg_url: str) -> None:
    a, b = two
    for i in range(4):
        (a if i % 2 else b).create(R, f"f{i}".encode(), F, 0, 0, audit=AuditRecord("create"))
    entries = a.audit_entries()
    assert [e.seq for e in entries] == [1, 2, 3, 4]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DELETE FROM audit_log WHERE seq = 2")
        conn.execute("UPDATE audit_log SET path = '/elsewhere' WHERE seq = 3")
    problems = verify_chain(b.audit_entries(), b.audit_genesis())
    assert [(p.kind, p.seq) for p in problems] == [("missing", 2), ("edited", 3)]


def test_a_file_create_sets_its_directory_times_after_its_commit(
        two: tuple[PostgresCatalog, PostgresCatalog]) -> None:
    """The directory's mtime and ctime are written right after the COMMIT (not in the
    transaction): the catalog holds what the create told its caller, on every node."""
    a, b = two
    d = a.create(R, b"d", D, 0, 0)
    around = Around()
    f = b.create(d.ino, b"f", F, 0, 0, around=around)
    told = around.dirs[d.ino]
    assert told.mtime_ns == told.ctime_ns == f.mtime_ns > d.mtime_ns
    for cat in (a, b):
        got = cat.get_inode(d.ino)
        assert (got.mtime_ns, got.ctime_ns, got.nlink) == (told.mtime_ns, told.ctime_ns, 2)
    # A subdirectory's link count stays in the transaction.
    a.create(d.ino, b"sub", D, 0, 0)
    assert b.get_inode(d.ino).nlink == 3
