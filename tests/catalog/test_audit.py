"""The audit log in the catalog (catalog/audit.py) on both engines: records written in the
transaction of the change they record (and not at all when the change fails), the chain
intact across transactions, the opens' backlog, the migration from schema 5, and a
hand-edited table found by the verification. Two PostgreSQL catalogs appending at once
(two nodes) make one chain."""

from __future__ import annotations

import sqlite3
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from ckptfs.catalog import ROOT_INODE, ChunkRef, PostgresCatalog, SqlCatalog, SqliteCatalog
from ckptfs.catalog.audit import AuditRecord, verify_chain
from ckptfs.catalog.catalog import SCHEMA_VERSION
from ckptfs.catalog.hooks import CatalogHooks
from ckptfs.errors import AlreadyExists

R = ROOT_INODE
F = stat.S_IFREG | 0o644
D = stat.S_IFDIR | 0o755
A = b"\x0a" * 32


@pytest.fixture
def woke() -> list[int]:
    """A call per audit note (the hooks' on_audit_note of ``cat``)."""
    return []


@pytest.fixture(params=["sqlite", "postgres"])
def cat(request: pytest.FixtureRequest, tmp_path: Path, woke: list[int]) -> Iterator[SqlCatalog]:
    hooks = CatalogHooks(node="n1", on_audit_note=lambda: woke.append(1))
    if request.param == "sqlite":
        c: SqlCatalog = SqliteCatalog(tmp_path / "c.sqlite", hooks=hooks)
    else:
        c = PostgresCatalog(request.getfixturevalue("pg_url"), pool_size=2, hooks=hooks)
    try:
        yield c
    finally:
        c.close()


def who(action: str, uid: int = 1000, pid: int = 77) -> AuditRecord:
    return AuditRecord(action, uid=uid, pid=pid)


def test_changes_are_recorded_with_their_paths_in_order(cat: SqlCatalog) -> None:
    d = cat.create(R, b"run", D, 1000, 1000, audit=who("mkdir"))
    f = cat.create(d.ino, b"a.pt", F, 1000, 1000, audit=who("create"))
    cat.commit_file(f.ino, 10, 1, 1, 16, {0: ChunkRef(A, 10, ("t",))}, audit=who("commit"))
    cat.rename(d.ino, b"a.pt", d.ino, b"b.pt", False, audit=who("rename"))
    cat.checkpoint_commit("/run", "torch", 3, 5, "done", audit=AuditRecord("checkpoint_commit"))
    cat.checkpoint_tag("/run", "milestone", audit=who("tag"))
    cat.unlink(d.ino, b"b.pt", audit=who("unlink"))
    cat.create(R, b"quiet", F, 0, 0)  # no record asked: none written
    got = cat.audit_entries()
    assert [(e.seq, e.action, e.path, e.uid, e.pid, e.node) for e in got] == [
        (1, "mkdir", "/run", 1000, 77, "n1"),
        (2, "create", "/run/a.pt", 1000, 77, "n1"),
        (3, "commit", "/run/a.pt", 1000, 77, "n1"),
        (4, "rename", "/run/b.pt", 1000, 77, "n1"),
        (5, "checkpoint_commit", "/run", 0, 0, "n1"),
        (6, "tag", "/run", 1000, 77, "n1"),
        (7, "unlink", "/run/b.pt", 1000, 77, "n1"),
    ]
    assert '"src":"/run/a.pt"' in got[3].detail and '"size":10' in got[2].detail
    assert verify_chain(got, cat.audit_genesis()) == []
    assert cat.audit_head() == got[-1]
    assert [e.seq for e in cat.audit_entries(last=2)] == [6, 7]
    assert [e.seq for e in cat.audit_entries(since_seq=6)] == [6, 7]


def test_a_failed_change_records_nothing(cat: SqlCatalog) -> None:
    cat.create(R, b"x", F, 0, 0, audit=who("create"))
    with pytest.raises(AlreadyExists):
        cat.create(R, b"x", F, 0, 0, audit=who("create"))
    assert [e.seq for e in cat.audit_entries()] == [1]


