"""A namespace's quota with two nodes on one PostgreSQL catalog (docs/governance.md
"Quotas"): each node's early check sees only its own writers, so two versions that each
fit can be written at once; the commit's transaction is the check across nodes, and the
second close fails with EDQUOT, nothing of its version committed."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from tests.multinode.conftest import Cluster, Db
from tests.support.mountutil import Mount, wait_until

pytestmark = pytest.mark.usefixtures("postgres")

MiB = 1024 * 1024


def _config(tmp_path: Path) -> Path:
    cfg = tmp_path / "ckptfs.toml"
    cfg.write_text('[[namespace]]\npath = "/proj-a"\nuids = [0]\nquota = "4MiB"\n')
    return cfg


def test_two_nodes_cannot_together_exceed_a_quota(cluster: Cluster, db: Db, tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    a, b = cluster.node("a", "--config", str(cfg)), cluster.node("b", "--config", str(cfg))
    (a.mountpoint / "proj-a").mkdir(exist_ok=True)  # made at mount
    os.chmod(a.mountpoint / "proj-a", 0o777)
    wait_until(lambda: (b.mountpoint / "proj-a").is_dir(), 5, "b sees the directory")
    data = {"a": os.urandom(3 * MiB), "b": os.urandom(3 * MiB)}
    written = threading.Barrier(2, timeout=60)
    closes: dict[str, int] = {}
    errors: list[BaseException] = []

    def save(node: Mount, name: str) -> None:
        try:
            fd = os.open(node.mountpoint / "proj-a" / name, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                view = memoryview(data[name])
                while view:  # fits on this node: 3 of 4 MiB
                    view = view[os.write(fd, view):]
            finally:
                written.wait()  # both versions written, neither committed
                try:
                    os.close(fd)
                    closes[name] = 0
                except OSError as exc:
                    closes[name] = exc.errno if exc.errno is not None else -1
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=save, args=(m, n)) for m, n in ((a, "a"), (b, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not errors, errors
    assert sorted(closes.values()) == [0, errno.EDQUOT], closes
    won = next(n for n, e in closes.items() if e == 0)
    lost = "b" if won == "a" else "a"
    for m in (a, b):
        def committed(m: Mount = m) -> bool:
            return os.stat(m.mountpoint / "proj-a" / won).st_size == 3 * MiB

        wait_until(committed, 5, "the committed version")
        assert os.stat(m.mountpoint / "proj-a" / lost).st_size == 0
    assert (b.mountpoint / "proj-a" / won).read_bytes() == data[won]
    usage = {u.ns: u for u in db().namespace_usage()}
    assert (usage["/proj-a"].bytes, usage["/proj-a"].quota) == (3 * MiB, 4 * MiB)
    loser = a if lost == "a" else b
    assert "quota: commit of /proj-a/" in loser.log
    # Deleting on one node frees room that the other sees at its next write.
    os.unlink((a if won == "a" else b).mountpoint / "proj-a" / won)
    fd = os.open(loser.mountpoint / "proj-a" / lost, os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, data[lost])
    finally:
        os.close(fd)
    assert {u.ns: u.bytes for u in db().namespace_usage()}["/proj-a"] == 3 * MiB
