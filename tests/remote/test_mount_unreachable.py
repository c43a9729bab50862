"""A node mounts while its bucket hangs (issue 33, item 5).

SIGSTOP of the test's own SeaweedFS (connections are accepted, nothing answers), kill -9
of the daemon, mount again: the mount must come up within the mount helper's timeout, not
after the reachability check's and the writer lease's read timeouts (60 s each, 120 s in
all, after which the CLI gave up and the daemon died on the closed readiness pipe). While
the bucket hangs the node serves its local copies, takes new writes (their uploads wait),
and `ckptfs status` says why; once the bucket answers the lease is taken in the
background and the uploads go.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from pathlib import Path

import pytest

from tests.remote.test_remote_mount import remote_objects
from tests.support.freeze import freeze
from tests.support.mountutil import (
    FUSE_AVAILABLE,
    SKIP_REASON,
    drop_cached_pages,
    mounted,
    pid_alive,
    run_cli,
    wait_until,
)
from tests.support.s3server import OUTAGE_WARNINGS, SeaweedServer

pytestmark = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)

CS = 256 * 1024


def remote_tier(mountpoint: Path) -> dict[str, object]:
    res = run_cli("status", str(mountpoint), "--json")
    assert res.returncode == 0, res.stderr
    tiers = [t for t in json.loads(res.stdout)["tiers"] if t["kind"] != "local"]
    assert len(tiers) == 1, tiers
    return tiers[0]


@pytest.mark.slow
@pytest.mark.allow_log_warnings(*OUTAGE_WARNINGS, "writer lease", "not reachable now",
                                "stale mount", "not taken yet")
def test_a_node_mounts_with_its_bucket_hung_and_uploads_once_it_answers(
    tmp_path: Path, own_seaweed: SeaweedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CKPTFS_LEASE_HEARTBEAT_S", "2")  # the background lease comes soon
    prefix = f"u-{uuid.uuid4().hex[:10]}"
    url = f"s3://{own_seaweed.bucket}/{prefix}?endpoint={own_seaweed.endpoint}"
    kept = os.urandom(3 * CS)
    with mounted(tmp_path, 2, ("--chunk-size", "256KiB", "--remote", url)) as m:
        (m.mountpoint / "kept.bin").write_bytes(kept)
        assert run_cli("sync", str(m.mountpoint), "--timeout", "60").returncode == 0
        assert len(remote_objects(own_seaweed, prefix)) == 3
        assert own_seaweed.proc is not None
        freeze(own_seaweed.proc.pid)  # connections open, no answers
        try:
            m.kill9()
            # Mount.start gives the CLI 60 s: the old mount waited 120 s for the bucket.
            m.start()
            assert m.pid is not None and pid_alive(m.pid)
            drop_cached_pages(m.mountpoint / "kept.bin")
            assert (m.mountpoint / "kept.bin").read_bytes() == kept  # local copies served
            fresh = os.urandom(2 * CS)
            (m.mountpoint / "fresh.bin").write_bytes(fresh)  # written now, uploaded later
            tier = remote_tier(m.mountpoint)
            assert tier["fenced"] and "writer lease" in str(tier["fenced"]), tier
            res = run_cli("status", str(m.mountpoint))
            assert res.returncode == 0 and "writes held" in res.stdout, res.stdout
            backlog = json.loads(run_cli("status", str(m.mountpoint), "--json").stdout)["backlog"]
            assert backlog["chunks"] >= 2, backlog  # fresh.bin's uploads wait
        finally:
            os.kill(own_seaweed.proc.pid, signal.SIGCONT)
        # The heartbeat task takes the lease; then fresh.bin's upload goes.
        res = run_cli("sync", str(m.mountpoint), "--timeout", "170", timeout=200)
        assert res.returncode == 0, res.stdout + res.stderr
        # status reads the daemon's statistics, written each second: wait for a fresh one.
        wait_until(lambda: not remote_tier(m.mountpoint)["fenced"], what="the fence lifted")
        assert len(remote_objects(own_seaweed, prefix)) == 5
        assert (m.mountpoint / "fresh.bin").read_bytes() == fresh
        assert pid_alive(m.pid)

