"""Node sessions (catalog/sessions.py) on the real PostgreSQL: two or more catalog objects
of one database stand for two nodes. Registration, heartbeat, expiry on the database's
clock, the cleanup of an expired session by another node (exactly once, with cleaners
racing), the last-closer rule for unlinked-open inodes, and the schema-4 migration of both
engines."""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.mountutil import wait_until

from ckptfs import statedir
from ckptfs.catalog import ROOT_INODE, CheckpointState, ChunkRef, PostgresCatalog, SqliteCatalog
from ckptfs.catalog.catalog import SCHEMA_VERSION
from ckptfs.catalog.rows import Registered, SessionEnd
from ckptfs.errors import CatalogUnavailable, UsageError
from ckptfs.session import NodeSession

R = ROOT_INODE
F = stat.S_IFREG | 0o644
D = stat.S_IFDIR | 0o755
CHUNK = 1 << 16


@pytest.fixture
def nodes(pg_url: str) -> Iterator[list[PostgresCatalog]]:
    """Three catalog objects of one fresh database: nodes a, b and c."""
    cats: list[PostgresCatalog] = []
    try:
        for _ in range(3):
            cats.append(PostgresCatalog(pg_url, pool_size=2))
        yield cats
    finally:
        for c in cats:
            c.close()


def wait_expired(cat: PostgresCatalog, node: str) -> None:
    """Until ``node``'s session is expired by the database's clock."""
    wait_until(lambda: not any(s.live for s in cat.sessions() if s.node == node), 10,
               f"session of {node} expired")


def file_with_chunk(cat: PostgresCatalog, parent: int, name: bytes, digest: bytes) -> int:
    ino = cat.create(parent, name, F, 0, 0).ino
    cat.commit_file(ino, 100, 1, 1, CHUNK, {0: ChunkRef(digest, 100, ("a:local0",))})
    return ino


def test_a_second_live_session_of_one_node_name_is_refused_until_it_expires(
    nodes: list[PostgresCatalog],
) -> None:
    a, b, _ = nodes
    first = a.register_session("n1", 0.5, "pid 1")
    with pytest.raises(UsageError, match="'n1'"):
        b.register_session("n1", 30)
    assert [s.node for s in b.sessions()] == ["n1"]
    b.register_session("n2", 30)  # another name is fine
    wait_expired(b, "n1")
    again = b.register_session("n1", 30)  # the old one expired: ended on the way
    assert again.previous == SessionEnd(first.sid, "n1")
    assert again.sid != first.sid
    assert not a.heartbeat_session(first.sid, 30)  # the old daemon learns it is gone
    assert b.heartbeat_session(again.sid, 30)
    assert sorted(s.node for s in a.sessions() if s.live) == ["n1", "n2"]


class LostReply(PostgresCatalog):
    """The registration commits and then the connection breaks (its reply is lost), once."""

    lose = True

    def register_session(
        self, node: str, timeout_s: float, info: str = "", sid: str | None = None,
        earlier: str = "",
    ) -> Registered:
        reg = super().register_session(node, timeout_s, info, sid, earlier)
        if self.lose:
            self.lose = False
            raise CatalogUnavailable("the connection broke during the COMMIT")
        return reg


def test_a_registration_whose_reply_was_lost_is_taken_up_by_its_retry(pg_url: str) -> None:
    """The node tries again with the id it chose: its own committed attempt is the session
    it gets, not a live session of its name that refuses it until it expires."""
    cat = LostReply(pg_url, pool_size=2)
    try:
        session = NodeSession(cat, "n1", 30)
        with pytest.raises(CatalogUnavailable):
            session.register()
        [attempt] = cat.sessions()
        session.register()
        assert session.sid == attempt.sid
        assert [(s.node, s.sid, s.live) for s in cat.sessions()] == [("n1", attempt.sid, True)]
        with pytest.raises(UsageError, match="'n1'"):  # another daemon of that name: refused
            NodeSession(cat, "n1", 30).register()
        assert cat.heartbeat_session(session.sid, 30)
    finally:
        cat.close()


