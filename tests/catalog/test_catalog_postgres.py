"""The PostgreSQL catalog engine's own behaviour: two catalog objects on one database (two
"nodes") racing each other, conflict retries, an outage of the server, the schema's
creation and versioning, read-only opens and the SQLite snapshot. What every engine must do
is in catalog_conformance.py (run on this engine by test_catalog_conformance.py)."""

from __future__ import annotations

import errno
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.pgserver import PgServer

from ckptfs.catalog import PostgresCatalog, SqliteCatalog
from ckptfs.catalog import postgres as postgres_engine
from ckptfs.catalog.hooks import CatalogHooks
from ckptfs.catalog.postgres import CONNECT_TIMEOUT, POOL_WAIT
from ckptfs.catalog.rows import ROOT_INODE, ChunkRef, Inode
from ckptfs.catalog.sql import SCHEMA_VERSION, Conn
from ckptfs.codec import frame
from ckptfs.daemon.restore import restore_catalog
from ckptfs.errors import AlreadyExists, CatalogUnavailable, CkptfsError, NotFound, NotPermitted
from ckptfs.testing.tiers import MemoryTier
from ckptfs.upload.uploader import SNAPSHOT_NAME

R = ROOT_INODE
F = stat.S_IFREG | 0o644
D = stat.S_IFDIR | 0o755


def once_per_thread(barrier: threading.Barrier, fn: Callable[..., Any], *, before: bool = False
                    ) -> Callable[..., Any]:
    """``fn``, but the first call in each thread waits for the other threads at ``barrier``
    after it (``before``: before it); a rerun of the transaction does not wait again."""
    waited = threading.local()

    def wait() -> None:
        if not getattr(waited, "done", False):
            waited.done = True
            barrier.wait(timeout=30)

    def wrapper(*args: Any) -> Any:
        if before:
            wait()
        out = fn(*args)
        if not before:
            wait()
        return out

    return wrapper


def run_both(*calls: Callable[[], Any]) -> list[Any]:
    """Run the calls in threads of their own; each one's result or exception."""
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(c) for c in calls]
        out: list[Any] = []
        for f in futures:
            exc = f.exception(timeout=60)
            out.append(exc if exc is not None else f.result())
        return out


# --------------------------------------------------------------------------- two nodes racing

