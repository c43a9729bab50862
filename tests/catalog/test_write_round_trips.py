"""What a write transaction costs and keeps (issue 35, "Metadata on the shared catalog"): a
create notes its open-handle row in its own transaction (both engines), so on PostgreSQL a
create is one transaction, not two; a failed statement rolls back the whole transaction and
the connection keeps working. What PostgreSQL sends for a create, a commit and a release is
pinned; a commit's rows are the same on both engines."""

from __future__ import annotations

import logging
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from ckptfs.catalog import PostgresCatalog
from ckptfs.catalog.audit import AuditRecord
from ckptfs.catalog.engines import open_catalog
from ckptfs.catalog.protocols import Catalog
from ckptfs.catalog.rows import ROOT_INODE, ChunkRef
from ckptfs.catalog.sql import Conn
from ckptfs.errors import AlreadyExists

FILE = stat.S_IFREG | 0o644


@pytest.fixture(params=["sqlite", "postgresql"])
def catalog(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Catalog]:
    where: Path | str = tmp_path / "catalog.sqlite"
    if request.param == "postgresql":
        where = str(request.getfixturevalue("pg_url"))
    c = open_catalog(where)
    try:
        yield c
    finally:
        c.close()


def test_a_create_notes_its_open_in_the_same_transaction(catalog: Catalog) -> None:
    sid = catalog.register_session("n1", 60).sid
    f = catalog.create(ROOT_INODE, b"f", FILE, 0, 0, open_for=sid)
    assert catalog.open_inodes() == {f.ino}
    assert catalog.open_writer_paths() == ["/f"]  # noted for writing
    # The name was taken: nothing created, nothing noted.
    with pytest.raises(AlreadyExists):
        catalog.create(ROOT_INODE, b"f", FILE, 0, 0, open_for=sid)
    assert catalog.open_inodes() == {f.ino}
    # Without a session id nothing is noted (one node).
    g = catalog.create(ROOT_INODE, b"g", FILE, 0, 0)
    assert catalog.open_inodes() == {f.ino}
    # A session that ended notes nothing (its node notes the inode anew under its next one).
    catalog.close_session(sid)
    h = catalog.create(ROOT_INODE, b"h", FILE, 0, 0, open_for=sid)
    assert catalog.open_inodes() == set()
    assert {catalog.lookup(ROOT_INODE, n).ino for n in (b"f", b"g", b"h")} == {f.ino, g.ino, h.ino}
    # The release of the creator's handle works on the row the create noted.
    sid2 = catalog.register_session("n2", 60).sid
    k = catalog.create(ROOT_INODE, b"k", FILE, 0, 0, open_for=sid2)
    catalog.unlink(ROOT_INODE, b"k")
    assert catalog.release_inode(sid2, k.ino) == []  # the last closer dropped it
    assert catalog.open_inodes() == set()


def test_a_create_noted_open_is_one_transaction_of_a_few_round_trips(pg_url: str) -> None:
    """Before: the create (BEGIN, 6 statements, COMMIT, the change mark: 9 round trips) and
    the open's note (BEGIN, 2 statements, COMMIT: 4) were two transactions, 13 round trips.
    Then one: BEGIN, the parent's entry, the new inode, the dentry, the open row (the
    inode's existence is not asked again), the parent's times, the audit chain's head, the
    audit row, COMMIT, the change mark: 10. Now 7: the audit record is a pending row (no
    head read: chained later, audit.py), and the parent's times and the change mark go
    with the COMMIT (postgres.py ``_commit``)."""
    cat = PostgresCatalog(pg_url, pool_size=1)
    try:
        sid = cat.register_session("n1", 60).sid
        cat.create(ROOT_INODE, b"warm", FILE, 0, 0, audit=AuditRecord("create"), open_for=sid)
        n = cat.counts
        before = (n.transactions, n.statements, n.round_trips)
        f = cat.create(ROOT_INODE, b"f", FILE, 0, 0, audit=AuditRecord("create", uid=7),
                       open_for=sid)
        transactions, statements, round_trips = (
            a - b for a, b in zip((n.transactions, n.statements, n.round_trips), before, strict=True))
        assert transactions == 1
        assert statements == 5  # entry, inode, dentry, open row, pending audit row
        assert round_trips <= 7
        # The same rows as two transactions made: the open row, the audit record.
        assert cat.open_inodes() == {cat.lookup(ROOT_INODE, b"warm").ino, f.ino}
        last = cat.audit_head()
        assert last is not None and (last.action, last.path, last.uid) == ("create", "/f", 7)
    finally:
        cat.close()


