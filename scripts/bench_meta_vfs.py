#!/usr/bin/env python3
"""The (m) workload through the filesystem object, without FUSE: the daemon's own share of
a create + write 4 KiB + close, a stat, a rename and an unlink, as CPU per operation of
this process (time.process_time), on two real local tiers and a real SQLite catalog (or,
with ``--pg URL``, a real PostgreSQL one), with the checkpoint detectors on (the daemon's
object graph, built as the tests build it). ``--count`` also prints the catalog's SQL
statements and round trips to the database per operation (PostgreSQL: round trips are
what a catalog call costs there).

Run it once per build, alternating, e.g. for the code of DIR:

    cd DIR && PYTHONPATH=$PWD python /path/to/scripts/bench_meta_vfs.py --files 2000
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import trio
from psycopg.conninfo import make_conninfo

sys.path.insert(0, os.getcwd())  # the build's ckptfs

from tests.vfs.test_vfs import daemon_on  # noqa: E402

from ckptfs.catalog import PostgresCatalog, SqliteCatalog  # noqa: E402
from ckptfs.catalog.catalog import ROOT_INODE  # noqa: E402
from ckptfs.checkpoints.detectors import DetectorSet  # noqa: E402
from ckptfs.config import TierConfig  # noqa: E402
from ckptfs.tiers.base import Tier  # noqa: E402
from ckptfs.tiers.local import LocalTier  # noqa: E402
from ckptfs.vfs.context import ROOT  # noqa: E402

CS = 64 * 1024


class Counter:
    """SQL statements and libpq round trips of this process (psycopg's own entry points)."""

    def __init__(self) -> None:
        self.statements = 0
        self.trips = 0
        self.tracing = False  # print each statement (--trace)

    def install(self) -> None:
        counter = self
        execute = psycopg.Cursor.execute

        def counted_execute(cur: Any, *a: Any, **k: Any) -> Any:
            counter.statements += 1
            if counter.tracing:
                print("   SQL", " ".join(str(a[0]).split())[:150], file=sys.stderr)
                if os.environ.get("TRACE_STACK"):
                    fr = [f for f in traceback.extract_stack() if "/ckptfs/" in f.filename]
                    print("      at", " < ".join(f"{f.filename.split('/ckptfs/')[1]}:{f.name}"
                                                 for f in reversed(fr[-6:])), file=sys.stderr)
            return execute(cur, *a, **k)

        psycopg.Cursor.execute = counted_execute  # type: ignore[method-assign,assignment]
        # A round trip is a wait for the server's answer: psycopg's generators yield
        # "wait for readable" only when no complete answer has arrived yet.
        wait = psycopg.Connection.wait
        wait_r = psycopg.waiting.Wait.R

        def counting(gen: Any) -> Any:
            try:
                state = next(gen)
                while True:
                    if state == wait_r:  # not RW: a pipeline only sending
                        counter.trips += 1
                    state = gen.send((yield state))
            except StopIteration as stop:
                return stop.value

        def counted_wait(conn: Any, gen: Any, *a: Any, **k: Any) -> Any:
            return wait(conn, counting(gen), *a, **k)

        psycopg.Connection.wait = counted_wait  # type: ignore[method-assign,assignment]


@contextmanager
def fresh_db(server: str | None) -> Iterator[str | None]:
    """A new empty database on the server of URL ``server`` (dropped afterwards)."""
    if server is None:
        yield None
        return
    name = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    try:
        yield make_conninfo(server, dbname=name)
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


async def main(files: int, root: Path, pg: str | None, counter: Counter | None,
               trace: bool) -> None:
    tiers: list[Tier] = []
    for name in ("t0", "t1"):
        t = LocalTier(TierConfig(name, "local", root / name, create=True))
        t.open()
        tiers.append(t)
    data = os.urandom(files * 4096)
    cat = PostgresCatalog(pg) if pg else SqliteCatalog(root / "catalog.sqlite")
    async with daemon_on(cat, tiers, chunk_size=CS, detectors=DetectorSet.default()) as d:
        fs = d.fs
        dino = (await fs.mkdir(ROOT_INODE, b"meta", 0o755, ROOT)).ino
        names = [f"p0-{i:05d}.bin".encode() for i in range(files)]

        async def create() -> None:
            for i, n in enumerate(names):
                if counter and trace:
                    counter.tracing = i == files // 2
                    if counter.tracing:
                        print(f"-- create {n.decode()}", file=sys.stderr)
                fh, _ = await fs.create(dino, n, 0o644, os.O_WRONLY | os.O_CREAT | os.O_EXCL, ROOT)
                await fs.write(fh, 0, data[i * 4096:(i + 1) * 4096])
                await fs.flush(fh)
                await fs.release(fh)

        async def stat() -> None:
            for n in names:
                await fs.getattr((await fs.lookup(dino, n)).ino)

        async def rename() -> None:
            for i, n in enumerate(names):
                if counter and trace:
                    counter.tracing = i == files // 2
                    if counter.tracing:
                        print(f"-- rename {n.decode()}", file=sys.stderr)
                await fs.rename(dino, n, dino, b"r-" + n, 0, ROOT)

        async def unlink() -> None:
            for i, n in enumerate(names):
                if counter and trace:
                    counter.tracing = i == files // 2
                    if counter.tracing:
                        print(f"-- unlink r-{n.decode()}", file=sys.stderr)
                await fs.unlink(dino, b"r-" + n, ROOT)

        steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("create", create), ("stat", stat), ("rename", rename), ("unlink", unlink)]
        for op, fn in steps:
            await trio.sleep(0.5)  # the tracker and deleter finish the previous step
            s0, r0 = (counter.statements, counter.trips) if counter else (0, 0)
            c0, t0 = time.process_time(), time.perf_counter()
            await fn()
            await trio.sleep(0.1)  # their batches of this step (20 ms windows)
            c1, t1 = time.process_time(), time.perf_counter()
            line = (f"{op:<7} {files / (t1 - t0 - 0.1):8.0f} op/s "
                    f"{1e6 * (c1 - c0) / files:7.0f} us CPU/op")
            if counter:
                line += (f" {(counter.statements - s0) / files:6.1f} statements/op"
                         f" {(counter.trips - r0) / files:6.1f} round trips/op")
            print(line, flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--pg", metavar="URL",
                    help="a PostgreSQL catalog, in a new database on the server of URL")
    ap.add_argument("--count", action="store_true", help="count statements and round trips (--pg)")
    ap.add_argument("--trace", action="store_true",
                    help="with --count: print the statements of the middle file's create, "
                    "rename and unlink (and whatever runs meanwhile) on stderr")
    args = ap.parse_args()
    counter = None
    if args.count:
        if not args.pg:
            ap.error("--count needs --pg")
        counter = Counter()
        counter.install()
    with tempfile.TemporaryDirectory(prefix="bench-meta-vfs-") as tmp, fresh_db(args.pg) as url:
        trio.run(main, args.files, Path(tmp), url, counter, args.trace)
