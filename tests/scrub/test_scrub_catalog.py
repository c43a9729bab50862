"""The scrubber's catalog (schema 10: replicas.checked_ns; catalog/checks.py) on both
engines: copies due oldest check first, checks recorded, progress, passes, the remote's
lease; the migration of a schema-9 catalog on SQLite and on PostgreSQL."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from tests.support.catalogs import Cat, downgrade_postgres, downgrade_sqlite

from ckptfs.catalog import PostgresCatalog, SqliteCatalog
from ckptfs.catalog.catalog import SCHEMA_VERSION

A, B, C = b"\xaa" * 32, b"\xbb" * 32, b"\xcc" * 32


def test_copies_come_due_oldest_check_first_and_a_check_is_recorded(cat: Cat) -> None:
    before = time.time_ns()
    for digest in (A, B, C):
        cat.add_replica(digest, "local0", 100)  # written now: its write is its check
    cat.add_replica(A, "s3", 100)
    assert cat.replicas_to_check(["local0", "s3"], before, 10) == []  # none due yet
    now = time.time_ns() + 1
    cat.record_checked([(B, "local0")], 1)  # B the oldest, then C
    cat.record_checked([(C, "local0")], 2)
    due = cat.replicas_to_check(["local0"], now, 2)
    assert [(r.digest, r.checked_ns) for r in due] == [(B, 1), (C, 2)]
    assert cat.replicas_to_check(["s3"], now, 10)[0].digest == A
    cat.record_checked([(B, "local0"), (C, "local0")], now)
    assert [r.digest for r in cat.replicas_to_check(["local0"], now, 10)] == [A]
    assert cat.next_check_due_ns(["local0"]) is not None
    cat.mark_replica_bad(A, "local0")
    progress = cat.check_progress(["local0", "s3"], now)
    assert progress["local0"].copies == 3 and progress["local0"].bad == 1
    assert progress["local0"].bytes_since == 200  # B and C checked at `now`
    cat.record_scrub_pass(["local0"], 42)
    assert cat.scrub_passes() == {"local0": 42}


def test_a_bad_copy_written_again_counts_as_checked_a_valid_one_recorded_again_does_not(
    cat: Cat
) -> None:
    cat.add_replica(A, "local0", 100)
    cat.record_checked([(A, "local0")], 5)
    cat.add_replica(A, "local0", 100)  # recorded again (a commit that found it there)
    assert cat.replicas_to_check(["local0"], 6, 10)[0].checked_ns == 5
    cat.mark_replica_bad(A, "local0")
    assert cat.add_replica_if_known(A, "local0")  # a heal wrote it again, verified
    assert cat.replicas_to_check(["local0"], 6, 10) == []


def test_one_node_at_a_time_holds_the_remote_scrub_lease(cat: Cat) -> None:
    assert cat.take_scrub_lease("a", 60) == "a"
    assert cat.take_scrub_lease("b", 60) == "a"  # a holds it, unexpired
    assert cat.take_scrub_lease("a", 60) == "a"  # renewed
    cat.release_scrub_lease("b")  # not b's: nothing
    assert cat.take_scrub_lease("b", 60) == "a"
    cat.release_scrub_lease("a")
    assert cat.take_scrub_lease("b", 0.001) == "b"
    time.sleep(0.01)  # b's lease of 1 ms is over (the database's clock)
    assert cat.take_scrub_lease("a", 60) == "a"


def test_a_schema_9_sqlite_catalog_gets_the_check_column(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    c = SqliteCatalog(path)
    c.add_replica(A, "local0", 100)
    c.close()
    downgrade_sqlite(
        path, 9,
        "DROP INDEX replicas_checked; CREATE TABLE r9 (digest BLOB NOT NULL, tier TEXT NOT NULL, "
        "state TEXT NOT NULL CHECK (state IN ('valid', 'bad')), PRIMARY KEY (digest, tier)) "
        "WITHOUT ROWID; INSERT INTO r9 SELECT digest, tier, state FROM replicas; "
        "DROP TABLE replicas; ALTER TABLE r9 RENAME TO replicas")
    c = SqliteCatalog(path)
    try:
        assert c.get_meta("schema_version") == str(SCHEMA_VERSION) == "11"
        due = c.replicas_to_check(["local0"], time.time_ns(), 10)
        assert [(r.digest, r.checked_ns) for r in due] == [(A, 0)]  # never checked
    finally:
        c.close()
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT 1 FROM sqlite_master WHERE name='replicas_checked'").fetchone()
    conn.close()


def test_a_schema_9_postgres_catalog_gets_the_check_column(pg_url: str) -> None:
    c = PostgresCatalog(pg_url, pool_size=1)
    c.add_replica(A, "local0", 100)
    c.close()
    downgrade_postgres(pg_url, 9, "DROP INDEX replicas_checked",
                       "ALTER TABLE replicas DROP COLUMN checked_ns")
    with pytest.raises(Exception, match="migration"):
        PostgresCatalog(pg_url, pool_size=1, readonly=True)
    c = PostgresCatalog(pg_url, pool_size=1)
    try:
        assert c.get_meta("schema_version") == "11"
        due = c.replicas_to_check(["local0"], time.time_ns(), 10)
        assert [(r.digest, r.checked_ns) for r in due] == [(A, 0)]
    finally:
        c.close()
