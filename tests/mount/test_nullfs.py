"""scripts/nullfs.py, the benchmarks' ceiling, gives write-only handles direct_io as ckptfs
does (vfs/handles.py), so the ceiling is measured on the requests ckptfs gets: what a
write-only handle wrote never lands in the kernel's page cache (a read returns nullfs's
zeros); with --cached-writes it does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON, is_mounted, wait_until

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)
@pytest.mark.parametrize("cached", [False, True])
def test_write_only_handles_bypass_the_page_cache_unless_asked(tmp_path: Path,
                                                               cached: bool) -> None:
    mnt = tmp_path / "null"
    mnt.mkdir()
    cmd = [sys.executable, str(ROOT / "scripts" / "nullfs.py"), str(mnt), "--read-ahead-kb", "0"]
    proc = subprocess.Popen(cmd + (["--cached-writes"] if cached else []))
    try:
        wait_until(lambda: is_mounted(mnt), what="nullfs mounted")
        data = b"x" * 65536
        fd = os.open(mnt / "f", os.O_WRONLY | os.O_CREAT, 0o644)
        assert os.write(fd, data) == len(data)
        os.close(fd)
        back = (mnt / "f").read_bytes()
        assert back == (data if cached else bytes(len(data)))
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], check=False)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
