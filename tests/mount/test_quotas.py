"""Namespace quotas on real mounts (docs/governance.md "Quotas"): EDQUOT at the write that
would take a namespace past its quota, nothing of that version committed, the previous
version intact; usage in `ckptfs status`, after unlink, across a remount and from a state
dir of schema 5; a namespace's retention class applied by `ckptfs gc`."""

from __future__ import annotations

import errno
import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TEST_MOUNT_ARGS, CkptFactory
from tests.mount.test_checkpoints import hf_save, states
from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON, Mount, run_cli, wait_until

from ckptfs.testing.exposition import sample, scrape

pytestmark = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)

KiB = 1024
MiB = 1024 * KiB
PIECE = 256 * KiB


def quota_config(tmp_path: Path, quota: str = "4MiB", extra: str = "") -> Path:
    cfg = tmp_path / "ckptfs.toml"
    cfg.write_text(f'[[namespace]]\npath = "/proj-a"\nuids = [0]\nquota = "{quota}"\n{extra}')
    return cfg


def args(cfg: Path) -> tuple[str, ...]:
    return (*TEST_MOUNT_ARGS, "--config", str(cfg))


def project(m: Mount) -> Path:
    ns = m.mountpoint / "proj-a"
    if not ns.exists():
        ns.mkdir()
        os.chmod(ns, 0o777)
    return ns


def status(m: Mount) -> dict[str, Any]:
    res = run_cli("status", str(m.mountpoint), "--json")
    assert res.returncode == 0, res.stderr
    return dict(json.loads(res.stdout))


def usage(m: Mount) -> dict[str, dict[str, Any]]:
    return {n["path"]: n for n in status(m)["namespaces"]}


def used(m: Mount, ns: str = "/proj-a") -> int:
    return int(usage(m)[ns]["used_bytes"])


class Writer:
    """A file open for writing, written piece by piece: how far it got and which call
    failed (the error of a write, then of the close)."""

    def __init__(self, path: Path, flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC) -> None:
        self.fd = os.open(path, flags, 0o644)
        self.written = 0
        self.write_error: OSError | None = None
        self.close_error: OSError | None = None

    def write(self, data: bytes) -> bool:
        """Write all of ``data`` (os.write may take part of it before an error); False
        once a write failed."""
        if self.write_error is not None:
            return False
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.fd, view)
            except OSError as exc:
                self.write_error = exc
                return False
            self.written += n
            view = view[n:]
        return True

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError as exc:
            self.close_error = exc


def write_file(path: Path, data: bytes) -> Writer:
    w = Writer(path)
    for off in range(0, len(data), PIECE):
        if not w.write(data[off:off + PIECE]):
            break
    w.close()
    return w


def test_a_big_write_past_the_quota_fails_at_write_and_the_old_version_stays(
    ckpt_factory: CkptFactory, tmp_path: Path,
) -> None:
    m = ckpt_factory.mount(extra_args=args(quota_config(tmp_path, "4MiB")))
    ns = project(m)
    old = os.urandom(MiB + 5)
    (ns / "model.pt").write_bytes(old)
    # One big write(): the kernel sends it in requests; the one past the quota fails.
    w = Writer(ns / "model.pt")
    assert not w.write(os.urandom(6 * MiB))
    assert w.write_error is not None and w.write_error.errno == errno.EDQUOT
    # A rewrite counts its new size, not old + new: up to the whole quota was accepted.
    assert 3 * MiB <= w.written <= 4 * MiB
    w.close()
    assert w.close_error is not None and w.close_error.errno == errno.EDQUOT
    assert (ns / "model.pt").read_bytes() == old  # nothing of the refused version
    assert used(m) == len(old)
    assert "quota: write at" in m.log and "EDQUOT" in m.log


def test_an_overwrite_counts_its_new_size_and_a_growing_truncate_is_refused(
    ckpt_factory: CkptFactory, tmp_path: Path,
) -> None:
    m = ckpt_factory.mount(extra_args=args(quota_config(tmp_path, "4MiB")))
    ns = project(m)
    first = os.urandom(3 * MiB)
    assert write_file(ns / "w.bin", first).close_error is None
    second = os.urandom(3 * MiB + 512 * KiB)  # 6.5 MiB if old and new both counted
    w = write_file(ns / "w.bin", second)
    assert w.write_error is None and w.close_error is None
    assert (ns / "w.bin").read_bytes() == second
    assert used(m) == len(second)
    with pytest.raises(OSError) as exc:
        os.truncate(ns / "w.bin", 5 * MiB)
    assert exc.value.errno == errno.EDQUOT
    assert os.stat(ns / "w.bin").st_size == len(second)
    os.truncate(ns / "w.bin", MiB)  # shrinking always works, and frees quota
    assert used(m) == MiB