def _insert_then_fail(c: Conn) -> None:
    c.execute("INSERT INTO meta VALUES ('half', '1')")  # never read: pipelined
    c.execute("INSERT INTO meta VALUES ('schema_version', '0')")  # the key exists: fails unread


def test_a_statement_that_fails_unread_rolls_back_the_whole_transaction(pg_url: str) -> None:
    """Nothing of the transaction stays; the one pooled connection keeps working after
    each failure (past psycopg's preparation of a statement on its 5th use)."""
    cat = PostgresCatalog(pg_url, pool_size=1)
    try:
        for i in range(12):
            with pytest.raises(psycopg.errors.UniqueViolation):
                cat._write(_insert_then_fail)
            with cat._reading() as c:
                assert c.execute("SELECT value FROM meta WHERE key='half'").fetchone() is None
            cat.create(ROOT_INODE, f"f{i}".encode(), FILE, 0, 0, audit=AuditRecord("create"))
        assert len(cat.readdir(ROOT_INODE, 0)) == 12
        assert len(cat.audit_entries()) == 12
    finally:
        cat.close()



def _read_after_failure(c: Conn) -> None:
    _insert_then_fail(c)
    c.execute("SELECT 1").fetchone()  # the failure comes with this read, inside the body


def test_a_transaction_that_fails_inside_its_body_logs_nothing_of_psycopg(
        pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A body that fails (a statement's error, or its own error such as EEXIST): psycopg
    has nothing to warn about (the daemon's log stays clean: its tests fail on warnings)."""
    cat = PostgresCatalog(pg_url, pool_size=1)
    try:
        cat.create(ROOT_INODE, b"f", FILE, 0, 0)
        with caplog.at_level(logging.WARNING, logger="psycopg"):
            with pytest.raises(psycopg.errors.UniqueViolation):
                cat._write(_read_after_failure)
            with pytest.raises(AlreadyExists):
                cat.create(ROOT_INODE, b"f", FILE, 0, 0, audit=AuditRecord("create"))
        assert [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")] == []
        assert [n for _, n, _ in cat.readdir(ROOT_INODE, 0)] == [b"f"]
    finally:
        cat.close()


A, B, C = b"\x0a" * 32, b"\x0b" * 32, b"\x0c" * 32


def test_a_commit_writes_the_same_rows_with_its_chunks_in_one_statement(catalog: Catalog) -> None:
    """PostgreSQL writes a chunk held on one tier and queued to one other in one statement
    (postgres.py ``_put_extents``), any other chunk statement by statement: both give the
    rows SQLite's statements give, the cancellation of an unclaimed deletion included."""
    assert catalog.queue_deletions([(A, "s3"), (C, "s3")]) == 2
    f = catalog.create(ROOT_INODE, b"f", FILE, 0, 0)
    catalog.commit_file(f.ino, 20, 1, 1, 10, {0: ChunkRef(A, 10, ("l",)), 1: ChunkRef(B, 10, ("l",))},
                        uploads={A: ["s3"]})
    assert catalog.extents(f.ino) == {0: ChunkRef(A, 10, ("l",)), 1: ChunkRef(B, 10, ("l",))}
    assert catalog.upload_job_pairs() == {(A, "s3")}
    assert catalog.deletion_keys("s3") == {C}  # A's row cancelled by its job
    # Two tiers, and queued to one of them (which holds it: no job there): the other way.
    g = catalog.create(ROOT_INODE, b"g", FILE, 0, 0)
    catalog.commit_file(g.ino, 10, 1, 1, 10, {0: ChunkRef(C, 10, ("l", "m"))},
                        uploads={C: ["s3", "l"]})
    assert catalog.extents(g.ino) == {0: ChunkRef(C, 10, ("l", "m"))}
    assert catalog.upload_job_pairs() == {(A, "s3"), (C, "s3")}
    assert catalog.deletion_keys("s3") == set()
    # Rewritten: the same chunk again, and a tier that already holds a valid copy.
    catalog.commit_file(f.ino, 10, 2, 2, 10, {0: ChunkRef(B, 10, ("l",))}, uploads={B: ["l"]})
    assert catalog.extents(f.ino) == {0: ChunkRef(B, 10, ("l",))}
    assert catalog.upload_job_pairs() == {(A, "s3"), (C, "s3")}


def test_a_commit_of_one_queued_chunk_is_three_statements(pg_url: str) -> None:
    """Before: the old extents, the chunk, its replica, the extent, the upload job, the
    deletion it cancels, the inode: 7 statements. Now the chunk's five are one."""
    cat = PostgresCatalog(pg_url, pool_size=1)
    try:
        f = cat.create(ROOT_INODE, b"f", FILE, 0, 0)
        before = cat.counts.statements
        cat.commit_file(f.ino, 10, 1, 1, 10, {0: ChunkRef(A, 10, ("n:t0",))}, uploads={A: ["s3"]})
        assert cat.counts.statements - before == 3
        assert cat.extents(f.ino) == {0: ChunkRef(A, 10, ("n:t0",))}
        assert cat.upload_job_pairs() == {(A, "s3")}
    finally:
        cat.close()


def test_a_release_of_a_named_file_is_one_statement(pg_url: str) -> None:
    """Before: the open row's DELETE, then the inode's link count: 2 statements. Now the
    DELETE returns the count; an unlinked file is still dropped by its last release."""
    cat = PostgresCatalog(pg_url, pool_size=1)
    try:
        sid = cat.register_session("n1", 60).sid
        f = cat.create(ROOT_INODE, b"f", FILE, 0, 0, open_for=sid)
        before = cat.counts.statements
        assert cat.release_inode(sid, f.ino) is None
        assert cat.counts.statements - before == 1
        g = cat.create(ROOT_INODE, b"g", FILE, 0, 0, open_for=sid)
        cat.unlink(ROOT_INODE, b"g")
        assert cat.release_inode(sid, g.ino) == []  # dropped by its last release
        assert cat.open_inodes() == set()
    finally:
        cat.close()


@pytest.mark.allow_log_warnings("not written: division by zero")
def test_statements_after_a_commit_run_once_per_commit_and_a_failure_of_theirs_keeps_it(
        pg_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """``_after_commit`` statements go with the COMMIT (postgres.py ``_commit``): a
    transaction that conflicts (two write skews meeting at a barrier: one of them runs
    again) runs them only for the run that committed; one that fails after the COMMIT
    loses only itself, with a warning."""
    a, b = PostgresCatalog(pg_url, pool_size=1), PostgresCatalog(pg_url, pool_size=1)
    try:
        a._write(lambda c: c.execute("INSERT INTO meta VALUES ('x', '0'), ('y', '0'), ('runs', '0')"))
        gate = threading.Barrier(2, timeout=30)
        first = {"x": True, "y": True}

        def skew(cat: PostgresCatalog, read: str, write: str) -> None:
            def body(c: Conn) -> None:
                c.execute("SELECT value FROM meta WHERE key=?", (read,)).fetchone()
                if first[read]:
                    first[read] = False
                    gate.wait()
                c.execute("UPDATE meta SET value='1' WHERE key=?", (write,))
                cat._after_commit(c, "UPDATE meta SET value=CAST(CAST(value AS BIGINT) + ? AS TEXT) "
                                  "WHERE key='runs'", (1,))

            cat._write(body)

        threads = [threading.Thread(target=skew, args=args)
                   for args in ((a, "x", "y"), (b, "y", "x"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert a.conflicts + b.conflicts >= 1
        assert a.get_meta("runs") == "2"
        def failing_after(c: Conn) -> None:
            c.execute("INSERT INTO meta VALUES ('kept', '1')")
            a._after_commit(c, "UPDATE meta SET value=CAST(1 / ? AS TEXT) WHERE key='runs'", (0,))

        with caplog.at_level(logging.WARNING, logger="ckptfs.catalog.postgres"):
            a._write(failing_after)
        assert a.get_meta("kept") == "1" and a.get_meta("runs") == "2"
        assert any("division by zero" in r.getMessage() for r in caplog.records)
    finally:
        a.close()
        b.close()
