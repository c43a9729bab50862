"""Schema 9 (issue 33 item 3): checkpoints.root holds the bytes of the path. A catalog of
schema 7 (roots as TEXT) is migrated on both engines: its rows read, match and move as
before, and names that are not UTF-8 work after it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg

from ckptfs.catalog import PostgresCatalog, SqliteCatalog
from ckptfs.catalog.protocols import Catalog
from ckptfs.catalog.rows import CheckpointState
from ckptfs.catalog.sql import SCHEMA_VERSION, checkpoints_ddl


def _seed(c: Catalog) -> None:
    c.checkpoint_commit("/run/step-1", "torch", 1, 10, "marker")
    c.checkpoint_begin("/run/step-2", "torch", 2, 20)


def _works(c: Catalog) -> None:
    assert c.get_meta("schema_version") == str(SCHEMA_VERSION) == "11"
    assert [(r.root, r.state) for r in c.checkpoint_rows("/run")] == [
        ("/run/step-1", CheckpointState.COMMITTED), ("/run/step-2", CheckpointState.WRITING)]
    assert c.checkpoint_set_state("/run/step-2", CheckpointState.PARTIAL, "no writer")
    c.rename_checkpoints("/run", "/run-\udcff")
    c.checkpoint_commit("/run-\udcff/step-3", "torch", 3, 30, "x")
    assert [r.root for r in c.checkpoint_rows("/run-\udcff")] == [
        "/run-\udcff/step-1", "/run-\udcff/step-2", "/run-\udcff/step-3"]
    assert c.checkpoint_rows("/run") == []


def test_a_schema_7_sqlite_catalog_gets_byte_roots(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    c = SqliteCatalog(path)
    _seed(c)
    c.close()
    conn = sqlite3.connect(path)
    with conn:  # back to schema 7: roots as TEXT
        conn.execute(checkpoints_ddl("old").replace("root       BLOB", "root       TEXT"))
        conn.execute("INSERT INTO old SELECT id, CAST(root AS TEXT), framework, step, state, "
                     "begin_ns, commit_ns, reason, tags, leftover FROM checkpoints")
        conn.execute("DROP TABLE checkpoints")
        conn.execute("ALTER TABLE old RENAME TO checkpoints")
        conn.execute("UPDATE meta SET value='7' WHERE key='schema_version'")
    assert conn.execute("SELECT DISTINCT typeof(root) FROM checkpoints").fetchall() == [("text",)]
    conn.close()
    c = SqliteCatalog(path)
    try:
        _works(c)
    finally:
        c.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT DISTINCT typeof(root) FROM checkpoints").fetchall() == [
            ("blob",)]
    finally:
        conn.close()


def test_a_schema_7_postgres_catalog_gets_byte_roots(pg_url: str) -> None:
    c = PostgresCatalog(pg_url, pool_size=1)
    _seed(c)
    c.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE checkpoints ALTER COLUMN root TYPE TEXT "
                     "USING convert_from(root, 'UTF8')")
        conn.execute("UPDATE meta SET value='7' WHERE key='schema_version'")
    c = PostgresCatalog(pg_url, pool_size=1)
    try:
        _works(c)
    finally:
        c.close()
