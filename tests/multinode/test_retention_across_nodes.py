"""Retention across nodes (docs/multinode.md "Retention across nodes"): real mounts a and b
on one real PostgreSQL catalog and one SeaweedFS bucket.

* Node a's retention never expires a checkpoint whose file node b holds open: b reads on,
  bit-identical, and the checkpoint's chunks stay on every tier; once b closes it, a pass
  expires it and its chunks go from the bucket and from the local tiers of both nodes
  (b's deletion queue finds the rows a queued for b's tiers).
* A file unlinked on one node leaves no copy on another node's local tiers: the other
  node's deletion queue looks for the rows queued for its tiers (no event crosses nodes).
* Both nodes run a janitor on the shared catalog, but a retention pass runs on one node
  at a time (the catalog's cluster-wide lock): two `ckptfs gc` at once on two nodes expire
  each checkpoint once, and delete it whole.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import CkptFactory
from tests.mount.test_checkpoints import hf_save, states
from tests.multinode.conftest import Cluster, Db, sync
from tests.multinode.test_sessions import frames_on
from tests.support.mountutil import Mount, run_cli, wait_until
from tests.support.s3server import SeaweedServer

from ckptfs.catalog import PostgresCatalog, SqliteCatalog

pytestmark = pytest.mark.usefixtures("postgres")

CS = 256 * 1024



def keep_one(tmp_path: Path) -> list[str]:
    cfg = tmp_path / "retention.toml"
    cfg.write_text('[[retention]]\npath = "/run"\nkeep_local = 1\nkeep = 1\n')
    return ["--config", str(cfg)]


def hexes_under(cat: PostgresCatalog, root: str) -> set[str]:
    return {d.hex() for d in cat.digests_under([root])}


def in_bucket(seaweed: SeaweedServer, prefix: str, hexes: set[str]) -> set[str]:
    client = seaweed.client()
    try:
        found: set[str] = set()
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=seaweed.bucket, Prefix=f"{prefix}/chunks/")
        for page in pages:
            found |= {o["Key"].rsplit("/", 1)[1] for o in page.get("Contents") or ()}
        return found & hexes
    finally:
        client.close()


def gc(m: Mount, path: Path) -> None:
    res = run_cli("gc", str(path), timeout=120)
    assert res.returncode == 0, res.stderr


def committed(run: Path, step: int) -> Callable[[], bool]:
    return lambda: states(run).get(f"/run/checkpoint-{step}") == "committed"


@pytest.mark.slow
def test_retention_on_one_node_spares_what_another_reads_then_deletes_it_everywhere(
    ckpt_factory: CkptFactory, pg_url: str, remote: tuple[str, str], seaweed: SeaweedServer,
    tmp_path: Path, db: Db,
) -> None:
    cluster = Cluster(ckpt_factory, pg_url, remote[0])
    a, b = cluster.node("a", *keep_one(tmp_path)), cluster.node("b")
    run = a.mountpoint / "run"
    payloads = {step: os.urandom(6 * CS + step) for step in (1, 2, 3)}
    hf_save(run, 1, payloads[1])
    wait_until(committed(run, 1), 30, "checkpoint 1 committed")
    sync(a, run / "checkpoint-1")  # on the bucket: b reads it from there
    ckpt1 = hexes_under(db(), "/run/checkpoint-1")

    with open(b.mountpoint / "run" / "checkpoint-1" / "model.safetensors", "rb") as f:
        head = f.read(2 * CS)  # b holds a file of checkpoint 1 open, part read
        for step in (2, 3):
            hf_save(run, step, payloads[step])
            wait_until(committed(run, step), 30, f"checkpoint {step} committed")
        sync(a, run)
        gc(a, run)  # retention wants checkpoints 1 and 2 gone (keep = 1)
        shared = hexes_under(db(), "/run/checkpoint-3")  # small files of the same bytes
        only1 = ckpt1 - shared
        assert len(only1) >= 12  # the two big files' chunks, at least
        wait_until(lambda: states(run).get("/run/checkpoint-2") in ("expired", "deleted"), 30,
                   "checkpoint 2 expired")
        assert states(run)["/run/checkpoint-1"] == "committed"  # b holds it: spared
        assert (a.mountpoint / "run" / "checkpoint-1" / "optimizer.pt").exists()
        # Its chunks stay on a's local tiers and on the bucket while b reads.
        assert frames_on(a, only1) == only1
        assert in_bucket(seaweed, remote[1], only1) == only1
        assert head + f.read() == payloads[1]  # b's read goes on, bit-identical
        # Read from the bucket, copied to b's local tiers (copy_back): they go too, below.
        wait_until(lambda: frames_on(b, only1), 30, "b's local copies")
    # b closed it: the next pass expires checkpoint 1; its chunks go from every tier.
    gc(a, run)
    wait_until(lambda: states(run).get("/run/checkpoint-1") in ("expired", "deleted"), 30,
               "checkpoint 1 expired")
    assert not (b.mountpoint / "run" / "checkpoint-1").exists()
    wait_until(lambda: not in_bucket(seaweed, remote[1], only1), 60, "gone from the bucket")
    wait_until(lambda: not frames_on(a, only1), 60, "gone from a's local tiers")
    wait_until(lambda: not frames_on(b, only1), 60, "gone from b's local tiers")
    gc(a, run)  # verifies it gone everywhere (the rows of b's tiers are done too)
    wait_until(lambda: states(run).get("/run/checkpoint-1") == "deleted", 60,
               "checkpoint 1 verified deleted")
    # What stays reads back on both nodes.
    for m in (a, b):
        got = (m.mountpoint / "run" / "checkpoint-3" / "model.safetensors").read_bytes()
        assert got == payloads[3]


def test_a_file_unlinked_on_one_node_leaves_no_copy_on_anothers_local_tiers(
    ckpt_factory: CkptFactory, pg_url: str, remote: tuple[str, str], seaweed: SeaweedServer,
    db: Db,
) -> None:
    cluster = Cluster(ckpt_factory, pg_url, remote[0])
    a, b = cluster.node("a"), cluster.node("b")
    data = os.urandom(4 * CS + 1)
    (a.mountpoint / "w.bin").write_bytes(data)
    sync(a, a.mountpoint / "w.bin")
    hexes = {r.digest.hex() for r in db().extents(os.stat(a.mountpoint / "w.bin").st_ino).values()}
    assert (b.mountpoint / "w.bin").read_bytes() == data  # from the bucket
    wait_until(lambda: frames_on(b, hexes), 30, "b's local copies (copy_back)")
    os.unlink(a.mountpoint / "w.bin")
    wait_until(lambda: not frames_on(a, hexes), 20, "gone from a's local tiers")
    wait_until(lambda: not in_bucket(seaweed, remote[1], hexes), 20, "gone from the bucket")
    # Nothing happens on b meanwhile: only its deletion queue's own look finds the rows.
    wait_until(lambda: not frames_on(b, hexes), 15, "gone from b's local tiers")


@pytest.mark.slow
def test_two_nodes_janitors_expire_each_checkpoint_once(
    ckpt_factory: CkptFactory, pg_url: str, remote: tuple[str, str], tmp_path: Path, db: Db,
) -> None:
    cluster = Cluster(ckpt_factory, pg_url, remote[0])
    conf = keep_one(tmp_path)
    a, b = cluster.node("a", *conf), cluster.node("b", *conf)
    run = a.mountpoint / "run"
    steps = range(1, 7)
    held = []
    try:
        for step in steps:
            hf_save(run, step, os.urandom(CS + step))
            wait_until(committed(run, step), 30, f"checkpoint {step} committed")
            # b holds a file of each open: a's retention spares them all for now.
            held.append(open(  # noqa: SIM115 - closed below, after the loop
                b.mountpoint / "run" / f"checkpoint-{step}" / "scheduler.pt", "rb"))
    finally:
        for f in held:
            f.close()
    wait_until(lambda: not db().open_inodes(), 10, "b's handles released")
    # Both nodes ask for a pass at once: both would expire checkpoints 1-5.
    errors: list[BaseException] = []

    def ask(m: Mount) -> None:
        try:
            gc(m, m.mountpoint / "run")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(m,)) for m in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors, errors
    gone = [f"/run/checkpoint-{s}" for s in steps if s != 6]
    wait_until(lambda: all(states(run).get(r) in ("expired", "deleted") for r in gone), 60,
               "checkpoints 1-5 expired")
    for m in (a, b):
        assert sorted(os.listdir(m.mountpoint / "run")) == ["checkpoint-6"]
    # Each one expired once, by one node (the daemons log every expiry).
    logs = a.log + b.log
    for root in gone:
        assert len(re.findall(rf"checkpoint {re.escape(root)} expired \(", logs)) == 1, root


def test_the_retention_lock_is_held_by_one_catalog_user_at_a_time(
    pg_url: str, tmp_path: Path,
) -> None:
    one, two = PostgresCatalog(pg_url, pool_size=1), PostgresCatalog(pg_url, pool_size=1)
    try:
        lock = one.try_exclusive("retention")
        assert lock is not None and lock.held()
        assert two.try_exclusive("retention") is None  # another node's pass runs
        other = two.try_exclusive("something else")  # locks of other names are apart
        assert other is not None
        other.release()
        lock.release()
        again = two.try_exclusive("retention")
        assert again is not None
        # The holder's connection ends (its node died): the lock goes with it.
        again.conn.close()  # type: ignore[attr-defined]  # PostgreSQL's: a connection
        assert not again.held()
        taken = one.try_exclusive("retention")
        assert taken is not None
        taken.release()
    finally:
        one.close()
        two.close()
    # One node's engine has nobody to exclude.
    lite = SqliteCatalog(tmp_path / "catalog.sqlite")
    try:
        first, second = lite.try_exclusive("retention"), lite.try_exclusive("retention")
        assert first is not None and second is not None and first.held()
    finally:
        lite.close()
