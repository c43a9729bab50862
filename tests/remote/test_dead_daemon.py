"""Commands against a mount whose daemon was killed (kill -9: the mount point is left as a
dead FUSE mount, the pid file and stats.json stay behind): each says at once that no
daemon serves the mount and exits 1, instead of waiting for it or showing what it left
as if it ran. A remount serves them again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON, mounted, run_cli
from tests.support.s3server import SeaweedServer

pytestmark = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)

MiB = 1 << 20
NO_DAEMON = "no daemon serves"


@pytest.mark.allow_log_warnings("cleaning up stale mount")
def test_every_live_mount_command_says_no_daemon_serves_a_killed_mount(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str]
) -> None:
    url, _prefix = remote
    with mounted(tmp_path, 2, ("--chunk-size", "1MiB", "--remote", url)) as m:
        ckpt = m.mountpoint / "run" / "checkpoint-1"
        ckpt.mkdir(parents=True)
        (ckpt / "a.bin").write_bytes(os.urandom(MiB))
        assert run_cli("sync", str(m.mountpoint), "--timeout", "60").returncode == 0
        m.kill9()
        mnt, run, f = str(m.mountpoint), str(ckpt.parent), str(ckpt / "a.bin")
        commands = [
            # A sync would wait for its whole timeout (the guard below fails the test
            # long before) and end with "backlog: empty".
            ("sync", mnt, "--timeout", "600"),
            ("sync", "--state-dir", str(m.state_dir), "--timeout", "600"),
            ("status", mnt),
            ("status", "--state-dir", str(m.state_dir)),
            ("ls", run),
            ("show", str(ckpt)),
            ("latest", run),
            ("prefetch", f),  # said "no such file or directory"
            ("gc", run),
            ("tag", str(ckpt), "best"),
            ("verify", str(ckpt)),
        ]
        for args in commands:
            res = run_cli(*args, timeout=60)
            assert res.returncode == 1 and NO_DAEMON in res.stderr, (args, res)
            if args[0] == "status":
                # What the dead daemon left is no live state.
                assert "daemon: not running" in res.stdout, res.stdout
                assert "healthy" not in res.stdout, res.stdout
        m.start()
        for args in (("status", mnt), ("ls", run), ("sync", mnt, "--timeout", "60")):
            res = run_cli(*args, timeout=90)
            assert res.returncode == 0 and NO_DAEMON not in res.stderr, (args, res)
