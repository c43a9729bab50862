"""Several nodes, one namespace: real ckptfs mounts (one per "node", each with its own
state dir and local tiers) sharing one real PostgreSQL catalog and one real SeaweedFS
bucket. Close-to-open consistency (docs/multinode.md): what a node closed is visible on
every node at its next open; the kernel's caches hide another node's change for at most
the entry/attribute timeouts (1 s), which the waits below allow for."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import threading
import uuid

import pytest

from tests.conftest import TEST_MOUNT_ARGS, CkptFactory
from tests.multinode.conftest import Cluster, sync
from tests.support.freeze import freeze
from tests.support.mountutil import Mount, run_cli, wait_until
from tests.support.s3server import SeaweedServer

pytestmark = pytest.mark.usefixtures("postgres")


def test_a_file_closed_on_one_node_is_read_bit_identical_on_another(cluster: Cluster) -> None:
    a, b = cluster.node("a"), cluster.node("b")
    data = os.urandom(3 * 256 * 1024 + 1234)  # several chunks and a partial one
    (a.mountpoint / "run").mkdir()
    (a.mountpoint / "run" / "model.pt").write_bytes(data)
    sync(a, a.mountpoint / "run" / "model.pt")  # on the bucket: node b can reach it
    got = wait_until(lambda: (b.mountpoint / "run" / "model.pt").exists(), 5, "b sees the file")
    assert got
    assert (b.mountpoint / "run" / "model.pt").read_bytes() == data
    st_a, st_b = (os.stat(m.mountpoint / "run" / "model.pt") for m in (a, b))
    assert (st_a.st_size, st_a.st_mtime_ns, st_a.st_ino) == (st_b.st_size, st_b.st_mtime_ns,
                                                              st_b.st_ino)
    assert sorted(os.listdir(b.mountpoint / "run")) == ["model.pt"]


def test_a_file_rewritten_on_one_node_is_seen_new_at_the_next_open_on_another(
    cluster: Cluster,
) -> None:
    a, b = cluster.node("a"), cluster.node("b")
    p = "latest.json"
    (a.mountpoint / p).write_bytes(b"step 1\n")
    sync(a, a.mountpoint / p)
    assert (b.mountpoint / p).read_bytes() == b"step 1\n"  # b's kernel caches these pages
    (a.mountpoint / p).write_bytes(b"step 2 and longer\n")
    sync(a, a.mountpoint / p)
    wait_until(lambda: os.stat(b.mountpoint / p).st_size == len(b"step 2 and longer\n"), 5,
               "b sees the new size")
    assert (b.mountpoint / p).read_bytes() == b"step 2 and longer\n"  # not the cached pages


def test_an_open_after_another_node_closed_reads_what_it_wrote_even_with_old_attributes_cached(
    cluster: Cluster,
) -> None:
    """Node b's kernel caches the file's attributes while node a is still writing it
    (size 0: a lookup, as the O_EXCL race of the demo makes one); a closes; b's open at
    once (inside b's attribute timeout) must read what a wrote, not the cached size's
    nothing (close-to-open, docs/multinode.md)."""
    a, b = cluster.node("a"), cluster.node("b")
    data = b"held by node a\n"
    for i in range(3):  # each round has its own file: a fresh kernel entry on b
        name = f"LOCK{i}"
        fd = os.open(a.mountpoint / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        try:
            assert os.stat(b.mountpoint / name).st_size == 0  # b's kernel caches size 0
            os.write(fd, data)
        finally:
            os.close(fd)
        sync(a, a.mountpoint / name)
        with open(b.mountpoint / name, "rb") as f:
            assert f.read() == data, name
        assert os.stat(b.mountpoint / name).st_size == len(data)


def test_an_exclusive_create_of_one_name_on_two_nodes_succeeds_once(cluster: Cluster) -> None:
    a, b = cluster.node("a"), cluster.node("b")
    barrier = threading.Barrier(2)
    results: dict[str, int] = {}

    def create(m: Mount) -> None:
        barrier.wait()
        try:
            fd = os.open(m.mountpoint / "lock", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except OSError as exc:
            results[m.state_dir.parent.name] = exc.errno or -1
        else:
            os.close(fd)
            results[m.state_dir.parent.name] = 0

    threads = [threading.Thread(target=create, args=(m,)) for m in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results.values()) == [0, errno.EEXIST], results
    assert os.listdir(a.mountpoint) == ["lock"]


def test_many_creates_from_two_nodes_in_one_directory_lose_nothing(cluster: Cluster) -> None:
    a, b = cluster.node("a"), cluster.node("b")
    (a.mountpoint / "shards").mkdir()
    wait_until(lambda: (b.mountpoint / "shards").is_dir(), 5, "b sees the directory")
    barrier = threading.Barrier(2)

    def write(m: Mount, rank: int) -> None:
        barrier.wait()
        for i in range(40):
            (m.mountpoint / "shards" / f"r{rank}-{i:03d}.bin").write_bytes(bytes([rank]) * 100)

    threads = [threading.Thread(target=write, args=(m, r)) for r, m in enumerate((a, b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    want = sorted(f"r{r}-{i:03d}.bin" for r in range(2) for i in range(40))
    for m in (a, b):
        assert sorted(os.listdir(m.mountpoint / "shards")) == want
    inos = {os.stat(a.mountpoint / "shards" / n).st_ino for n in want}
    assert len(inos) == len(want)  # no inode number handed out twice


def test_a_directory_renamed_on_one_node_moves_for_a_lister_on_another(cluster: Cluster) -> None:
    a, b = cluster.node("a"), cluster.node("b")
    tmp = a.mountpoint / "tmp-checkpoint-5"
    tmp.mkdir()
    for i in range(20):
        (tmp / f"shard{i}").write_bytes(b"x" * 10)
    stop = threading.Event()
    seen: list[tuple[bool, bool]] = []

    def lister() -> None:
        while not stop.is_set():
            with contextlib.suppress(FileNotFoundError):
                names = set(os.listdir(b.mountpoint))
                seen.append(("tmp-checkpoint-5" in names, "checkpoint-5" in names))

    t = threading.Thread(target=lister)
    t.start()
    try:
        wait_until(lambda: len(seen) > 3, 10, "the lister on b runs")
        os.rename(tmp, a.mountpoint / "checkpoint-5")
        wait_until(lambda: seen and seen[-1] == (False, True), 5, "b lists the new name")
    finally:
        stop.set()
        t.join(30)
    # One listing is one catalog read: never both names, never neither.
    assert all(old != new for old, new in seen), [s for s in seen if s[0] == s[1]]
    assert sorted(os.listdir(b.mountpoint / "checkpoint-5")) == sorted(f"shard{i}" for i in range(20))


def test_unlink_on_one_node_is_seen_on_another(cluster: Cluster) -> None:
    a, b = cluster.node("a"), cluster.node("b")
    (a.mountpoint / "old.pt").write_bytes(b"old")
    wait_until(lambda: (b.mountpoint / "old.pt").exists(), 5, "b sees the file")
    os.unlink(b.mountpoint / "old.pt")
    wait_until(lambda: not (a.mountpoint / "old.pt").exists(), 5, "a no longer sees it")
    assert os.listdir(a.mountpoint) == []


def test_a_node_remounts_with_only_its_state_dir(cluster: Cluster) -> None:
    a = cluster.node("a")
    (a.mountpoint / "f").write_bytes(b"kept")
    a.stop()
    # Only --state-dir: the binding names the catalog and node, the catalog the tiers.
    again = Mount(a.mountpoint, a.state_dir, [], ["--metrics-address", "127.0.0.1:0"])
    try:
        again.start()
        assert (again.mountpoint / "f").read_bytes() == b"kept"
        assert "node a" in again.log
    finally:
        if again.pid is not None:
            again.stop()
        again.cleanup()


def test_status_and_ls_beside_a_node_read_the_shared_catalog(cluster: Cluster) -> None:
    a, b = cluster.node("a"), cluster.node("b")
    (a.mountpoint / "ckpt").mkdir()
    (a.mountpoint / "ckpt" / "w.bin").write_bytes(os.urandom(1000))
    res = run_cli("status", "--state-dir", str(b.state_dir), "--json", timeout=60)
    assert res.returncode == 0, res.stderr
    tiers = {t["name"]: t for t in json.loads(res.stdout)["tiers"]}
    # The shared catalog records every node's local tiers (by node) and the shared remote.
    assert {"a:local0", "a:local1", "b:local0", "b:local1", "remote0"} <= set(tiers)
    assert sum(tiers[n]["stored_chunks"] for n in ("a:local0", "a:local1")) >= 1
    assert sum(tiers[n]["stored_chunks"] for n in ("b:local0", "b:local1")) == 0
    res = run_cli("ls", str(b.mountpoint), "--json", timeout=60)
    assert res.returncode == 0, res.stderr


@pytest.mark.slow
def test_with_the_database_gone_for_good_the_bucket_restores_the_namespace(
    cluster: Cluster,
) -> None:
    a = cluster.node("a")
    (a.mountpoint / "run" / "checkpoint-7").mkdir(parents=True)
    data = os.urandom(2 * 256 * 1024 + 5)
    (a.mountpoint / "run" / "checkpoint-7" / "model.safetensors").write_bytes(data)
    sync(a, a.mountpoint / "run" / "checkpoint-7")  # chunks and the catalog snapshot
    a.stop()
    # A new node with an empty state dir and the embedded catalog, the same bucket only.
    fresh = cluster.factory.mount(extra_args=[*TEST_MOUNT_ARGS, "--remote", cluster.remote],
                                  name="fresh")
    got = (fresh.mountpoint / "run" / "checkpoint-7" / "model.safetensors").read_bytes()
    assert got == data
    assert "restored the catalog" in fresh.log


@pytest.mark.slow
@pytest.mark.allow_log_warnings()  # the frozen server's uploads time out and retry
def test_status_on_any_node_names_the_node_holding_files_not_yet_on_the_bucket(
    ckpt_factory: CkptFactory, pg_url: str, own_seaweed: SeaweedServer
) -> None:
    url = f"s3://{own_seaweed.bucket}/mn-{uuid.uuid4().hex[:10]}?endpoint={own_seaweed.endpoint}"
    cluster = Cluster(ckpt_factory, pg_url, url)
    a, b = cluster.node("a"), cluster.node("b")
    assert own_seaweed.proc is not None
    freeze(own_seaweed.proc.pid)  # the bucket hangs: uploads cannot finish
    try:
        (a.mountpoint / "ckpt").mkdir()
        (a.mountpoint / "ckpt" / "rank0.pt").write_bytes(os.urandom(1000))
        res = run_cli("status", "--state-dir", str(b.state_dir), "--json", timeout=60)
        assert res.returncode == 0, res.stderr
        risk = json.loads(res.stdout)["at_risk"]
        assert risk == [{"node": "a", "files": 1, "paths": ["/ckpt/rank0.pt"]}], risk
        text = run_cli("status", "--state-dir", str(b.state_dir), timeout=60).stdout
        assert "at risk: 1 file(s) only on node a" in text and "/ckpt/rank0.pt" in text
    finally:
        os.kill(own_seaweed.proc.pid, signal.SIGCONT)
    sync(a, a.mountpoint / "ckpt")
    res = run_cli("status", "--state-dir", str(b.state_dir), "--json", timeout=60)
    assert json.loads(res.stdout)["at_risk"] == []