class FailsOnce(PostgresCatalog):
    """The registration fails before its transaction commits (the database went away), once."""

    fail = True

    def register_session(
        self, node: str, timeout_s: float, info: str = "", sid: str | None = None,
        earlier: str = "",
    ) -> Registered:
        if self.fail:
            self.fail = False
            raise CatalogUnavailable("connection refused")
        return super().register_session(node, timeout_s, info, sid, earlier)


RESTARTED = "restarted: its previous session ended now (its daemon had this state dir"


@pytest.mark.allow_log_warnings(RESTARTED)
def test_a_daemon_restarted_on_its_state_dir_ends_its_dead_predecessors_session(
    nodes: list[PostgresCatalog], tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """The state dir records the session id before the registration; the next daemon of
    that state dir (it holds the lock, so the earlier one is dead) ends that session at
    once, live as it is. A daemon with another state dir is refused as before."""
    a, b, _ = nodes
    state, other = tmp_path / "state-a", tmp_path / "state-other"
    state.mkdir()
    other.mkdir()
    dead = NodeSession(a, "n1", 60, state_dir=state)
    dead.register()
    assert statedir.read_session_ids(state) == (dead.sid, "")
    assert os.stat(state / statedir.SESSION_FILE).st_mode & 0o777 == 0o600
    with pytest.raises(UsageError, match="node 'n1' has a live session"):
        NodeSession(b, "n1", 60, state_dir=other).register()
    again = NodeSession(b, "n1", 60, state_dir=state)  # the dead one never closed its session
    again.register()
    assert again.sid != dead.sid
    assert [(s.sid, s.live) for s in b.sessions()] == [(again.sid, True)]
    assert statedir.read_session_ids(state) == (again.sid, "")
    assert f"node n1 {RESTARTED}" in caplog.text
    assert not a.heartbeat_session(dead.sid, 60)


def test_a_dead_daemons_unanswered_registration_is_taken_up_by_the_next(
    pg_url: str, tmp_path: Path,
) -> None:
    """The registration committed, its reply was lost and the daemon exited: the state dir
    names the attempt, and the next daemon of the state dir retries it (the same id)."""
    state = tmp_path / "state"
    state.mkdir()
    cat = LostReply(pg_url, pool_size=2)
    try:
        with pytest.raises(CatalogUnavailable):
            NodeSession(cat, "n1", 30, state_dir=state).register()
        [attempt] = cat.sessions()
        assert statedir.read_session_ids(state) == ("", attempt.sid)
        restarted = NodeSession(cat, "n1", 30, state_dir=state)
        restarted.register()
        assert restarted.sid == attempt.sid
        assert [(s.sid, s.live) for s in cat.sessions()] == [(attempt.sid, True)]
        assert statedir.read_session_ids(state) == (attempt.sid, "")
    finally:
        cat.close()


@pytest.mark.allow_log_warnings(RESTARTED)
def test_a_failed_registration_keeps_the_earlier_session_id(
    pg_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A daemon killed with its session live, a restart whose registration never reached
    the database: the state dir still names the dead session, and the restart after it
    ends that session (and uses the id the failed one had recorded)."""
    state = tmp_path / "state"
    state.mkdir()
    cat = FailsOnce(pg_url, pool_size=2)
    try:
        cat.fail = False
        dead = NodeSession(cat, "n1", 30, state_dir=state)
        dead.register()
        cat.fail = True
        with pytest.raises(CatalogUnavailable):
            NodeSession(cat, "n1", 30, state_dir=state).register()
        sid, attempt = statedir.read_session_ids(state)
        assert sid == dead.sid and attempt and attempt != sid
        third = NodeSession(cat, "n1", 30, state_dir=state)
        third.register()
        assert third.sid == attempt
        assert [s.sid for s in cat.sessions()] == [attempt]
        assert RESTARTED in caplog.text
    finally:
        cat.close()


def test_a_heartbeat_extends_the_session_on_the_database_clock(
    nodes: list[PostgresCatalog], monkeypatch: pytest.MonkeyPatch,
) -> None:
    a, b, _ = nodes
    # This process's clock is a day off: the sessions must not notice (the database's is used).
    real = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real() + 86400 * 10**9)
    s = a.register_session("a", 0.3)
    row = a.sessions()[0]
    db_now = a.database_now_ns()
    assert row.expires_ns - row.started_ns == int(0.3e9)
    assert abs(row.started_ns - db_now) < 5 * 10**9  # the database's now, not this process's
    assert a.heartbeat_session(s.sid, 60)
    beat = a.sessions()[0]
    assert beat.beat_ns >= row.beat_ns and beat.expires_ns - beat.beat_ns == 60 * 10**9
    # Past the first expiry by the database's clock: the heartbeat kept it alive.
    wait_until(lambda: b.database_now_ns() > row.expires_ns + 10**8, 5, "first expiry passed")
    assert b.cleanup_expired_sessions() == []
    assert [x.live for x in b.sessions()] == [True]


def test_the_last_closer_anywhere_drops_an_unlinked_inode(nodes: list[PostgresCatalog]) -> None:
    a, b, _ = nodes
    sa, sb = a.register_session("a", 60).sid, b.register_session("b", 60).sid
    ino = file_with_chunk(a, R, b"f", b"\x01" * 32)
    a.note_open(sa, ino)
    b.note_open(sb, ino, writing=True)
    assert a.open_inodes() == {ino}
    assert b.unlink(R, b"f").nlink == 0
    assert b.delete_inode(ino) == []  # held open by sessions: stays
    assert a.get_inode(ino).nlink == 0 and a.extents(ino)
    assert b.release_inode(sb, ino) is None  # a still has it open
    assert a.get_inode(ino).ino == ino
    assert a.release_inode(sa, ino) == [b"\x01" * 32]  # the last closer drops it
    with pytest.raises(Exception, match="inode"):
        a.get_inode(ino)
    assert a.open_inodes() == set()
    with pytest.raises(Exception, match="inode"):
        a.note_open(sa, ino)  # gone: an open by number fails


def test_an_expired_session_is_cleaned_up_exactly_once_by_racing_cleaners(
    nodes: list[PostgresCatalog],
) -> None:
    a, b, c = nodes
    sa = a.register_session("a", 0.5).sid
    sb = b.register_session("b", 60).sid
    ck = a.create(R, b"ck", D, 0, 0).ino
    ck2 = a.create(R, b"ck2", D, 0, 0).ino
    orphan = file_with_chunk(a, R, b"orphan", b"\x02" * 32)  # a alone has it open
    both = file_with_chunk(a, R, b"both", b"\x03" * 32)  # a and b have it open
    shard = file_with_chunk(a, ck, b"shard0", b"\x04" * 32)  # a writes it
    shard2 = file_with_chunk(a, ck2, b"shard0", b"\x05" * 32)  # a and b write ck2
    other = file_with_chunk(a, ck2, b"shard1", b"\x06" * 32)
    for ino in (orphan, both):
        a.note_open(sa, ino)
    a.note_open(sa, shard, writing=True)
    a.note_open(sa, shard2, writing=True)
    b.note_open(sb, both)
    b.note_open(sb, other, writing=True)
    for name in (b"orphan", b"both"):
        b.unlink(R, name)
    a.checkpoint_begin("/ck", "torch", 1, 1)
    a.checkpoint_begin("/ck2", "torch", 2, 1)
    wait_expired(b, "a")

    results: list[list[SessionEnd]] = []
    barrier = threading.Barrier(4)

    def clean(cat: PostgresCatalog) -> None:
        barrier.wait()
        results.append(cat.cleanup_expired_sessions())

    cleaners = [b, c, b, c]
    threads = [threading.Thread(target=clean, args=(x,)) for x in cleaners]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    ended = [e for r in results for e in r]
    assert len(results) == 4 and len(ended) == 1, results
    end = ended[0]
    assert (end.sid, end.node, end.handles) == (sa, "a", 4)
    assert end.dropped == (orphan,) and end.digests == (b"\x02" * 32,)
    assert end.partial == ("/ck",)  # /ck2 has a live writer (b)
    with pytest.raises(Exception, match="inode"):
        b.get_inode(orphan)
    assert b.get_inode(both).nlink == 0  # b still holds it
    assert b.get_inode(shard).size == 100 and b.extents(shard)[0].digest == b"\x04" * 32
    states = {r.root: r.state for r in b.checkpoint_rows("/")}
    assert states == {"/ck": CheckpointState.PARTIAL, "/ck2": CheckpointState.WRITING}
    assert b.open_inodes() == {both, other}
    assert [s.node for s in b.sessions()] == ["b"]
    assert b.cleanup_expired_sessions() == []
    assert not a.heartbeat_session(sa, 60)
    assert b.release_inode(sb, both) == [b"\x03" * 32]


def test_a_closed_session_releases_its_handles(nodes: list[PostgresCatalog]) -> None:
    a, b, _ = nodes
    sa = a.register_session("a", 60).sid
    ino = file_with_chunk(a, R, b"f", b"\x07" * 32)
    a.note_open_many(sa, [(ino, True), (999999, False)])  # a gone inode is skipped
    b.unlink(R, b"f")
    end = a.close_session(sa)
    assert (end.handles, end.dropped, end.digests, end.partial) == (1, (ino,), (b"\x07" * 32,), ())
    assert a.sessions() == [] and a.open_inodes() == set()
    a.note_open(a.register_session("a", 60).sid, R)  # the name is free again


def test_sqlite_sessions_work_for_its_one_node(tmp_path: Path) -> None:
    c = SqliteCatalog(tmp_path / "c.sqlite")
    try:
        s = c.register_session("solo", 60)
        with pytest.raises(UsageError, match="'solo'"):
            c.register_session("solo", 60)
        assert c.heartbeat_session(s.sid, 60)
        assert abs(c.database_now_ns() - time.time_ns()) < 5 * 10**9
        ino = c.create(R, b"f", F, 0, 0).ino
        c.note_open(s.sid, ino)
        c.unlink(R, b"f")
        assert c.delete_inode(ino) == [] and c.get_inode(ino).nlink == 0
        assert c.release_inode(s.sid, ino) == []
        assert c.close_session(s.sid).handles == 0
    finally:
        c.close()


def test_a_version_3_sqlite_catalog_gets_the_sessions_tables(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    c = SqliteCatalog(path)
    ino = c.create(R, b"keep", F, 0, 0).ino
    c.close()
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE open_handles")
    conn.execute("DROP TABLE sessions")
    conn.execute("UPDATE meta SET value='3' WHERE key='schema_version'")
    conn.commit()
    conn.close()
    c = SqliteCatalog(path)
    try:
        assert c.get_meta("schema_version") == str(SCHEMA_VERSION)
        assert c.lookup(R, b"keep").ino == ino
        c.note_open(c.register_session("solo", 60).sid, ino)
        assert c.open_inodes() == {ino}
    finally:
        c.close()


def test_a_version_3_postgres_catalog_gets_the_sessions_tables(pg_url: str) -> None:
    c = PostgresCatalog(pg_url, pool_size=1)
    ino = c.create(R, b"keep", F, 0, 0).ino
    c.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP TABLE open_handles")
        conn.execute("DROP TABLE sessions")
        conn.execute("UPDATE meta SET value='3' WHERE key='schema_version'")
    with pytest.raises(Exception, match="migration"):
        PostgresCatalog(pg_url, pool_size=1, readonly=True)
    c = PostgresCatalog(pg_url, pool_size=1)
    try:
        assert c.get_meta("schema_version") == str(SCHEMA_VERSION)
        assert c.lookup(R, b"keep").ino == ino
        sid = c.register_session("a", 60).sid
        c.note_open(sid, ino)
        assert c.open_inodes() == {ino}
        with pytest.raises(UsageError):
            c.register_session("a", 60)  # the UNIQUE node key came with the migration
    finally:
        c.close()
