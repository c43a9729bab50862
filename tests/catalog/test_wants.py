"""Wants of chunks (catalog/wants.py) beyond the conformance suite: the schema-5 migration
of both engines, and PostgreSQL's listener (catalog/pglisten.py) on the real server: a
want recorded by one catalog object (node b) wakes another's listener (node a), a close
from another thread ends a wait, and a server restart is reported, then heard through
again (the reconnection itself says "look now")."""

from __future__ import annotations

import sqlite3
import stat
import threading
from pathlib import Path

import psycopg
import pytest

from tests.support.pgserver import PgServer

from ckptfs.catalog import ROOT_INODE, ChunkRef, PostgresCatalog, SqliteCatalog
from ckptfs.catalog.catalog import SCHEMA_VERSION
from ckptfs.catalog.pglisten import PgListener
from ckptfs.errors import CatalogUnavailable

R = ROOT_INODE
F = stat.S_IFREG | 0o644
A = b"\x0a" * 32


def _file_on_a(c: SqliteCatalog | PostgresCatalog) -> None:
    f = c.create(R, b"keep", F, 0, 0)
    c.commit_file(f.ino, 10, 1, 1, 16, {0: ChunkRef(A, 10, ("a:l",))}, uploads={A: ["s3"]})


def test_a_version_4_sqlite_catalog_gets_the_wants_table(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    c = SqliteCatalog(path)
    _file_on_a(c)
    c.close()
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE chunk_wants")
    conn.execute("UPDATE meta SET value='4' WHERE key='schema_version'")
    conn.commit()
    conn.close()
    c = SqliteCatalog(path)
    try:
        assert c.get_meta("schema_version") == str(SCHEMA_VERSION)
        assert c.listen_wants() is None  # one node: nobody else to hear from
        c.want_chunks([A], "b:1", 60)
        assert c.wanted_uploads(["a:l"]) == [A]
    finally:
        c.close()


def test_a_version_4_postgres_catalog_gets_the_wants_table(pg_url: str) -> None:
    c = PostgresCatalog(pg_url, pool_size=1)
    _file_on_a(c)
    c.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP TABLE chunk_wants")
        conn.execute("UPDATE meta SET value='4' WHERE key='schema_version'")
    with pytest.raises(Exception, match="migration"):
        PostgresCatalog(pg_url, pool_size=1, readonly=True)
    c = PostgresCatalog(pg_url, pool_size=1)
    try:
        assert c.get_meta("schema_version") == str(SCHEMA_VERSION)
        c.want_chunks([A], "b:1", 60)
        c.want_chunks([A], "b:1", 60)  # the primary key came with the migration
        assert c.wanted_uploads(["a:l"]) == [A] and len(c.chunk_wants()) == 1
    finally:
        c.close()


def _in_thread(fn: object) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())  # type: ignore[operator]
        except Exception as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_a_want_on_one_node_wakes_the_listener_of_another(pg_url: str) -> None:
    a, b = PostgresCatalog(pg_url, pool_size=1), PostgresCatalog(pg_url, pool_size=1)
    listener = a.listen_wants()
    try:
        assert isinstance(listener, PgListener)
        assert listener.wait() is True and listener.connects == 1  # connected: look now
        t, out = _in_thread(listener.wait)
        t.join(0.5)
        assert t.is_alive() and not out  # nothing announced: it waits (no polling)
        _file_on_a(b)
        b.want_chunks([A], "b:1", 60)  # NOTIFY at the commit
        t.join(10)
        assert out == [True] and a.wanted_uploads(["a:l"]) == [A]
        b.unwant_chunks([A], "b:1")  # not announced: nobody needs to hurry for it
        t, out = _in_thread(listener.wait)
        t.join(0.5)
        assert t.is_alive()
        listener.close()  # from another thread: the wait ends
        t.join(10)
        assert out == [False] and listener.wait() is False
    finally:
        listener.close()
        a.close()
        b.close()


def test_a_listener_reports_a_restart_and_hears_again_after_it(
    pg_url: str, postgres: PgServer
) -> None:
    a, b = PostgresCatalog(pg_url, pool_size=1), PostgresCatalog(pg_url, pool_size=1)
    listener = a.listen_wants()
    assert listener is not None
    try:
        assert listener.wait() is True
        t, out = _in_thread(listener.wait)
        try:
            postgres.stop()
            t.join(30)
            assert len(out) == 1 and isinstance(out[0], CatalogUnavailable)
            with pytest.raises(CatalogUnavailable):
                listener.wait()  # down: no connection
        finally:
            postgres.start()
        assert listener.wait() is True  # reconnected: what was sent meanwhile is unknown
        t, out = _in_thread(listener.wait)
        _file_on_a(b)
        b.want_chunks([A], "b:1", 60)
        t.join(10)
        assert out == [True]
    finally:
        listener.close()
        a.close()
        b.close()
