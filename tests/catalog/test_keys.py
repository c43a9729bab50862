"""Namespace keys in the catalog (catalog/keys.py, schema 6), on both engines: made once,
rotated, rewrapped, shredded as tombstones whose key ids are never reused; the schema-5
migration; the snapshot carries the wrapped keys."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from ckptfs.catalog import PostgresCatalog, SqliteCatalog
from ckptfs.catalog.catalog import SCHEMA_VERSION
from ckptfs.catalog.keys import KeyRow, Wrap

Catalog = SqliteCatalog | PostgresCatalog


def _wrap(tag: bytes) -> Wrap:
    return lambda ns, version: (tag + f"|{ns}|{version}".encode(), "kek-" + tag.decode())


@pytest.fixture(params=["sqlite", "postgres"])
def catalog(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Catalog]:
    if request.param == "sqlite":
        c: Catalog = SqliteCatalog(tmp_path / "c.sqlite")
    else:
        c = PostgresCatalog(request.getfixturevalue("pg_url"), pool_size=2)
    yield c
    c.close()


def test_a_key_is_made_once_then_rotated_and_shredded_with_ids_never_reused(catalog: Catalog) -> None:
    assert catalog.keys_gen() == 0 and catalog.namespace_keys() == []
    first = catalog.ensure_namespace_key("/a", _wrap(b"w"))
    assert first is not None and (first.key_id, first.version) == (1, 1)
    assert first.wrapped == b"w|/a|1" and first.kek_id == "kek-w"
    assert catalog.ensure_namespace_key("/a", _wrap(b"x")) is None  # one exists: used as is
    b = catalog.ensure_namespace_key("/b", _wrap(b"w"))
    assert b is not None and (b.key_id, b.version) == (2, 1)
    rot = catalog.rotate_namespace_key("/a", _wrap(b"w"))
    assert (rot.key_id, rot.version) == (3, 2)
    gen = catalog.keys_gen()
    assert catalog.shred_namespace_keys("/a") == [1, 3]
    assert catalog.keys_gen() > gen
    rows = catalog.namespace_keys("/a")
    assert [(r.key_id, r.shredded, r.wrapped) for r in rows] == [(1, True, None), (3, True, None)]
    assert all(r.shredded_ns is not None for r in rows)
    assert not catalog.namespace_keys("/b")[0].shredded  # another namespace keeps its key
    # After a shred the namespace may get a key again: a new id and version, never an old one.
    again = catalog.ensure_namespace_key("/a", _wrap(b"w"))
    assert again is not None and (again.key_id, again.version) == (4, 3)


def test_rewrap_replaces_every_live_wrapped_key_in_one_transaction(catalog: Catalog) -> None:
    catalog.ensure_namespace_key("/a", _wrap(b"w"))
    catalog.ensure_namespace_key("/b", _wrap(b"w"))
    catalog.shred_namespace_keys("/b")

    def rewrap(row: KeyRow) -> tuple[bytes, str]:
        assert row.wrapped is not None
        return b"new:" + row.wrapped, "kek-new"

    assert catalog.rewrap_keys(rewrap) == 1
    a, = catalog.namespace_keys("/a")
    assert a.wrapped == b"new:w|/a|1" and a.kek_id == "kek-new"

    def fails(row: KeyRow) -> tuple[bytes, str]:
        raise RuntimeError("wrong KEK")

    with pytest.raises(RuntimeError):
        catalog.rewrap_keys(fails)
    assert catalog.namespace_keys("/a")[0].wrapped == b"new:w|/a|1"  # nothing changed


def test_two_openers_racing_for_a_first_key_make_one(pg_url: str) -> None:
    """Several nodes share one catalog: the first to need a namespace's key creates it,
    the others use it (serializable transactions, retried on conflict)."""
    cats = [PostgresCatalog(pg_url, pool_size=1) for _ in range(4)]
    made: list[object] = []
    start = threading.Barrier(len(cats))

    def one(c: PostgresCatalog, i: int) -> None:
        start.wait()
        made.append(c.ensure_namespace_key("/a", _wrap(str(i).encode())))

    threads = [threading.Thread(target=one, args=(c, i)) for i, c in enumerate(cats)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(made) == len(cats)
        assert len([m for m in made if m is not None]) == 1
        assert len(cats[0].namespace_keys("/a")) == 1
    finally:
        for c in cats:
            c.close()


def test_a_version_5_sqlite_catalog_gets_the_keys_table(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    SqliteCatalog(path).close()
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE namespace_keys")
    conn.execute("UPDATE meta SET value='5' WHERE key='schema_version'")
    conn.commit()
    conn.close()
    c = SqliteCatalog(path)
    try:
        assert c.get_meta("schema_version") == str(SCHEMA_VERSION) == "11"
        assert c.ensure_namespace_key("/a", _wrap(b"w")) is not None
    finally:
        c.close()


def test_a_version_5_postgres_catalog_gets_the_keys_table(pg_url: str) -> None:
    PostgresCatalog(pg_url, pool_size=1).close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP TABLE namespace_keys")
        conn.execute("UPDATE meta SET value='5' WHERE key='schema_version'")
    with pytest.raises(Exception, match="migration"):
        PostgresCatalog(pg_url, pool_size=1, readonly=True)
    c = PostgresCatalog(pg_url, pool_size=1)
    try:
        assert c.get_meta("schema_version") == str(SCHEMA_VERSION)
        assert c.ensure_namespace_key("/a", _wrap(b"w")) is not None
    finally:
        c.close()


def test_the_snapshot_carries_the_wrapped_keys_and_tombstones(catalog: Catalog, tmp_path: Path) -> None:
    catalog.ensure_namespace_key("/a", _wrap(b"w"))
    catalog.ensure_namespace_key("/b", _wrap(b"w"))
    catalog.shred_namespace_keys("/b")
    snap = tmp_path / "snap.sqlite"
    snap.write_bytes(catalog.backup_bytes())
    restored = SqliteCatalog(snap)
    try:
        rows = restored.namespace_keys()
        assert [(r.namespace, r.wrapped) for r in rows] == [("/a", b"w|/a|1"), ("/b", None)]
        made = restored.ensure_namespace_key("/c", _wrap(b"w"))
        assert made is not None and made.key_id == 3  # ids go on after the snapshot's
    finally:
        restored.close()
