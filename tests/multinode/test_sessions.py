"""Node sessions on real mounts (docs/multinode.md "Node sessions"): two nodes on one real
PostgreSQL catalog and one SeaweedFS bucket. A file unlinked on one node while another
reads it stays until its last closer anywhere; a node killed with -9 is cleaned up by the
live one within session_timeout and a heartbeat, or at once by its own restart on the same
state dir."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path

import pytest

from tests.conftest import TEST_MOUNT_ARGS
from tests.multinode.conftest import Cluster, Db, sync
from tests.support.mountutil import Mount, wait_until

from ckptfs.catalog import CheckpointState, PostgresCatalog

pytestmark = pytest.mark.usefixtures("postgres")

SESSION_TIMEOUT = 2.0  # s; the heartbeat runs every fifth of it






def short_sessions(tmp_path: Path) -> list[str]:
    cfg = tmp_path / "sessions.toml"
    cfg.write_text(f"session_timeout = {SESSION_TIMEOUT}\n")
    return ["--config", str(cfg)]


def frames_on(m: Mount, hexes: set[str]) -> set[str]:
    return {p.name for d in m.locals for p in d.rglob("*") if p.name in hexes}


def digests_of(cat: PostgresCatalog, ino: int) -> set[str]:
    return {r.digest.hex() for r in cat.extents(ino).values()}


def test_a_file_unlinked_on_one_node_stays_while_another_reads_it(
    cluster: Cluster, db: Db,
) -> None:
    a, b = cluster.node("a"), cluster.node("b")
    data = os.urandom(5 * 256 * 1024 + 77)  # several chunks and a partial one
    path = "weights.bin"
    (a.mountpoint / path).write_bytes(data)
    ino = os.stat(a.mountpoint / path).st_ino
    cat = db()
    hexes = digests_of(cat, ino)
    assert len(hexes) == 6 and frames_on(a, hexes) == hexes
    with open(a.mountpoint / path, "rb") as f:
        head = f.read(256 * 1024)
        wait_until(lambda: (b.mountpoint / path).exists(), 5, "b sees the file")
        os.unlink(b.mountpoint / path)
        assert not (b.mountpoint / path).exists()
        # Node a holds it open: the catalog keeps it (no name, its extents) for a.
        kept = cat.get_inode(ino)
        assert kept.nlink == 0 and digests_of(cat, ino) == hexes
        assert {s.node for s in cat.sessions()} == {"a", "b"}
        assert cat.open_inodes() == {ino}
        rest = f.read()
        assert head + rest == data  # bit-identical after the unlink elsewhere
        f.seek(3 * 256 * 1024)
        assert f.read(1000) == data[3 * 256 * 1024:3 * 256 * 1024 + 1000]
    # a closed its last handle: the last closer drops the inode, its chunks are collected
    # (rows gone, frames deleted from a's local tiers by the deletion queue).
    wait_until(lambda: ino not in cat.unlinked_inodes() and not cat.open_inodes(), 10,
               "the inode dropped")
    with pytest.raises(Exception, match="inode"):
        cat.get_inode(ino)
    wait_until(lambda: not any(cat.has_chunk(bytes.fromhex(h)) for h in hexes), 10,
               "chunk rows dropped")
    wait_until(lambda: not frames_on(a, hexes), 20, "frames deleted from a's local tiers")
    # A file unlinked on b while no node holds it open is dropped at once, as before.
    (b.mountpoint / "tmp.bin").write_bytes(b"x" * 1000)
    tmp_ino = os.stat(b.mountpoint / "tmp.bin").st_ino
    os.unlink(a.mountpoint / "tmp.bin")
    wait_until(lambda: tmp_ino not in cat.unlinked_inodes(), 5, "tmp dropped")
    with pytest.raises(Exception, match="inode"):
        cat.get_inode(tmp_ino)


@pytest.mark.slow
@pytest.mark.allow_log_warnings("session expired: cleaned up after it")  # b, after a
def test_a_killed_node_is_cleaned_up_by_a_live_one(
    cluster: Cluster, db: Db, tmp_path: Path,
) -> None:
    conf = short_sessions(tmp_path)
    a, b = cluster.node("a", *conf), cluster.node("b", *conf)
    v1 = os.urandom(2 * 256 * 1024 + 5)
    (a.mountpoint / "ckpt.pt").write_bytes(v1)
    (a.mountpoint / "scratch.bin").write_bytes(os.urandom(300 * 1024))
    sync(a, a.mountpoint / "ckpt.pt")  # on the bucket: b can read a's last commit
    cat = db()
    ino = os.stat(a.mountpoint / "ckpt.pt").st_ino
    scratch = os.stat(a.mountpoint / "scratch.bin").st_ino
    reader = os.open(a.mountpoint / "scratch.bin", os.O_RDONLY)
    writer = os.open(a.mountpoint / "ckpt.pt", os.O_WRONLY)
    try:
        os.write(writer, os.urandom(256 * 1024))  # uncommitted: in a's memory only
        os.unlink(b.mountpoint / "scratch.bin")
        assert cat.get_inode(scratch).nlink == 0  # a holds it open
        assert cat.open_inodes() == {ino, scratch}
        beats = [s.beat_ns for s in cat.sessions()]
        wait_until(lambda: all(s.beat_ns > x for s, x in zip(cat.sessions(), beats, strict=True)),
                   5, "both nodes heartbeat")
        # The single-file checkpoint a rewrites: its detector saw the new write begin.
        wait_until(lambda: [r.state for r in cat.checkpoint_rows("/ckpt.pt")]
                   == [CheckpointState.WRITING], 10, "a's checkpoint is writing")
        a.kill9()
        killed = time.monotonic()
        assert "a" in {s.node for s in cat.sessions()}
        wait_until(lambda: {s.node for s in cat.sessions()} == {"b"},
                   SESSION_TIMEOUT + SESSION_TIMEOUT / 5 + 5, "b cleans up after a")
        took = time.monotonic() - killed
        # Not before the session expired (a's last heartbeat was at most a period before
        # the kill), and within the timeout and a heartbeat (and the test's slack).
        assert took >= SESSION_TIMEOUT * 4 / 5 - 0.1, took
    finally:
        for fd in (reader, writer):
            with contextlib.suppress(OSError):  # a's mount is dead
                os.close(fd)
    assert cat.open_inodes() == set()
    with pytest.raises(Exception, match="inode"):
        cat.get_inode(scratch)  # unlinked while a held it: dropped by b's cleanup
    assert cat.get_inode(ino).size == len(v1)
    assert (b.mountpoint / "ckpt.pt").read_bytes() == v1  # a's last commit
    row = cat.checkpoint_rows("/ckpt.pt")[0]  # its writer died: never the latest
    assert row.state is CheckpointState.PARTIAL and "its node a died" in (row.reason or "")
    assert "node a's session expired: cleaned up after it" in b.log
    # b keeps working: it writes, reads and removes in the namespace a left.
    (b.mountpoint / "after.bin").write_bytes(b"b" * 4096)
    assert (b.mountpoint / "after.bin").read_bytes() == b"b" * 4096
    os.unlink(b.mountpoint / "ckpt.pt")
    assert sorted(os.listdir(b.mountpoint)) == ["after.bin"]


RESTARTED = ("node a restarted: its previous session ended now (its daemon had this state "
             "dir and is gone: its lock is free); 2 open handle(s) released, 1 unlinked "
             "inode(s) dropped, partial: /ckpt.pt")


@pytest.mark.allow_log_errors  # the other state dir's "mount refused"
@pytest.mark.allow_log_warnings(RESTARTED, "cleaning up stale mount")
def test_a_killed_daemon_restarted_on_its_state_dir_ends_its_own_session_at_once(
    cluster: Cluster, db: Db, tmp_path: Path,
) -> None:
    """systemd's restart of a SIGKILLed daemon: the same state dir and node name, mounted
    again at once. The new daemon holds the state dir's lock, so the live session the state
    dir names is a dead daemon's: ended (as restarted) and replaced, with no wait for its
    expiry (an hour here). Another state dir with the node name is still refused."""
    conf = tmp_path / "long-sessions.toml"
    conf.write_text("session_timeout = 3600\n")
    a = cluster.node("a", "--config", str(conf))
    v1 = os.urandom(2 * 256 * 1024 + 5)
    (a.mountpoint / "ckpt.pt").write_bytes(v1)
    (a.mountpoint / "scratch.bin").write_bytes(os.urandom(300 * 1024))
    cat = db()
    ino = os.stat(a.mountpoint / "ckpt.pt").st_ino
    scratch = os.stat(a.mountpoint / "scratch.bin").st_ino
    reader = os.open(a.mountpoint / "scratch.bin", os.O_RDONLY)
    writer = os.open(a.mountpoint / "ckpt.pt", os.O_WRONLY)
    try:
        os.write(writer, os.urandom(256 * 1024))  # uncommitted: in a's memory only
        os.unlink(a.mountpoint / "scratch.bin")  # a holds it open: it stays for a
        wait_until(lambda: cat.open_inodes() == {ino, scratch}, 10, "a's open files noted")
        wait_until(lambda: [r.state for r in cat.checkpoint_rows("/ckpt.pt")]
                   == [CheckpointState.WRITING], 10, "a's checkpoint is writing")
        [dead] = cat.sessions()
        a.kill9()
    finally:
        for fd in (reader, writer):
            with contextlib.suppress(OSError):  # a's mount is dead
                os.close(fd)
    assert [(s.sid, s.live) for s in cat.sessions()] == [(dead.sid, True)]  # live for an hour
    a.start()  # at once, as systemd's Restart=on-failure does
    [new] = cat.sessions()
    assert new.live and new.sid != dead.sid and new.info.endswith(f"pid {a.pid}")
    assert RESTARTED in a.log
    assert cat.open_inodes() == set()
    with pytest.raises(Exception, match="inode"):
        cat.get_inode(scratch)  # unlinked while only the dead daemon held it: dropped
    row = cat.checkpoint_rows("/ckpt.pt")[0]  # its writer died: never the latest
    assert row.state is CheckpointState.PARTIAL and "its node a restarted" in (row.reason or "")
    assert (a.mountpoint / "ckpt.pt").read_bytes() == v1  # the dead daemon's last commit
    assert sorted(os.listdir(a.mountpoint)) == ["ckpt.pt"]
    with pytest.raises(RuntimeError, match=r"ckptfs mount failed \(2\).*node 'a' has a live session"):
        cluster.factory.mount(  # another state dir, the same node name: a lives
            extra_args=[*TEST_MOUNT_ARGS, "--catalog", cluster.catalog, "--node", "a",
                        "--remote", cluster.remote], name="a-other")
    assert [s.sid for s in cat.sessions()] == [new.sid]
    (a.mountpoint / "after.bin").write_bytes(b"a" * 4096)  # the restarted daemon serves
    a.stop()
    assert cat.sessions() == []


@pytest.mark.allow_log_errors  # the second daemon's "mount refused"
def test_a_second_daemon_with_a_live_node_name_is_refused(cluster: Cluster, db: Db) -> None:
    a = cluster.node("a")
    (a.mountpoint / "f").write_bytes(b"a's")
    with pytest.raises(RuntimeError, match=r"ckptfs mount failed \(2\).*node 'a' has a live session"):
        cluster.factory.mount(  # another state dir, the same node name
            extra_args=[*TEST_MOUNT_ARGS, "--catalog", cluster.catalog, "--node", "a",
                        "--remote", cluster.remote], name="a-again")
    assert [s.node for s in db().sessions()] == ["a"]
    # Refused before it recorded anything: a's local tiers are still a's directories.
    paths = {t["name"]: t.get("path") for t in json.loads(db().get_meta("tiers") or "[]")}
    assert paths["a:local0"] == str(a.locals[0]), paths
    assert (a.mountpoint / "f").read_bytes() == b"a's"  # the first daemon goes on
    a.stop()
    assert db().sessions() == []  # closed at unmount
