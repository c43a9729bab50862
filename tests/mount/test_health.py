"""The daemon's /healthz (Kubernetes readiness and liveness, docs/kubernetes.md): 200 while
its mount serves, 503 when the mount does not answer or is gone. A real ckptfs mount, and a
real FUSE mount (scripts/nullfs.py) that is stopped with SIGSTOP to stand for a hung one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.freeze import freeze
from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON, is_mounted, mounted, wait_until

from ckptfs.metrics.health import MountProbe

ROOT = Path(__file__).resolve().parents[2]
needs_fuse = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@needs_fuse
def test_healthz_answers_200_while_the_mount_serves(tmp_path: Path) -> None:
    with mounted(tmp_path) as m:
        addr = (m.state_dir / "metrics.addr").read_text().strip()
        status, body = get(f"http://{addr}/healthz")
        assert status == 200, body
        assert body.startswith("ok: ") and str(m.mountpoint) in body
        # /metrics is still served beside it
        status, body = get(f"http://{addr}/metrics")
        assert status == 200 and "ckptfs_" in body


@pytest.fixture
def nullfs(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    mnt = tmp_path / "null"
    mnt.mkdir()
    proc = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "nullfs.py"), str(mnt),
                             "--read-ahead-kb", "0"])
    try:
        wait_until(lambda: is_mounted(mnt), what="nullfs mounted")
        yield mnt, proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@needs_fuse
def test_a_mount_that_does_not_answer_is_unhealthy_until_it_answers_again(
    nullfs: tuple[Path, subprocess.Popen[bytes]],
) -> None:
    mnt, proc = nullfs
    probe = MountProbe(mnt, timeout_s=0.5)
    assert probe.check() == (True, f"{mnt} serves")
    freeze(proc.pid)  # every thread of the filesystem's daemon stopped: nothing answers
    ok, detail = probe.check()
    assert not ok and "has not answered statvfs" in detail
    # A second check while the first probe still waits in the kernel starts no other
    # probe thread: one stuck thread, however often the orchestrator asks.
    assert not probe.check()[0]
    assert [t.name for t in threading.enumerate()].count("ckptfs-health") == 1
    os.kill(proc.pid, signal.SIGCONT)
    wait_until(lambda: probe.check()[0], what="the mount answers again")


@needs_fuse
def test_a_mount_point_no_longer_mounted_is_unhealthy(
    nullfs: tuple[Path, subprocess.Popen[bytes]],
) -> None:
    mnt, proc = nullfs
    probe = MountProbe(mnt, timeout_s=20)
    assert probe.check()[0]
    subprocess.run(["fusermount3", "-u", str(mnt)], check=True)
    proc.wait(timeout=20)
    assert probe.check() == (False, f"{mnt} is not mounted")
