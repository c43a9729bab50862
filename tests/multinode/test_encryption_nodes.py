"""Encrypted namespaces on two nodes sharing a PostgreSQL catalog: the first node to need
a namespace's key creates it, the other uses it (one key, read on both), and a shred on
one node makes the other forget the key too."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tests.multinode.conftest import Cluster, Db, sync
from tests.support import encryption as enc
from tests.support.mountutil import Mount, run_cli, wait_until

pytestmark = pytest.mark.usefixtures("postgres")


@pytest.mark.allow_log_errors
def test_two_nodes_share_one_key_and_a_shred_reaches_both(
    cluster: Cluster, db: Db, tmp_path: Path,
) -> None:
    kek_path, _kek = enc.kek_file(tmp_path / "keys" / "kek")
    cfg = enc.config(tmp_path / "ckptfs.toml", kek_path)
    a = cluster.node("a", "--config", str(cfg))
    b = cluster.node("b", "--config", str(cfg))
    rows = db().namespace_keys()
    assert sorted((r.namespace, r.version) for r in rows) == [("/proj-a", 1), ("/proj-b", 1)]
    data = enc.marked(3 * 256 * 1024 + 11, b"nodes")
    (a.mountpoint / "proj-a").mkdir(mode=0o777, exist_ok=True)  # made at mount
    enc.write(a.mountpoint / "proj-a/f.bin", data)
    sync(a, a.mountpoint / "proj-a/f.bin")
    wait_until(lambda: (b.mountpoint / "proj-a/f.bin").exists(), 5, "b sees the file")
    assert (b.mountpoint / "proj-a/f.bin").read_bytes() == data
    enc.write(b.mountpoint / "proj-a/g.bin", data[::-1])
    sync(b, b.mountpoint / "proj-a/g.bin")
    assert (a.mountpoint / "proj-a/g.bin").read_bytes() == data[::-1]
    res = run_cli("shred", "/proj-a", "--yes", "--config", str(cfg), "--state-dir",
                  str(a.state_dir), "--timeout", "60", timeout=90)
    assert res.returncode == 0, res.stdout + res.stderr
    for node in (a, b):
        def forgot(m: Mount = node) -> bool:
            return "shredded in the catalog: forgotten" in m.log

        wait_until(forgot, 10, "forgotten")

    def eio(p: Path) -> bool:
        try:
            with open(p, "rb") as f:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                f.read()
        except OSError as exc:
            return exc.errno == errno.EIO
        return False

    assert eio(b.mountpoint / "proj-a/f.bin") and eio(a.mountpoint / "proj-a/g.bin")
