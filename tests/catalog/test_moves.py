"""Moves of uncommitted chunks (catalog/moves.py) beyond the conformance suite: the
schema-7 migration of both engines (an older catalog gets chunk_moves, and a deletion
claim then counts a move as the pair being wanted)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg
import pytest

from tests.support.catalog_conformance import lease_end

from ckptfs.catalog import PostgresCatalog, SqliteCatalog
from ckptfs.catalog.catalog import SCHEMA_VERSION

A = b"\x0b" * 32


def _moves_work(c: SqliteCatalog | PostgresCatalog) -> None:
    assert c.get_meta("schema_version") == str(SCHEMA_VERSION) == "11"
    assert c.begin_move(A, 10, ["s3"], "n1")
    c.queue_deletions([(A, "s3")])
    assert c.claim_deletions([(A, "s3")], lease_end()) == []  # wanted by the move: cancelled
    assert c.begin_move(A, 10, ["s3"], "n1")  # the primary key came with the migration
    assert c.chunk_moves() == [(A, "s3", "n1")]


def test_a_version_6_sqlite_catalog_gets_the_moves_table(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    SqliteCatalog(path).close()
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE chunk_moves")
    conn.execute("UPDATE meta SET value='6' WHERE key='schema_version'")
    conn.commit()
    conn.close()
    c = SqliteCatalog(path)
    try:
        _moves_work(c)
    finally:
        c.close()


def test_a_version_6_postgres_catalog_gets_the_moves_table(pg_url: str) -> None:
    PostgresCatalog(pg_url, pool_size=1).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP TABLE chunk_moves")
        conn.execute("UPDATE meta SET value='6' WHERE key='schema_version'")
    with pytest.raises(Exception, match="migration"):
        PostgresCatalog(pg_url, pool_size=1, readonly=True)
    c = PostgresCatalog(pg_url, pool_size=1)
    try:
        _moves_work(c)
    finally:
        c.close()
