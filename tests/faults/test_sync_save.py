"""A checkpoint saved by several threads with fsync, through the save path of issue 12
(O_DIRECT frames ending in a buffered partial block, fsyncs of all frames at once,
write-behind fsyncs): after kill -9 of the daemon and a remount, every fsynced file reads
back bit-identical, and a file fsynced and then written further shows what its fsync
committed."""

from __future__ import annotations

import contextlib
import json
import os
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.faults.test_faults import kill9_daemon, wait_until, write_config
from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON, Mount, mounted

pytestmark = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)

MiB = 1024 * 1024


def blob(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def write_fsync(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for off in range(0, len(data), MiB):
            os.write(fd, data[off : off + MiB])
        os.fsync(fd)
    finally:
        os.close(fd)


def counters(m: Mount) -> dict[str, int]:
    try:
        return dict(json.loads((m.state_dir / "stats.json").read_text()).get("counters", {}))
    except (OSError, ValueError):
        return {}


@pytest.mark.allow_log_warnings("cleaning up stale mount")
def test_fsynced_save_by_threads_survives_kill9(tmp_path: Path) -> None:
    cfg = write_config(tmp_path / "ckptfs.toml", 'chunk_size = "1MiB"\nwrite_behind = "auto"\n')
    # Sizes that end inside a chunk and inside a 4 KiB block: every frame has a partial
    # last block (written through the page cache), the last chunk of each file is short.
    files = {f"shard-{i:02d}.bin": blob(i, 3 * MiB + 4096 * i + 17 * i + 5) for i in range(12)}
    with mounted(tmp_path, n_local=2, extra_args=("--config", str(cfg))) as m:
        write_fsync(m.mountpoint / "first.bin", blob(99, 2 * MiB + 3))  # saves fsync: write-behind
        tmp = m.mountpoint / "tmp-checkpoint-1"
        tmp.mkdir()
        with ThreadPoolExecutor(4) as ex:
            list(ex.map(lambda kv: write_fsync(tmp / kv[0], kv[1]), files.items()))
        os.rename(tmp, m.mountpoint / "checkpoint-1")
        fd = os.open(m.mountpoint, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        # A file fsynced, then written further and left open: its fsync is what counts.
        synced_part, later = blob(200, 2 * MiB + 100), blob(201, MiB + 50)
        open_fd = os.open(m.mountpoint / "open.bin", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.write(open_fd, synced_part)
            os.fsync(open_fd)
            os.write(open_fd, later)
            wait_until(lambda: counters(m).get("write_behind_syncs", 0) > 0, 30,
                       "the daemon to report write-behind fsyncs (stats.json)")
            kill9_daemon(m)
        finally:
            with contextlib.suppress(OSError):
                os.close(open_fd)  # the mount is gone: ENOTCONN
        m.start()
        ckpt = m.mountpoint / "checkpoint-1"
        assert sorted(p.name for p in ckpt.iterdir()) == sorted(files)
        for name, data in files.items():
            assert (ckpt / name).read_bytes() == data, name
        assert (m.mountpoint / "first.bin").read_bytes() == blob(99, 2 * MiB + 3)
        assert (m.mountpoint / "open.bin").read_bytes() == synced_part
        m.stop()
        m.start()  # and once more from a clean unmount, the page cache dropped by it
        for name, data in files.items():
            assert (ckpt / name).read_bytes() == data, name