def test_many_small_files_fill_the_quota_exactly_and_an_unlink_frees_it(
    ckpt_factory: CkptFactory, tmp_path: Path,
) -> None:
    m = ckpt_factory.mount(extra_args=args(quota_config(tmp_path, "1MiB")))
    ns = project(m)
    other = m.mountpoint / "scratch"  # outside every namespace: no limit
    other.mkdir()
    (other / "big").write_bytes(os.urandom(2 * MiB))
    size = 64 * KiB
    results = [write_file(ns / f"f{i:02}", os.urandom(size)) for i in range(18)]
    ok = [i for i, w in enumerate(results) if w.write_error is None and w.close_error is None]
    assert ok == list(range(16))  # 16 x 64 KiB = the quota
    for w in results[16:]:
        assert w.write_error is not None and w.write_error.errno == errno.EDQUOT
        assert w.written == 0 and w.close_error is not None
    assert [os.stat(ns / f"f{i:02}").st_size for i in (16, 17)] == [0, 0]
    n = usage(m)["/proj-a"]
    assert (n["used_bytes"], n["quota_bytes"], n["percent"]) == (MiB, MiB, 100.0)
    for i in range(4):
        os.unlink(ns / f"f{i:02}")
    assert used(m) == 12 * size
    w = write_file(ns / "again", os.urandom(4 * size))
    assert w.write_error is None and w.close_error is None
    assert used(m) == MiB == sum(p.stat().st_size for p in ns.iterdir())


def test_two_concurrent_writers_cannot_overshoot_together(
    ckpt_factory: CkptFactory, tmp_path: Path,
) -> None:
    m = ckpt_factory.mount(extra_args=args(quota_config(tmp_path, "4MiB")))
    ns = project(m)
    a, b = Writer(ns / "a"), Writer(ns / "b")
    data = {a: os.urandom(3 * MiB), b: os.urandom(3 * MiB)}
    # Interleaved: neither has closed (committed) when the second one crosses the quota.
    for off in range(0, 3 * MiB, PIECE):
        for w in (a, b):
            w.write(data[w][off:off + PIECE])
    # At 2 MiB each, a's next piece is the first past 4 MiB: refused, and a's version
    # (never to be committed) frees its room, so b completes.
    assert a.write_error is not None and a.write_error.errno == errno.EDQUOT
    assert a.written == 2 * MiB and b.write_error is None and b.written == 3 * MiB
    a.close()
    b.close()
    assert b.close_error is None
    assert a.close_error is not None and a.close_error.errno == errno.EDQUOT
    assert (ns / "b").read_bytes() == data[b] and os.stat(ns / "a").st_size == 0
    assert used(m) == 3 * MiB


def test_usage_in_status_survives_a_remount(ckpt_factory: CkptFactory, tmp_path: Path) -> None:
    m = ckpt_factory.mount(extra_args=args(quota_config(tmp_path, "4MiB")))
    ns = project(m)
    (ns / "run").mkdir()
    (ns / "run" / "model.pt").write_bytes(os.urandom(MiB + 512 * KiB))
    os.link(ns / "run" / "model.pt", ns / "run" / "alias.pt")  # one file, counted once
    (m.mountpoint / "outside.bin").write_bytes(os.urandom(MiB))
    want = {"path": "/proj-a", "used_bytes": MiB + 512 * KiB, "files": 1,
            "quota_bytes": 4 * MiB, "percent": 37.5}
    def usage() -> list[dict[str, Any]]:  # the namespaces' roots: test_namespace_roots.py
        return [{k: v for k, v in n.items() if k != "root"} for n in status(m)["namespaces"]]

    assert usage() == [want]
    res = run_cli("status", str(m.mountpoint))
    assert res.returncode == 0, res.stderr
    assert "namespace /proj-a: 1.5 MiB used of 4.0 MiB quota (38%), 1 file(s)" in res.stdout

    def gauges() -> tuple[float, ...] | None:
        got = scrape(m.state_dir)
        try:
            return tuple(sample(got, f"ckptfs_namespace_{k}", namespace="/proj-a")
                         for k in ("used_bytes", "files", "quota_bytes"))
        except KeyError:  # before the daemon's first refresh of its facts
            return None

    wait_until(lambda: gauges() == (MiB + 512 * KiB, 1, 4 * MiB), what="namespace gauges")
    ckpt_factory.remount(m)
    assert usage() == [want]
    # The count came back with the mount: the write past the quota fails at write().
    w = write_file(ns / "run" / "more.pt", os.urandom(3 * MiB))
    assert w.write_error is not None and w.write_error.errno == errno.EDQUOT
    os.unlink(ns / "run" / "alias.pt")
    assert used(m) == MiB + 512 * KiB  # a name left: still counted
    os.unlink(ns / "run" / "model.pt")
    os.unlink(ns / "run" / "more.pt")
    assert used(m) == 0


