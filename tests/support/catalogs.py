"""A catalog on each engine, and catalogs made older than the schema, for the catalog tests.

``cat``: the same test on SQLite and on the session's PostgreSQL (tests/conftest.py
imports it for every test; a module's own ``cat`` fixture takes its place there). ``downgraded_sqlite``
and ``downgrade_postgres``: a new catalog with some SQL undone and an older schema version
recorded, for the tests that the migration of that version brings it back.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from ckptfs.catalog import PostgresCatalog, SqliteCatalog

Cat = SqliteCatalog | PostgresCatalog


@pytest.fixture(params=["sqlite", "postgres"])
def cat(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cat]:
    c: Cat
    if request.param == "sqlite":
        c = SqliteCatalog(tmp_path / "c.sqlite")
    else:
        c = PostgresCatalog(request.getfixturevalue("pg_url"), pool_size=2)
    try:
        yield c
    finally:
        c.close()


def _as_version(version: int) -> str:
    return f"UPDATE meta SET value='{version}' WHERE key='schema_version'"


def downgrade_sqlite(path: Path, version: int, script: str) -> None:
    """The SQLite catalog at ``path`` (made if missing) with ``script`` run and schema
    ``version`` recorded: the next open migrates it."""
    if not path.exists():
        SqliteCatalog(path).close()
    conn = sqlite3.connect(path)
    try:
        conn.executescript(f"{script}; {_as_version(version)};")
    finally:
        conn.close()


def downgrade_postgres(url: str, version: int, *statements: str) -> None:
    """The PostgreSQL catalog at ``url`` (made if new) with ``statements`` run and schema
    ``version`` recorded: the next read-write open migrates it."""
    PostgresCatalog(url, pool_size=1).close()
    with psycopg.connect(url, autocommit=True) as conn:
        for sql in (*statements, _as_version(version)):
            conn.execute(sql)