def test_one_name_created_at_once_by_two_nodes_exists_once(
    nodes: tuple[PostgresCatalog, PostgresCatalog], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both creates have looked the name up (missing) before either inserts it: the loser's
    insert conflicts with the winner's row, its rerun sees the name and raises EEXIST."""
    a, b = nodes
    monkeypatch.setattr(PostgresCatalog, "_dir_entry", staticmethod(
        once_per_thread(threading.Barrier(2), PostgresCatalog._dir_entry)))
    got = run_both(lambda: a.create(R, b"same", F, 1, 1), lambda: b.create(R, b"same", F, 2, 2))
    monkeypatch.undo()
    won = [g for g in got if isinstance(g, Inode)]
    lost = [g for g in got if isinstance(g, CkptfsError)]
    assert len(won) == 1 and len(lost) == 1, got
    assert isinstance(lost[0], AlreadyExists) and lost[0].errno == errno.EEXIST
    assert a.conflicts + b.conflicts >= 1  # the loser ran again
    assert b.lookup(R, b"same").ino == a.lookup(R, b"same").ino == won[0].ino
    assert [n for _, n, _ in a.readdir(R, 0)] == [b"same"]


def test_a_unique_violation_of_a_name_runs_the_transaction_again(
    nodes: tuple[PostgresCatalog, PostgresCatalog], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The insert of a name another transaction committed meanwhile (its check missed it)
    fails on the dentries key; the rerun sees the name: EEXIST, not an IntegrityError."""
    a, _ = nodes
    a.create(R, b"taken", F, 0, 0)
    real = PostgresCatalog._dir_entry
    missed: list[bytes] = []

    def miss_once(c: Conn, parent: int, name: bytes) -> tuple[Inode, Inode | None]:
        pdir, entry = real(c, parent, name)
        if not missed:
            missed.append(name)
            return pdir, None
        return pdir, entry

    monkeypatch.setattr(PostgresCatalog, "_dir_entry", staticmethod(miss_once))
    before = a.conflicts
    with pytest.raises(AlreadyExists):
        a.create(R, b"taken", F, 0, 0)
    assert missed == [b"taken"] and a.conflicts == before + 1
    monkeypatch.undo()
    assert [n for _, n, _ in a.readdir(R, 0)] == [b"taken"]


def test_same_name_races_without_a_forced_overlap(nodes: tuple[PostgresCatalog, PostgresCatalog]) -> None:
    a, b = nodes
    for i in range(20):
        name = b"n%d" % i
        start = threading.Barrier(2)

        def make(cat: PostgresCatalog, name: bytes = name, start: threading.Barrier = start) -> Inode:
            start.wait(timeout=30)
            return cat.create(R, name, F, 0, 0)

        got = run_both(lambda: make(a), lambda: make(b))
        assert sorted(type(g).__name__ for g in got) == ["AlreadyExists", "Inode"], got
    assert len(a.readdir(R, 0, limit=100)) == 20


def test_many_creates_in_one_directory_from_two_nodes_lose_nothing(
    nodes: tuple[PostgresCatalog, PostgresCatalog]
) -> None:
    a, b = nodes
    d = a.create(R, b"d", D, 0, 0)
    per_thread = 40
    start = threading.Barrier(8)

    def make(cat: PostgresCatalog, tag: str) -> list[int]:
        start.wait(timeout=30)
        out = []
        for i in range(per_thread):
            kind = D if i % 4 == 0 else F  # some directories: the parent's nlink too
            out.append(cat.create(d.ino, f"{tag}-{i}".encode(), kind, 0, 0).ino)
        return out

    calls = [lambda c=cat, t=f"{n}{k}": make(c, t) for n, cat in (("a", a), ("b", b)) for k in range(4)]
    got = run_both(*calls)
    for g in got:
        assert isinstance(g, list), g
    inos = [i for g in got for i in g]
    assert len(inos) == len(set(inos)) == 8 * per_thread  # no inode number handed out twice
    names = [n for _, n, _ in b.readdir(d.ino, 0, limit=10_000)]
    assert len(names) == len(set(names)) == 8 * per_thread
    assert b.get_inode(d.ino).nlink == 2 + 8 * per_thread // 4


def test_two_mkdirs_in_one_directory_conflict_and_the_rerun_counts_both(
    nodes: tuple[PostgresCatalog, PostgresCatalog], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both transactions have written their entry and reach the parent's row (nlink + 1)
    together: one waits for the other's lock and fails to serialize; its rerun sees the
    first's link count."""
    a, b = nodes
    monkeypatch.setattr(PostgresCatalog, "_touch_dir",
                        staticmethod(once_per_thread(threading.Barrier(2), PostgresCatalog._touch_dir,
                                                 before=True)))
    got = run_both(lambda: a.create(R, b"x", D, 0, 0), lambda: b.create(R, b"y", D, 0, 0))
    monkeypatch.undo()
    assert all(isinstance(g, Inode) for g in got), got
    assert a.conflicts + b.conflicts >= 1
    assert a.get_inode(R).nlink == 4
    assert sorted(n for _, n, _ in b.readdir(R, 0)) == [b"x", b"y"]


def test_a_directory_renamed_by_one_node_is_never_seen_twice_or_not_at_all_by_the_other(
    nodes: tuple[PostgresCatalog, PostgresCatalog]
) -> None:
    a, b = nodes
    top = a.create(R, b"a", D, 0, 0)
    a.create(top.ino, b"x", F, 0, 0)
    sub = a.create(top.ino, b"sub", D, 0, 0)
    a.create(sub.ino, b"y", F, 0, 0)
    done = threading.Event()
    renames = 60
    seen: list[tuple[str, ...]] = []

    def renamer() -> None:
        try:
            for i in range(renames):
                old, new = (b"a", b"b") if i % 2 == 0 else (b"b", b"a")
                a.rename(R, old, R, new, noreplace=True)
        finally:
            done.set()

    def reader() -> int:
        n = 0
        while not done.is_set() or n == 0:
            names = tuple(sorted(b.list_names(R)))
            files = sorted(i.ino for i in b.files_under("/"))  # walks the tree in one snapshot
            seen.append(names)
            assert names in (("a",), ("b",)), names
            assert len(files) == 2, files
            n += 1
        return n

    got = run_both(renamer, reader, reader)
    assert got[0] is None and all(isinstance(g, int) and g > 0 for g in got[1:]), got
    assert b.list_names(R) == ["a"]  # an even number of renames
    assert {s for s in seen} <= {("a",), ("b",)}


# --------------------------------------------------------------------------- an outage

@pytest.mark.slow  # about 15 s: three calls wait out the pool's and the connect's timeouts
def test_a_stopped_database_fails_calls_with_eio_and_they_work_once_it_is_back(
    postgres: PgServer, pg_url: str
) -> None:
    cat = PostgresCatalog(pg_url.replace("postgres@", "postgres:s3cret@"))
    try:
        f = cat.create(R, b"f", F, 0, 0)
        postgres.stop()
        try:
            for call in (lambda: cat.get_inode(f.ino), lambda: cat.create(R, b"g", F, 0, 0)):
                t0 = time.monotonic()
                with pytest.raises(CatalogUnavailable) as info:
                    call()
                assert time.monotonic() - t0 < POOL_WAIT + CONNECT_TIMEOUT + 5
                assert info.value.errno == errno.EIO
                assert str(postgres.socket_dir) in str(info.value) and "s3cret" not in str(info.value)
            t0 = time.monotonic()
            with pytest.raises(CatalogUnavailable):
                PostgresCatalog(pg_url)
            assert time.monotonic() - t0 < CONNECT_TIMEOUT + 5
        finally:
            postgres.start()
        assert cat.get_inode(f.ino).ino == f.ino  # the pool replaces its dropped connections
        assert cat.create(R, b"g", F, 0, 0).ino > f.ino
        assert sorted(cat.list_names(R)) == ["f", "g"]
    finally:
        cat.close()


# --------------------------------------------------------------------------- the schema

def _version(url: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        assert row is not None
        return str(row[0])


def test_two_nodes_opening_an_empty_database_at_once_create_it_once(pg_url: str) -> None:
    start = threading.Barrier(3)

    def open_one() -> PostgresCatalog:
        start.wait(timeout=30)
        return PostgresCatalog(pg_url)

    got = run_both(open_one, open_one, open_one)
    try:
        assert all(isinstance(g, PostgresCatalog) for g in got), got
        ids = {g.get_meta("fs_id") for g in got}
        assert len(ids) == 1 and None not in ids
        assert got[0].readdir(R, 0) == []
        assert got[1].create(R, b"f", F, 0, 0).ino == R + 1
    finally:
        for g in got:
            if isinstance(g, PostgresCatalog):
                g.close()
    with psycopg.connect(pg_url) as conn:
        row = conn.execute("SELECT count(*) FROM inodes").fetchone()
        assert row is not None and row[0] == 2
    assert _version(pg_url) == str(SCHEMA_VERSION)


def test_reopening_keeps_everything_and_a_newer_schema_is_refused(pg_url: str) -> None:
    """The PostgreSQL schema starts at the current version (3): there is no older layout
    to migrate yet (postgres.MIGRATIONS is empty); reopening is idempotent, a newer
    version is refused with the version in the message."""
    c = PostgresCatalog(pg_url)
    f = c.create(R, b"keep", F, 1, 2)
    fs_id = c.get_meta("fs_id")
    c.close()
    c = PostgresCatalog(pg_url)
    try:
        assert c.lookup(R, b"keep").ino == f.ino and c.get_meta("fs_id") == fs_id
        assert c.create(R, b"next", F, 0, 0).ino > f.ino
    finally:
        c.close()
    with psycopg.connect(pg_url) as conn:
        conn.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    with pytest.raises(CkptfsError, match=f"schema version 99, this ckptfs knows {SCHEMA_VERSION}"):
        PostgresCatalog(pg_url)
    assert _version(pg_url) == "99"


def test_a_migration_step_runs_once_for_an_older_version(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The migration path: a database at version N - 1 runs MIGRATIONS[N - 1] in the
    opener's transaction and ends at N (a made-up step: there is no older layout yet)."""
    PostgresCatalog(pg_url).close()
    with psycopg.connect(pg_url) as conn:
        conn.execute("UPDATE meta SET value=%s WHERE key='schema_version'", (str(SCHEMA_VERSION - 1),))
    ran: list[int] = []

    def step(c: Conn) -> None:
        ran.append(1)
        c.execute("INSERT INTO meta VALUES ('migrated', 'yes')")

    monkeypatch.setitem(postgres_engine.MIGRATIONS, SCHEMA_VERSION - 1, step)
    with pytest.raises(CkptfsError, match="needs a migration"):
        PostgresCatalog(pg_url, readonly=True)
    c = PostgresCatalog(pg_url)
    c.close()
    c = PostgresCatalog(pg_url)
    try:
        assert ran == [1] and c.get_meta("migrated") == "yes"
        assert c.get_meta("schema_version") == str(SCHEMA_VERSION)
    finally:
        c.close()


def test_read_only_opens(pg_url: str) -> None:
    with pytest.raises(NotFound):
        PostgresCatalog(pg_url, readonly=True)  # an empty database is not made a catalog
    w = PostgresCatalog(pg_url)
    r = PostgresCatalog(pg_url, readonly=True)
    try:
        f = w.create(R, b"f", F, 0, 0)
        assert r.lookup(R, b"f").ino == f.ino  # sees every commit
        with pytest.raises(NotPermitted):
            r.create(R, b"g", F, 0, 0)
        assert r.concurrency == 4
    finally:
        r.close()
        w.close()


# --------------------------------------------------------------------------- the snapshot

@pytest.mark.allow_log_warnings  # restore_catalog names the file it could not restore
def test_the_snapshot_restores_as_a_sqlite_catalog_with_the_same_namespace_and_extents(
    pg_url: str, tmp_path: Path
) -> None:
    pg = PostgresCatalog(pg_url)
    try:
        pg.set_meta("tiers", '[{"name": "l", "kind": "local"}, {"name": "remote0", "kind": "s3"}]')
        d = pg.create(R, b"run", D, 0, 0)
        kept = pg.create(d.ino, b"step-1.pt", F, 0, 0)
        gone = pg.create(d.ino, b"pending.pt", F, 0, 0)
        ln = pg.create(R, b"ln", stat.S_IFLNK | 0o777, 0, 0, b"run/step-1.pt")
        up, pending = b"\x01" * 32, b"\x02" * 32
        pg.commit_file(kept.ino, 20, 5, 5, 16, {0: ChunkRef(up, 16, ("l",)), 1: ChunkRef(up, 16, ("l",))},
                       uploads={up: ["remote0"]})
        pg.commit_file(gone.ino, 10, 5, 5, 16, {0: ChunkRef(pending, 10, ("l",))},
                       uploads={pending: ["remote0"]})
        assert pg.finish_upload(up, "remote0")
        pg.set_xattr(kept.ino, b"user.k", b"v")
        pg.checkpoint_commit("/run", "torch", 1, 7, "manifest")
        snap = pg.backup_bytes()
        want_tree = [(n, i.ino, i.mode, i.size) for _, n, i in pg.readdir(d.ino, 0)]
        want_ext = pg.extents(kept.ino)
    finally:
        pg.close()

    path = tmp_path / "snap.sqlite"
    path.write_bytes(snap)
    c = SqliteCatalog(path)
    try:
        assert [(n, i.ino, i.mode, i.size) for _, n, i in c.readdir(d.ino, 0)] == want_tree
        assert c.extents(kept.ino) == want_ext
        assert c.get_xattr(kept.ino, b"user.k") == b"v"
        assert c.get_inode(ln.ino).target == b"run/step-1.pt"
        assert [r.root for r in c.checkpoint_rows()] == ["/run"]
        assert c.create(R, b"new", F, 0, 0).ino > ln.ino  # inode numbers are never reused
    finally:
        c.close()

    # The bucket-restore path: the snapshot on a remote, restored on a new node.
    remote = MemoryTier("remote0", kind="s3")
    remote.put_meta(SNAPSHOT_NAME, b"".join(bytes(p) for p in frame.encode([snap], frame.digest_of(snap))))
    dest = tmp_path / "node" / "catalog.sqlite"
    dest.parent.mkdir()
    restore_catalog(dest, [remote])
    c = SqliteCatalog(dest)
    try:
        assert c.lookup(d.ino, b"step-1.pt").size == 20
        assert c.extents(kept.ino)[1].tiers == ("remote0",)
        with pytest.raises(NotFound):
            c.lookup(d.ino, b"pending.pt")  # its upload had not finished
    finally:
        c.close()


def test_a_change_on_one_node_makes_the_snapshot_stale_for_every_node(
    nodes: tuple[PostgresCatalog, PostgresCatalog], tmp_path: Path, pg_url: str
) -> None:
    _, b = nodes
    touched = threading.Event()
    a = PostgresCatalog(pg_url, hooks=CatalogHooks(on_touch=touched.set))
    try:
        b.set_meta("snapshot_of_ns", str(time.time_ns()))
        assert a.snapshot_is_current() and b.snapshot_is_current()
        a.set_meta("x", "1")  # not a namespace or content change
        assert not touched.is_set() and b.snapshot_is_current()
        a.create(R, b"f", F, 0, 0)
        assert touched.is_set()  # after the commit, in the calling thread
        assert not b.snapshot_is_current()
        # The mark never goes backwards (the nodes' clocks differ a little).
        ahead = str(time.time_ns() + 10**12)
        b.set_meta("changed_ns", ahead)
        a.create(R, b"g", F, 0, 0)
        assert b.get_meta("changed_ns") == ahead
        assert a.concurrency == 4  # the pool size: what the daemon's catalog limiter allows
    finally:
        a.close()
    s = SqliteCatalog(tmp_path / "c.sqlite")
    try:
        assert s.concurrency == 1
    finally:
        s.close()
