"""The loop's rules on a real mount and a real SeaweedFS (docs/concurrency.md): reads that
hang on the object store (SIGSTOP of this test's own server) leave local writes alone."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.support.freeze import freeze
from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON, mounted, run_cli, wait_until
from tests.support.s3server import SeaweedServer

pytestmark = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)

MiB = 1 << 20
ARGS = ("--chunk-size", "1MiB")
FAST = 5.0  # a correctness bound against a hang, not a benchmark


def write_fsync(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


@pytest.mark.allow_log_warnings("writer lease", "not reachable now", "moved from")
def test_reads_hung_on_the_object_store_leave_local_writes_alone(
    tmp_path: Path, own_seaweed: SeaweedServer
) -> None:
    """A restored node reads a file whose chunks only the bucket has; the server stops
    answering mid-read. The reader (and its readahead, more GETs than there are I/O
    threads) hangs, but a write + fsync and a read of a local file still return at once:
    remote GETs have threads of their own."""
    url = f"s3://{own_seaweed.bucket}/lr-{uuid.uuid4().hex[:10]}?endpoint={own_seaweed.endpoint}"
    data = os.urandom(8 * MiB)
    first = tmp_path / "node1"
    with mounted(first, 2, (*ARGS, "--remote", url)) as m:
        (m.mountpoint / "remote.bin").write_bytes(data)
        res = run_cli("sync", str(m.mountpoint), "--timeout", "60")
        assert res.returncode == 0, res.stdout + res.stderr
    shutil.rmtree(first)  # a lost node: only the bucket has the chunks
    with mounted(tmp_path / "node2", 2, (*ARGS, "--remote", url)) as m:
        assert "restored the catalog" in m.log
        local = os.urandom(MiB // 2)
        write_fsync(m.mountpoint / "local.bin", local)
        assert own_seaweed.proc is not None
        got: list[bytes] = []
        reader = threading.Thread(
            target=lambda: got.append((m.mountpoint / "remote.bin").read_bytes()), daemon=True
        )
        freeze(own_seaweed.proc.pid)  # connections open, no answers
        try:
            reader.start()
            time.sleep(0.5)  # not a wait for a condition: the reader is meant to hang
            assert reader.is_alive() and not got
            t0 = time.monotonic()
            write_fsync(m.mountpoint / "new.bin", os.urandom(2 * MiB + 17))
            with open(m.mountpoint / "local.bin", "rb", buffering=0) as f:
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
                assert f.read() == local
            assert time.monotonic() - t0 < FAST
            assert reader.is_alive()  # still hung on the remote
        finally:
            os.kill(own_seaweed.proc.pid, signal.SIGCONT)
        wait_until(lambda: not reader.is_alive(), timeout=120, what="the remote read ended")
        assert got == [data]
