#!/usr/bin/env python3
"""The (m) workload through the filesystem object, without FUSE: the daemon's own share of
a create + write 4 KiB + close, a rename and an unlink, as CPU per operation of this
process (time.process_time), on two real local tiers and a real SQLite catalog, with the
checkpoint detectors on (the daemon's object graph, built as the tests build it).

Run it once per build, alternating, e.g. for the code of DIR:

    cd DIR && PYTHONPATH=$PWD python /path/to/scripts/bench_meta_vfs.py --files 2000
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, os.getcwd())  # the build's tests (make_daemon) next to its ckptfs

from tests.vfs.test_vfs import make_daemon  # noqa: E402

from ckptfs.catalog.catalog import ROOT_INODE  # noqa: E402
from ckptfs.checkpoints.detectors import DetectorSet  # noqa: E402
from ckptfs.config import TierConfig  # noqa: E402
from ckptfs.tiers.local import LocalTier  # noqa: E402
from ckptfs.vfs.context import ROOT  # noqa: E402


async def main(files: int, root: Path) -> None:
    tiers = []
    for name in ("t0", "t1"):
        t = LocalTier(TierConfig(name, "local", root / name, create=True))
        t.open()
        tiers.append(t)
    data = os.urandom(files * 4096)
    async with make_daemon(root, tiers, detectors=DetectorSet.default()) as d:
        fs = d.fs
        dino = (await fs.mkdir(ROOT_INODE, b"meta", 0o755, ROOT)).ino
        names = [f"p0-{i:05d}.bin".encode() for i in range(files)]

        async def create() -> None:
            for i, n in enumerate(names):
                fh, _ = await fs.create(dino, n, 0o644, os.O_WRONLY | os.O_CREAT | os.O_EXCL, ROOT)
                await fs.write(fh, 0, data[i * 4096:(i + 1) * 4096])
                await fs.flush(fh)
                await fs.release(fh)

        async def stat() -> None:
            for n in names:
                await fs.getattr((await fs.lookup(dino, n)).ino)

        async def rename() -> None:
            for n in names:
                await fs.rename(dino, n, dino, b"r-" + n, 0, ROOT)

        async def unlink() -> None:
            for n in names:
                await fs.unlink(dino, b"r-" + n, ROOT)

        for op, fn in (("create", create), ("stat", stat), ("rename", rename), ("unlink", unlink)):
            await trio.sleep(0.5)  # the tracker and deleter finish the previous step
            c0, t0 = time.process_time(), time.perf_counter()
            await fn()
            await trio.sleep(0.1)  # their batches of this step (20 ms windows)
            c1, t1 = time.process_time(), time.perf_counter()
            print(f"{op:<7} {files / (t1 - t0 - 0.1):8.0f} op/s {1e6 * (c1 - c0) / files:7.0f} us CPU/op",
                  flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=2000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-meta-vfs-") as tmp:
        trio.run(main, args.files, Path(tmp))