def test_noted_records_wait_for_the_flush(cat: SqlCatalog, woke: list[int]) -> None:
    f = cat.create(R, b"w", F, 0, 0)
    cat.audit_note(AuditRecord("open", uid=5, pid=6, ino=f.ino, detail={"access": "r"}))
    cat.audit_note(AuditRecord("open", uid=5, pid=7, ino=f.ino, detail={"access": "r"}))
    assert woke == [1, 1] and cat.audit_entries() == [] and cat.audit_pending() == 2
    assert cat.audit_flush() == 2 and cat.audit_pending() == 0
    got = cat.audit_entries()
    assert [(e.action, e.path, e.pid) for e in got] == [("open", "/w", 6), ("open", "/w", 7)]
    assert cat.audit_flush() == 0


def test_a_hand_edited_table_is_found(cat: SqlCatalog, tmp_path: Path) -> None:
    for i in range(6):
        cat.create(R, f"f{i}".encode(), F, 0, 0, audit=who("create"))

    def sql(stmt: str) -> None:
        if isinstance(cat, SqliteCatalog):
            conn = sqlite3.connect(cat.path)
            conn.execute(stmt)
            conn.commit()
            conn.close()
        else:
            with psycopg.connect(cat._url, autocommit=True) as pconn:  # type: ignore[attr-defined]
                pconn.execute(stmt)

    # Read once: a shared catalog chains its pending records at the first read (audit.py).
    assert [e.seq for e in cat.audit_entries()] == [1, 2, 3, 4, 5, 6]
    sql("UPDATE audit_log SET uid=0 WHERE seq=2")
    sql("DELETE FROM audit_log WHERE seq=4")
    problems = verify_chain(cat.audit_entries(), cat.audit_genesis())
    assert [(p.kind, p.seq) for p in problems] == [("edited", 2), ("missing", 4)]


def test_a_version_5_sqlite_catalog_gets_the_audit_log(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    c = SqliteCatalog(path)
    c.create(R, b"old", F, 0, 0)
    c.close()
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE audit_log")
    conn.execute("UPDATE meta SET value='5' WHERE key='schema_version'")
    conn.commit()
    conn.close()
    c = SqliteCatalog(path)
    try:
        assert SCHEMA_VERSION == 11 and c.get_meta("schema_version") == "11"
        assert c.lookup(R, b"old").is_reg
        c.create(R, b"new", F, 0, 0, audit=who("create"))
        assert [e.path for e in c.audit_entries()] == ["/new"]
    finally:
        c.close()


def test_a_version_5_postgres_catalog_gets_the_audit_log(pg_url: str) -> None:
    c = PostgresCatalog(pg_url, pool_size=1)
    c.create(R, b"old", F, 0, 0)
    c.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP TABLE audit_log")
        conn.execute("UPDATE meta SET value='5' WHERE key='schema_version'")
    c = PostgresCatalog(pg_url, pool_size=1)
    try:
        assert c.get_meta("schema_version") == str(SCHEMA_VERSION)
        c.create(R, b"new", F, 0, 0, audit=who("create"))
        assert [e.path for e in c.audit_entries()] == ["/new"]
    finally:
        c.close()


def test_the_snapshot_carries_the_chain(tmp_path: Path) -> None:
    c = SqliteCatalog(tmp_path / "c.sqlite")
    c.create(R, b"a", F, 0, 0, audit=who("create"))
    data = c.backup_bytes()
    c.close()
    (tmp_path / "r.sqlite").write_bytes(data)
    r = SqliteCatalog(tmp_path / "r.sqlite")
    try:
        assert [e.path for e in r.audit_entries()] == ["/a"]
        assert verify_chain(r.audit_entries(), r.audit_genesis()) == []
    finally:
        r.close()


def test_two_nodes_appending_at_once_make_one_chain(pg_url: str) -> None:
    nodes = [PostgresCatalog(pg_url, pool_size=2, hooks=CatalogHooks(node=n)) for n in "ab"]
    errors: list[BaseException] = []

    def work(c: PostgresCatalog, k: int) -> None:
        try:
            for i in range(40):
                c.create(R, f"{c.hooks.node}{k}-{i}".encode(), F, 0, 0,
                         audit=AuditRecord("create", uid=k))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(c, k)) for c in nodes for k in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        got = nodes[0].audit_entries()
        assert [e.seq for e in got] == list(range(1, 161))
        assert {e.node for e in got} == {"a", "b"}
        assert verify_chain(got, nodes[0].audit_genesis()) == []
    finally:
        for c in nodes:
            c.close()
