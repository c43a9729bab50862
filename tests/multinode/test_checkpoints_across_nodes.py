"""Checkpoint awareness across nodes (docs/multinode.md "Checkpoints across nodes"): real
mounts of several nodes on one real PostgreSQL catalog and one real SeaweedFS bucket. A
checkpoint whose shards several nodes write commits only when the framework's marker is
there and every file under it is closed on every node; no node marks partial what
another still writes; `ckptfs latest` gives the same answer on every node and never
names a checkpoint with a file open for writing anywhere, nor one whose chunks only a
dead node held. The DCP file sequence is driven by hand: each rank writes its
``__R_0.distcp``, rank 0 then writes ``.metadata.tmp`` and renames it to ``.metadata``."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from tests.conftest import CkptFactory
from tests.multinode.conftest import Cluster, sync
from tests.support.freeze import freeze
from tests.support.mountutil import Mount, run_cli, wait_until
from tests.support.s3server import SeaweedServer

from ckptfs.catalog import CheckpointState, PostgresCatalog
from ckptfs.checkpoints import tracker as tracker_mod
from ckptfs.checkpoints.detectors import DetectorSet
from ckptfs.checkpoints.events import FsEvent
from ckptfs.checkpoints.tracker import CheckpointTracker

pytestmark = pytest.mark.usefixtures("postgres")

SESSION_TIMEOUT = 2.0  # s; the heartbeat runs every fifth of it
SHARD = 300 * 1024  # a couple of 256 KiB chunks per shard



@pytest.fixture
def db(pg_url: str) -> Iterator[list[PostgresCatalog]]:
    """The shared catalog read beside the nodes: ``cat(db)`` opens it once a node made
    the schema."""
    cats: list[PostgresCatalog] = []
    yield cats
    for c in cats:
        c.close()


def cat(db: list[PostgresCatalog], url: str) -> PostgresCatalog:
    if not db:
        db.append(PostgresCatalog(url, pool_size=1, readonly=True))
    return db[0]


def config(tmp_path: Path, **keys: float) -> list[str]:
    path = tmp_path / f"node-{uuid.uuid4().hex[:6]}.toml"
    path.write_text("".join(f"{k} = {v}\n" for k, v in keys.items()))
    return ["--config", str(path)]


def state(c: PostgresCatalog, root: str) -> CheckpointState | None:
    rows = [r for r in c.checkpoint_rows(root) if r.root == root]
    return rows[0].state if rows else None


def is_partial(c: PostgresCatalog, root: str) -> bool:
    return state(c, root) is CheckpointState.PARTIAL


def shard(m: Mount, ckpt: str, rank: int) -> None:
    (m.mountpoint / ckpt / f"__{rank}_0.distcp").write_bytes(os.urandom(SHARD))


def write_meta(m: Mount, ckpt: str) -> None:
    (m.mountpoint / ckpt / ".metadata.tmp").write_bytes(json.dumps({"ranks": 2}).encode() * 8)


def rename_meta(m: Mount, ckpt: str) -> None:
    d = m.mountpoint / ckpt
    os.rename(d / ".metadata.tmp", d / ".metadata")


def marker(m: Mount, ckpt: str) -> None:
    """Rank 0's commit: .metadata written under a temp name, renamed onto .metadata."""
    write_meta(m, ckpt)
    rename_meta(m, ckpt)


