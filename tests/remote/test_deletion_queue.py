"""The deletion queue on real mounts (issue 11, items 1-3).

* Retention expiring a checkpoint whose chunks a file being written also has (content
  addressing) must not delete the frames that file is about to commit.
* A hung object store (SIGSTOP of the test's own SeaweedFS) must not freeze the mount:
  unlink, ls and a small write + fsync return at once; the deletions drain afterwards.
* Deletions that fail during an outage are retried (also after a remount) and leave no
  orphan objects.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import blake3
import pytest

from tests.remote.test_remote_mount import local_chunk_keys, remote_objects
from tests.support.freeze import freeze
from tests.support.mountutil import (
    FUSE_AVAILABLE,
    SKIP_REASON,
    Mount,
    ckptfs_cmd,
    drop_cached_pages,
    mounted,
    run_cli,
    wait_until,
)
from tests.support.s3server import OUTAGE_WARNINGS, SeaweedServer

from ckptfs.catalog import SqliteCatalog

pytestmark = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)

KiB = 1024
MiB = 1 << 20
CS = 256 * KiB
FAST = 5.0  # a correctness bound against the 60 s freeze, not a benchmark


def states(path: Path) -> dict[str, str]:
    res = run_cli("ls", str(path), "--json")
    assert res.returncode == 0, res.stderr
    return {c["root"]: c["state"] for c in json.loads(res.stdout)}


def save(run: Path, step: int, model: bytes) -> None:
    d = run / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "model.bin").write_bytes(model)
    (d / "trainer_state.json").write_bytes(json.dumps({"step": step}).encode())


def frame_inodes(m: Mount, digests: list[str]) -> set[tuple[str, int]]:
    """(digest, inode) of every frame of these chunks on the local tiers."""
    out = set()
    for t in m.locals:
        for d in digests:
            p = t / "chunks" / d[:2] / d
            if p.exists():
                out.add((d, p.stat().st_ino))
    return out


def deletion_rows(state_dir: Path) -> list[tuple[str, int, str | None]]:
    cat = SqliteCatalog(state_dir / "catalog.sqlite", readonly=True)
    try:
        return [(b.tier, b.chunks, b.last_error) for b in cat.deletion_backlog()]
    finally:
        cat.close()


def fsck(m: Mount) -> tuple[int, str]:
    res = run_cli("fsck", "--state-dir", str(m.state_dir), timeout=120)
    return res.returncode, res.stdout + res.stderr


def test_expiring_a_checkpoint_keeps_the_chunks_an_open_file_shares(tmp_path: Path) -> None:
    cfg = tmp_path / "ckptfs.toml"
    cfg.write_text('chunk_size = "256KiB"\n[[retention]]\npath = "/runs/*"\nkeep = 1\n'
                   'keep_local = 1\n')
    x = os.urandom(4 * CS)  # whole chunks: each is stored while the file is still open
    digests = [blake3.blake3(x[i : i + CS]).hexdigest() for i in range(0, len(x), CS)]
    with mounted(tmp_path, 2, ("--config", str(cfg))) as m:
        run = m.mountpoint / "runs" / "r1"
        save(run, 1, x)
        wait_until(lambda: states(run).get("/runs/r1/checkpoint-1") == "committed", what="commit 1")
        before = frame_inodes(m, digests)
        assert {d for d, _ in before} == set(digests)
        (m.mountpoint / "other").mkdir()
        fd = os.open(m.mountpoint / "other" / "copy.bin", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            assert os.write(fd, x) == len(x)
            # Every chunk of the copy is stored (a new frame file replaced each old one)
            # and pinned, not yet committed.
            wait_until(lambda: {d for d, _ in frame_inodes(m, digests) - before} == set(digests),
                       what="the copy's chunks stored")
            save(run, 2, os.urandom(4 * CS))  # checkpoint-1 expires (keep = 1)
            wait_until(lambda: not (run / "checkpoint-1").exists(), what="checkpoint-1 removed")
            assert run_cli("gc", str(run)).returncode == 0  # its retention pass has finished
            assert states(run)["/runs/r1/checkpoint-1"] in ("expired", "deleted")
        finally:
            os.close(fd)  # commits copy.bin, naming those chunks
        m.stop()
        m.start()
        drop_cached_pages(m.mountpoint / "other" / "copy.bin")
        assert (m.mountpoint / "other" / "copy.bin").read_bytes() == x
        # copy.bin references the shared chunks now: checkpoint-1 is verified gone.
        assert run_cli("gc", str(run)).returncode == 0
        assert states(run)["/runs/r1/checkpoint-1"] == "deleted"
        wait_until(lambda: not deletion_rows(m.state_dir), what="the deletion queue drained")
    code, out = fsck(m)
    assert code == 0 and "fsck: clean" in out, out


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def write_fsync(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


@pytest.mark.slow
def test_a_hung_object_store_does_not_freeze_the_mount(
    tmp_path: Path, own_seaweed: SeaweedServer
) -> None:
    prefix = f"h-{uuid.uuid4().hex[:10]}"
    url = f"s3://{own_seaweed.bucket}/{prefix}?endpoint={own_seaweed.endpoint}"
    with mounted(tmp_path, 2, ("--chunk-size", "256KiB", "--remote", url)) as m:
        (m.mountpoint / "big.bin").write_bytes(os.urandom(4 * CS))
        assert run_cli("sync", str(m.mountpoint), "--timeout", "60").returncode == 0
        uploaded = set(remote_objects(own_seaweed, prefix))
        assert len(uploaded) == 4
        assert own_seaweed.proc is not None
        freeze(own_seaweed.proc.pid)  # connections open, no answers
        try:
            assert timed(lambda: os.unlink(m.mountpoint / "big.bin")) < FAST
            assert timed(lambda: os.listdir(m.mountpoint)) < FAST
            assert timed(lambda: write_fsync(m.mountpoint / "small.bin", os.urandom(100 * KiB))) < FAST
            assert timed(lambda: os.listdir(m.mountpoint)) < FAST
            rows = deletion_rows(m.state_dir)
            assert sum(n for _, n, _ in rows) >= 4, rows  # the remote copies wait in the queue
            status = run_cli("status", str(m.mountpoint))
            assert status.returncode == 0 and "deletion queue:" in status.stdout, status.stdout
        finally:
            os.kill(own_seaweed.proc.pid, signal.SIGCONT)
        wait_until(lambda: not deletion_rows(m.state_dir), timeout=150,
                   what="the deletion queue drained")
        assert run_cli("sync", str(m.mountpoint), "--timeout", "90").returncode == 0
        objects = set(remote_objects(own_seaweed, prefix))
        assert not objects & uploaded
        assert objects == local_chunk_keys(m.locals)  # small.bin's chunk only: no orphans


@pytest.mark.slow
@pytest.mark.allow_log_warnings(*OUTAGE_WARNINGS, "writer lease", "not reachable now")
def test_deletions_failing_in_an_outage_are_retried_after_a_remount(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CKPTFS_LEASE_HEARTBEAT_S", "0.5")  # retake the lease soon after
    url, prefix = remote
    with mounted(tmp_path, 2, ("--chunk-size", "256KiB", "--remote", url)) as m:
        for name in ("a.bin", "b.bin"):
            (m.mountpoint / name).write_bytes(os.urandom(3 * CS))
        (m.mountpoint / "kept.bin").write_bytes(os.urandom(2 * CS))
        assert run_cli("sync", str(m.mountpoint), "--timeout", "60").returncode == 0
        assert len(remote_objects(seaweed, prefix)) == 8
        seaweed.stop()
        try:
            os.unlink(m.mountpoint / "a.bin")
            os.unlink(m.mountpoint / "b.bin")
            wait_until(lambda: any(err for _, _, err in deletion_rows(m.state_dir)),
                       what="a failed deletion attempt")
            status = json.loads(run_cli("status", str(m.mountpoint), "--json").stdout)
            remote_q = [q for q in status["deletions"] if q["chunks"] and q["last_error"]]
            assert remote_q and remote_q[0]["chunks"] == 6, status["deletions"]
            m.stop()
            rows = deletion_rows(m.state_dir)  # the queue survives the unmount
            assert sum(n for _, n, _ in rows) == 6, rows
            m.start()
        finally:
            seaweed.start()
        wait_until(lambda: not deletion_rows(m.state_dir), timeout=120,
                   what="the deletion queue drained")
        objects = set(remote_objects(seaweed, prefix))
        assert objects == local_chunk_keys(m.locals) and len(objects) == 2
        assert (m.mountpoint / "kept.bin").stat().st_size == 2 * CS


def gc_requests(state_dir: Path, path: str) -> int:
    cat = SqliteCatalog(state_dir / "catalog.sqlite", readonly=True)
    try:
        return sum(1 for e in cat.audit_entries() if e.action == "gc_request" and e.path == path)
    finally:
        cat.close()


@pytest.mark.slow
@pytest.mark.allow_log_warnings(*OUTAGE_WARNINGS, "writer lease", "not reachable now")
def test_a_run_directory_stays_usable_while_gc_waits_for_a_hung_bucket(
    tmp_path: Path, own_seaweed: SeaweedServer
) -> None:
    """Issue 33, item 4: `ckptfs gc RUN` while the bucket hangs took 30 s, and `ls RUN` and
    a create in RUN waited for it (its setxattr held RUN's inode locked in the kernel)."""
    prefix = f"g-{uuid.uuid4().hex[:10]}"
    url = f"s3://{own_seaweed.bucket}/{prefix}?endpoint={own_seaweed.endpoint}"
    cfg = tmp_path / "ckptfs.toml"
    cfg.write_text('chunk_size = "256KiB"\n[[retention]]\npath = "/run5"\nkeep = 1\n')
    with mounted(tmp_path, 2, ("--config", str(cfg), "--remote", url)) as m:
        run = m.mountpoint / "run5"
        for step in (1, 2):
            save(run, step, os.urandom(2 * CS))
        wait_until(lambda: states(run).get("/run5/checkpoint-2") == "committed", what="commit 2")
        assert run_cli("sync", str(m.mountpoint), "--timeout", "60").returncode == 0
        assert own_seaweed.proc is not None
        freeze(own_seaweed.proc.pid)  # connections open, no answers
        gc = None
        try:
            save(run, 3, os.urandom(2 * CS))  # checkpoint-2 expires (keep = 1)
            wait_until(lambda: states(run).get("/run5/checkpoint-2") == "expired", timeout=60,
                       what="checkpoint-2 expired")
            # Its remote copies wait in the deletion queue: the bucket does not answer.
            wait_until(lambda: sum(n for _, n, _ in deletion_rows(m.state_dir)) >= 2,
                       what="the remote deletions queued")
            gc = subprocess.Popen(ckptfs_cmd("gc", str(run)), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
            wait_until(lambda: gc_requests(m.state_dir, "/run5") == 1, what="the gc request")
            # The pass waits for the stuck deletions (at least 10 s, janitor SETTLE_S); the
            # run directory answers meanwhile. Before the fix, the listing returned only
            # after the pass had ended and logged its end.
            names = os.listdir(run)
            (run / "t").touch()
            assert "gc requested under /run5" not in m.log, "ls waited for the gc pass"
            assert "checkpoint-3" in names and (run / "t").exists()
            assert states(run)["/run5/checkpoint-2"] == "expired"  # not verified gone yet
            assert sum(n for _, n, _ in deletion_rows(m.state_dir)) >= 2
        finally:
            os.kill(own_seaweed.proc.pid, signal.SIGCONT)
            if gc is not None:
                out, err = gc.communicate(timeout=180)
        assert gc.returncode == 0, err
        wait_until(lambda: not deletion_rows(m.state_dir), timeout=150,
                   what="the deletion queue drained")
        assert run_cli("gc", str(run)).returncode == 0
        assert states(run)["/run5/checkpoint-2"] == "deleted"