def test_a_rename_out_of_a_namespace_is_exdev(ckpt_factory: CkptFactory, tmp_path: Path) -> None:
    m = ckpt_factory.mount(extra_args=args(quota_config(tmp_path, "4MiB")))
    ns = project(m)
    (ns / "x").write_bytes(b"x" * 100)
    (m.mountpoint / "y").write_bytes(b"y" * 100)
    for src, dst in ((ns / "x", m.mountpoint / "x"), (m.mountpoint / "y", ns / "y"),
                     (ns, m.mountpoint / "proj-z")):
        with pytest.raises(OSError) as exc:
            os.rename(src, dst)
        assert exc.value.errno == errno.EXDEV, (src, dst)
    with pytest.raises(OSError) as exc:
        os.link(m.mountpoint / "y", ns / "y")
    assert exc.value.errno == errno.EXDEV
    os.rename(ns / "x", ns / "x2")  # inside the namespace: as ever
    assert used(m) == 100


def test_a_state_dir_of_schema_5_is_counted_at_its_first_mount_with_the_namespace(
    ckpt_factory: CkptFactory, tmp_path: Path,
) -> None:
    m = ckpt_factory.mount()  # no namespace yet
    ns = project(m)
    (ns / "a.bin").write_bytes(os.urandom(2 * MiB))
    (ns / "b.bin").write_bytes(os.urandom(MiB))
    m.stop()
    conn = sqlite3.connect(m.state_dir / "catalog.sqlite")
    conn.execute("DROP TABLE ns_usage")
    conn.execute("DROP TABLE ns_files")
    conn.execute("UPDATE meta SET value='5' WHERE key='schema_version'")
    conn.commit()
    conn.close()
    m.extra_args = args(quota_config(tmp_path, "4MiB"))
    m.start()
    assert "namespace /proj-a: usage counted" in m.log
    assert usage(m)["/proj-a"]["used_bytes"] == 3 * MiB
    assert usage(m)["/proj-a"]["files"] == 2
    w = write_file(ns / "c.bin", os.urandom(2 * MiB))
    assert w.write_error is not None and w.write_error.errno == errno.EDQUOT
    os.unlink(ns / "a.bin")
    assert used(m) == MiB


def test_a_namespace_retention_class_expires_only_its_checkpoints(
    ckpt_factory: CkptFactory, tmp_path: Path,
) -> None:
    cfg = tmp_path / "ckptfs.toml"
    cfg.write_text(
        '[[retention]]\nname = "short"\nkeep = 2\n'
        '[[namespace]]\npath = "/proj-a"\nuids = [0]\nretention = "short"\n'
        '[[namespace]]\npath = "/proj-b"\nuids = [0]\n'
    )
    m = ckpt_factory.mount(extra_args=args(cfg))
    runs = {p: m.mountpoint / p / "run" for p in ("proj-a", "proj-b")}
    for step in range(1, 5):
        for p, run in runs.items():
            hf_save(run, step, os.urandom(300 * KiB))
            root = f"/{p}/run/checkpoint-{step}"
            def committed(r: str = root, d: Path = run) -> bool:
                return states(d).get(r) == "committed"

            wait_until(committed, what=root)
    res = run_cli("gc", str(m.mountpoint))
    assert res.returncode == 0, res.stderr
    a, b = states(runs["proj-a"]), states(runs["proj-b"])
    for step in (1, 2):
        assert a[f"/proj-a/run/checkpoint-{step}"] in ("expired", "deleted"), a
        assert not (runs["proj-a"] / f"checkpoint-{step}").exists()
    assert {a[f"/proj-a/run/checkpoint-{s}"] for s in (3, 4)} == {"committed"}
    assert {b[f"/proj-b/run/checkpoint-{s}"] for s in range(1, 5)} == {"committed"}, b
    # What retention deleted left the namespace's usage.
    left = sum(p.stat().st_size for p in runs["proj-a"].rglob("*") if p.is_file())
    wait_until(lambda: used(m) == left, what="usage after retention")