def open_shard(m: Mount, ckpt: str, rank: int) -> int:
    """Rank ``rank`` writing its shard on node ``m``, not closed yet: its fd."""
    fd = os.open(m.mountpoint / ckpt / f"__{rank}_0.distcp", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, os.urandom(SHARD // 2))
    return fd


def barrier(m: Mount, c: PostgresCatalog, tag: str) -> None:
    """Every event node ``m`` pushed before now was handled by its tracker: it handles
    them in order, and this file's begin is recorded after them."""
    (m.mountpoint / "sentinel").mkdir(exist_ok=True)
    (m.mountpoint / "sentinel" / f"{tag}.safetensors").write_bytes(b"\x08" + b"\x00" * 15)
    wait_until(lambda: state(c, f"/sentinel/{tag}.safetensors") is not None, 10,
               f"node {m.state_dir.parent.name}'s tracker caught up ({tag})")


def latest(m: Mount, run: str) -> str | None:
    """`ckptfs latest RUN` on node ``m``: the checkpoint inside the mount, or None."""
    res = run_cli("latest", str(m.mountpoint / run), timeout=60)
    if res.returncode == 1 and "no committed checkpoint" in res.stderr:
        return None
    assert res.returncode == 0, res.stderr
    out = res.stdout.strip()
    assert out.startswith(str(m.mountpoint)), out
    return out[len(str(m.mountpoint)):]


def ls(m: Mount, run: str) -> dict[str, dict[str, object]]:
    res = run_cli("ls", str(m.mountpoint / run), "--json", timeout=60)
    assert res.returncode == 0, res.stderr
    return {c["root"]: c for c in json.loads(res.stdout)}


def two_nodes(cluster: Cluster, run: str, *conf: str) -> tuple[Mount, Mount]:
    a, b = cluster.node("a", *conf), cluster.node("b", *conf)
    (a.mountpoint / run).mkdir(parents=True)
    wait_until(lambda: (b.mountpoint / run).is_dir(), 5, "b sees the run directory")
    return a, b


def new_step(a: Mount, b: Mount, ckpt: str) -> None:
    (a.mountpoint / ckpt).mkdir()
    wait_until(lambda: (b.mountpoint / ckpt).is_dir(), 5, f"b sees {ckpt}")


def save(a: Mount, b: Mount, ckpt: str, c: PostgresCatalog) -> None:
    """A 2-rank save: rank 0 through node a, rank 1 through node b, marker by rank 0."""
    new_step(a, b, ckpt)
    shard(a, ckpt, 0)
    shard(b, ckpt, 1)
    marker(a, ckpt)
    wait_until(lambda: state(c, "/" + ckpt) is CheckpointState.COMMITTED, 10,
               f"{ckpt} committed")


@pytest.mark.slow
def test_a_commit_waits_for_a_shard_still_open_on_another_node(
    cluster: Cluster, db: list[PostgresCatalog], pg_url: str,
) -> None:
    a, b = two_nodes(cluster, "run")
    c = cat(db, pg_url)
    save(a, b, "run/step-1", c)
    assert latest(a, "run") == latest(b, "run") == "/run/step-1"
    new_step(a, b, "run/step-2")
    shard(a, "run/step-2", 0)
    fd = open_shard(b, "run/step-2", 1)  # rank 1 still writing on node b
    try:
        write_meta(a, "run/step-2")
        # Node a's own handles are gone (FUSE releases them after close returned): only
        # b's writer is left, so what holds the commit below is node b's.
        wait_until(lambda: c.open_writer_paths() == ["/run/step-2/__1_0.distcp"], 10,
                   "a released its handles")
        rename_meta(a, "run/step-2")  # rank 0's commit signal on node a
        barrier(a, c, "after-marker")
        # Held: node b has a file under it open for writing.
        assert state(c, "/run/step-2") is CheckpointState.WRITING
        assert latest(a, "run") == latest(b, "run") == "/run/step-1"
        assert ls(a, "run")["/run/step-2"]["open_writers"] == 1
        os.write(fd, os.urandom(SHARD // 2))
    finally:
        os.close(fd)
    # b's last writer closed: a's tick releases the held commit.
    wait_until(lambda: state(c, "/run/step-2") is CheckpointState.COMMITTED, 10,
               "step-2 committed once b closed")
    assert latest(a, "run") == latest(b, "run") == "/run/step-2"
    views = [ls(m, "run")["/run/step-2"] for m in (a, b)]
    assert views[0] == {**views[1], "path": views[0]["path"]}  # one answer, but the mount
    assert views[0]["open_writers"] == 0 and views[0]["missing_chunks"] == 0
    # A committed checkpoint with a file open for writing on some node is not the latest,
    # even before that node writes (no event yet, the row still says committed).
    fd = os.open(b.mountpoint / "run/step-2/__1_0.distcp", os.O_WRONLY)
    try:
        wait_until(lambda: c.open_writer_paths() == ["/run/step-2/__1_0.distcp"], 10,
                   "b's writer noted in the catalog")
        assert state(c, "/run/step-2") is CheckpointState.COMMITTED
        assert latest(a, "run") == latest(b, "run") == "/run/step-1"
    finally:
        os.close(fd)
    wait_until(lambda: c.open_writer_paths() == [], 10, "b's writer released")
    assert latest(a, "run") == latest(b, "run") == "/run/step-2"


@pytest.mark.slow
@pytest.mark.allow_log_warnings("is partial: it began but never committed")  # the controls
def test_no_node_marks_partial_a_checkpoint_another_node_still_writes(
    cluster: Cluster, db: list[PostgresCatalog], pg_url: str, tmp_path: Path,
) -> None:
    partial_after = 2.0
    a, b = two_nodes(cluster, "run", *config(tmp_path, checkpoint_partial_after=partial_after))
    c = cat(db, pg_url)
    new_step(a, b, "run/step-1")
    fd = open_shard(a, "run/step-1", 0)  # rank 0 keeps writing on node a
    try:
        shard(b, "run/step-1", 1)  # rank 1 on node b is done: b has no writer under it
        wait_until(lambda: state(c, "/run/step-1") is CheckpointState.WRITING, 10, "begun")
        # Time enough for b (and a) to have marked it: three checkpoints begun one after
        # the other, each after the last became partial, with nobody writing under them
        # (3 x partial_after; the old count marked it within partial_after + 2 ticks).
        for n in (1, 2, 3):
            ctl = f"ctl/step-{n}"
            (b.mountpoint / ctl).mkdir(parents=True)
            shard(b, ctl, 0)
            root = "/" + ctl
            wait_until(functools.partial(is_partial, c, root), partial_after + 10,
                       f"{ctl} partial")
        assert state(c, "/run/step-1") is CheckpointState.WRITING
        os.write(fd, os.urandom(SHARD // 2))
    finally:
        os.close(fd)
    marker(a, "run/step-1")
    wait_until(lambda: state(c, "/run/step-1") is CheckpointState.COMMITTED, 10, "committed")
    assert latest(a, "run") == latest(b, "run") == "/run/step-1"


@pytest.mark.slow
@pytest.mark.allow_log_warnings("session expired: cleaned up after it")  # b, after a
def test_a_node_killed_in_a_two_node_save_never_makes_it_the_latest(
    cluster: Cluster, db: list[PostgresCatalog], pg_url: str, tmp_path: Path,
) -> None:
    conf = config(tmp_path, session_timeout=SESSION_TIMEOUT)
    a, b = two_nodes(cluster, "run", *conf)
    c = cat(db, pg_url)
    save(a, b, "run/step-1", c)
    sync(a, a.mountpoint / "run/step-1")  # on the bucket: readable without node a
    sync(b, b.mountpoint / "run/step-1")
    new_step(a, b, "run/step-2")
    fd = open_shard(a, "run/step-2", 0)  # rank 0 mid-write when its node dies
    try:
        shard(b, "run/step-2", 1)
        wait_until(lambda: state(c, "/run/step-2") is CheckpointState.WRITING, 10, "begun")
        a.kill9()
        assert latest(b, "run") == "/run/step-1"
        wait_until(lambda: {s.node for s in c.sessions()} == {"b"},
                   SESSION_TIMEOUT * 1.2 + 10, "b cleans up after a")
    finally:
        with contextlib.suppress(OSError):  # a's mount is dead
            os.close(fd)
    assert "node a's session expired: cleaned up after it" in b.log
    assert c.open_writer_paths() == []
    [row] = [r for r in c.checkpoint_rows("/run/step-2") if r.root == "/run/step-2"]
    assert row.state is CheckpointState.PARTIAL and "its node a died" in (row.reason or ""), row
    fresh = cluster.node("c", *conf)  # a new node, empty state dir
    assert latest(b, "run") == latest(fresh, "run") == "/run/step-1"
    views = [ls(m, "run") for m in (b, fresh)]
    assert {r: v["state"] for r, v in views[0].items()} == {
        r: v["state"] for r, v in views[1].items()} == {
        "/run/step-1": "committed", "/run/step-2": "partial"}
    # b keeps working: its next save (both ranks on b now) becomes the latest everywhere.
    (b.mountpoint / "run/step-3").mkdir()
    shard(b, "run/step-3", 0)
    shard(b, "run/step-3", 1)
    marker(b, "run/step-3")
    wait_until(lambda: state(c, "/run/step-3") is CheckpointState.COMMITTED, 10, "step-3")
    assert latest(b, "run") == latest(fresh, "run") == "/run/step-3"


@pytest.mark.slow
@pytest.mark.allow_log_warnings()  # the frozen bucket's uploads and snapshots; b's cleanup
def test_latest_skips_a_checkpoint_only_a_dead_node_held(
    ckpt_factory: CkptFactory, db: list[PostgresCatalog], pg_url: str,
    own_seaweed: SeaweedServer, tmp_path: Path,
) -> None:
    url = f"s3://{own_seaweed.bucket}/mn-{uuid.uuid4().hex[:10]}?endpoint={own_seaweed.endpoint}"
    cluster = Cluster(ckpt_factory, pg_url, url)
    conf = config(tmp_path, session_timeout=SESSION_TIMEOUT)
    a, b = two_nodes(cluster, "run", *conf)
    c = cat(db, pg_url)
    save(a, b, "run/step-1", c)
    sync(a, a.mountpoint / "run/step-1")
    sync(b, b.mountpoint / "run/step-1")
    assert own_seaweed.proc is not None
    freeze(own_seaweed.proc.pid)  # the bucket hangs: a's uploads cannot finish
    try:
        new_step(a, b, "run/step-2")  # both ranks through node a this time
        shard(a, "run/step-2", 0)
        shard(a, "run/step-2", 1)
        marker(a, "run/step-2")
        wait_until(lambda: state(c, "/run/step-2") is CheckpointState.COMMITTED, 10, "step-2")
        # Node a is alive: its local tiers are readable (a read elsewhere waits for them).
        assert latest(b, "run") == "/run/step-2"
        a.kill9()
        wait_until(lambda: not any(s.live for s in c.sessions() if s.node == "a"),
                   SESSION_TIMEOUT + 10, "a's session expired")
        # Lost with it: what only its local tiers held. Every node says so.
        assert latest(b, "run") == "/run/step-1"
        step2 = ls(b, "run")["/run/step-2"]
        missing = step2["missing_chunks"]
        assert step2["state"] == "committed" and isinstance(missing, int) and missing > 0, step2
    finally:
        os.kill(own_seaweed.proc.pid, signal.SIGCONT)
    wait_until(lambda: {s.node for s in c.sessions()} == {"b"},
               SESSION_TIMEOUT * 1.2 + 10, "b cleans up after a")
    fresh = cluster.node("c", *conf)
    assert latest(b, "run") == latest(fresh, "run") == "/run/step-1"
    assert ls(fresh, "run")["/run/step-1"]["missing_chunks"] == 0


# -- two trackers on one real catalog: what a late batch of one node may not undo -----------


def _tracker(catalog: PostgresCatalog) -> CheckpointTracker:
    return CheckpointTracker(catalog, trio.CapacityLimiter(1), DetectorSet.default(),
                             lambda: [], shared=True)


def test_a_late_begin_of_another_node_never_undoes_its_commit(
    pg_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Node b's begin of a shard it wrote during the save, recorded after node a
    committed the checkpoint (b's batch was slow), leaves it committed, also when b's
    clock runs 5 s ahead of the others (the times recorded are the database's)."""
    catalog = PostgresCatalog(pg_url, pool_size=2)
    try:
        ta, tb = _tracker(catalog), _tracker(catalog)
        ta._measure_clock()
        skew = 5_000_000_000
        real = time.time_ns
        # From here on only node b's tracker reads the clock: it runs 5 s ahead.
        monkeypatch.setattr(tracker_mod.time, "time_ns", lambda: real() + skew)
        tb._measure_clock()  # node b measures its clock's offset to the database's
        assert abs(tb.clock_offset_ns + skew) < 1_000_000_000, tb.clock_offset_ns
        root = "/run/step-1"
        t0, s = real(), 1_000_000_000
        ta._observe([
            FsEvent("create", f"{root}/__0_0.distcp", t0),
            FsEvent("create", f"{root}/.metadata.tmp", t0 + s),
            FsEvent("rename", f"{root}/.metadata", t0 + 2 * s, src=f"{root}/.metadata.tmp"),
        ], [])
        assert state(catalog, root) is CheckpointState.COMMITTED
        # b's shard was created before a's rename (real time), stamped by b's clock; b's
        # batch lands after a's commit.
        tb._observe([FsEvent("create", f"{root}/__1_0.distcp", t0 + s + skew)], [])
        [row] = catalog.checkpoint_rows(root)
        assert row.state is CheckpointState.COMMITTED, row
        assert abs((row.commit_ns or 0) - (t0 + 2 * s)) < s // 2, row  # a's time, the database's clock
        # b's tick learns of a's commit; a real rewrite on b later starts it over.
        tb._tick([], real() + skew)
        assert tb.detectors.open_roots() == []  # type: ignore[attr-defined]
        tb._observe([FsEvent("write", f"{root}/__1_0.distcp", t0 + 5 * s + skew)], [])
        assert state(catalog, root) is CheckpointState.WRITING
    finally:
        catalog.close()


def test_open_writer_paths_and_conditional_states_on_the_shared_catalog(pg_url: str) -> None:
    catalog = PostgresCatalog(pg_url, pool_size=1)
    try:
        run = catalog.create(1, b"run", 0o40755, 0, 0)
        f = catalog.create(run.ino, b"w.bin", 0o100644, 0, 0)
        r = catalog.create(run.ino, b"r.bin", 0o100644, 0, 0)
        sa = catalog.register_session("a", 30).sid
        sb = catalog.register_session("b", 30).sid
        catalog.note_open(sa, f.ino, writing=True)
        catalog.note_open(sb, r.ino, writing=False)
        assert catalog.open_writer_paths() == ["/run/w.bin"]
        catalog.release_inode(sa, f.ino)
        assert catalog.open_writer_paths() == []
        catalog.checkpoint_commit("/run", "dcp", 1, 10, "marker")
        assert not catalog.checkpoint_set_state("/run", CheckpointState.PARTIAL, "quiet",
                                                only_from=CheckpointState.WRITING)
        assert state(catalog, "/run") is CheckpointState.COMMITTED
    finally:
        catalog.close()
