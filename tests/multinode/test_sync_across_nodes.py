"""`ckptfs sync PATH` on one node waits for the chunks of PATH that another node wrote
(docs/multinode.md "The upload queue"): real mounts a and b on one real PostgreSQL catalog
and a SeaweedFS of the test's own, frozen (SIGSTOP) while node a's uploads would run."""

from __future__ import annotations

import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.conftest import CkptFactory
from tests.multinode.conftest import Cluster
from tests.support.freeze import freeze
from tests.support.mountutil import ckptfs_cmd
from tests.support.s3server import SeaweedServer

from ckptfs.catalog import PostgresCatalog

pytestmark = pytest.mark.usefixtures("postgres")

CS = 256 * 1024


@pytest.mark.slow
@pytest.mark.allow_log_warnings()  # the frozen server's uploads time out and retry
def test_sync_on_one_node_waits_for_the_uploads_of_another(
    ckpt_factory: CkptFactory, pg_url: str, own_seaweed: SeaweedServer, tmp_path: Path,
) -> None:
    prefix = f"mn-{uuid.uuid4().hex[:10]}"
    url = f"s3://{own_seaweed.bucket}/{prefix}?endpoint={own_seaweed.endpoint}"
    cluster = Cluster(ckpt_factory, pg_url, url)
    slow = tmp_path / "slow.toml"
    slow.write_text("upload_concurrency = 1\n")  # a's uploads one at a time
    a, b = cluster.node("a", "--config", str(slow)), cluster.node("b")
    (a.mountpoint / "out").mkdir()
    data = os.urandom(24 * CS + 99)
    small = os.urandom(1000)
    assert own_seaweed.proc is not None
    sync: subprocess.Popen[str] | None = None
    cat = PostgresCatalog(pg_url, pool_size=1, readonly=True)
    freeze(own_seaweed.proc.pid)  # a's uploads cannot finish
    try:
        (a.mountpoint / "out" / "rank0.bin").write_bytes(data)  # committed on a only
        (b.mountpoint / "out" / "rank1.bin").write_bytes(small)
        ino = os.stat(a.mountpoint / "out" / "rank0.bin").st_ino
        digests = {r.digest for r in cat.extents(ino).values()}
        assert len(digests) == 25 and cat.pending_uploads_for([ino]) == 25
        sync = subprocess.Popen(ckptfs_cmd("sync", str(b.mountpoint / "out"), "--timeout", "180"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        with pytest.raises(subprocess.TimeoutExpired):
            sync.wait(5)  # nothing of a's file can be on the bucket: b's sync waits
    finally:
        os.kill(own_seaweed.proc.pid, signal.SIGCONT)
    try:
        assert sync is not None
        out, err = sync.communicate(timeout=200)
        assert sync.returncode == 0, err
        # Returned only with every chunk of a's file on the bucket: in the catalog, and
        # the objects themselves.
        assert cat.pending_uploads_for([ino]) == 0
        assert all("remote0" in cat.replica_tiers(d) for d in digests)
        client = own_seaweed.client()
        try:
            for d in digests:
                client.head_object(Bucket=own_seaweed.bucket, Key=f"{prefix}/chunks/{d.hex()}")
        finally:
            client.close()
        assert (b.mountpoint / "out" / "rank0.bin").read_bytes() == data
    finally:
        if sync is not None and sync.poll() is None:
            sync.kill()
            sync.wait()
        cat.close()
