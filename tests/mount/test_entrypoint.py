"""The container's entrypoint (deploy/container/entrypoint.sh), run outside a container as
the DaemonSet runs it: the daemon mounts from the config it is pointed at, /healthz answers
200 once it serves, and the SIGTERM that Kubernetes sends at pod deletion commits, unmounts
and exits 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON, is_mounted, wait_until

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "deploy" / "container" / "entrypoint.sh"
needs_fuse = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)


def env_for(tmp_path: Path, config: Path) -> dict[str, str]:
    return {**os.environ, "CKPTFS_MOUNT": str(tmp_path / "ckpt"), "CKPTFS_CONFIG": str(config),
            "CKPTFS_BIN": str(Path(sys.executable).parent / "ckptfs"),
            "PYTHONPATH": str(ROOT)}


@pytest.fixture
def entrypoint(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    (tmp_path / "nvme0").mkdir()
    state = tmp_path / "state"
    config = tmp_path / "config.toml"
    config.write_text(f'state_dir = "{state}"\nchunk_size = "256KiB"\n'
                      f'metrics_address = "127.0.0.1:0"\n'
                      f'[[tier]]\nname = "nvme0"\nkind = "local"\npath = "{tmp_path}/nvme0"\n')
    proc = subprocess.Popen([str(ENTRYPOINT)], env=env_for(tmp_path, config))
    mnt = tmp_path / "ckpt"
    try:
        yield proc, mnt, state
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)


@needs_fuse
def test_entrypoint_serves_the_mount_and_sigterm_unmounts_cleanly(
    entrypoint: tuple[subprocess.Popen[bytes], Path, Path],
) -> None:
    proc, mnt, state = entrypoint
    addr_file = state / "metrics.addr"
    wait_until(lambda: addr_file.exists() and is_mounted(mnt), timeout=60,
               what="the daemon mounted and serving metrics")
    addr = addr_file.read_text().strip()
    with urllib.request.urlopen(f"http://{addr}/healthz", timeout=30) as r:
        assert r.status == 200 and r.read().startswith(b"ok: ")
    data = os.urandom(300_000)
    (mnt / "model.pt").write_bytes(data)
    # exec: the entrypoint's process is the daemon (as the container's PID 1 would be), so
    # the SIGTERM reaches it and no shell is left waiting in between
    cmd = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
    assert b"mount" in cmd and not any(b"entrypoint.sh" in a for a in cmd)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 0
    assert not is_mounted(mnt)
    assert not (mnt / "model.pt").exists()  # the mount is gone: the directory below is empty
    # The pod's next start (same host state dir) serves the file that was written.
    again = subprocess.Popen([str(ENTRYPOINT)], env=env_for(mnt.parent, state.parent / "config.toml"))
    try:
        wait_until(lambda: is_mounted(mnt), timeout=60, what="mounted again")
        assert (mnt / "model.pt").read_bytes() == data
    finally:
        again.send_signal(signal.SIGTERM)
        assert again.wait(timeout=120) == 0


def test_entrypoint_without_a_config_exits_2_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    r = subprocess.run([str(ENTRYPOINT)], env=env_for(tmp_path, missing),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert str(missing) in r.stderr
