#!/usr/bin/env python3
"""bench_restore: restore from the bucket alone, several ckptfs builds and boto3 side by side.

The restore steps of scripts/bench_remote.py (4.) without the rest of it, for comparing
builds on a loaded machine: one SeaweedFS on 127.0.0.1; the checkpoint (N files built in
memory) saved once through each build's own node and synced (``ckptfs sync``), and
uploaded once by boto3 (multipart, 16 MiB parts). Then every round restores it with each
target in turn, the order rotating: a ckptfs target is unmounted, its local tiers wiped
(state dir kept), the page cache dropped, mounted again, and its files read by
``--threads`` threads into preallocated buffers (1 MiB ``readinto``), or with
``--into files`` read and written into plain files; the boto3 target downloads the same
bytes with ``--workers`` threads of 16 MiB ranged GETs into the same buffers (or pwrite).
Every byte is compared after the clock stops. Printed per restore: seconds, the ratio
to boto3's time in the same round (throughput, ckptfs / boto3), CPU seconds per GB of the
daemon, SeaweedFS and this script, and the daemon's GET counters.

    python scripts/bench_restore.py --code base=/work/wt/base-h1 --code new=. --rounds 3
        [--files 16 --file-mib 128] [--into memory|files|both] [--profile DIR]

``--code NAME=DIR[@ARG...]``: the ckptfs of checkout DIR as target NAME (default: this
checkout), each ``@ARG`` one more argument of its mounts (``@--config=FILE``).
``--profile DIR``: py-spy each daemon in the first round (that round is not counted).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_remote import (  # noqa: E402
    Node,
    _gone,
    boto3_download,
    boto3_upload,
    check_files,
    copy_to_files,
    loadavg,
    py_spy_start,
    py_spy_stop,
    read_to_memory,
    s3_client,
    save,
)
from benchio import (  # noqa: E402
    BenchError,
    MiB,
    Pattern,
    Source,
    cpu_seconds,
    drop_caches,
    prefault,
    same_bytes,
)

from tests.support.s3server import ACCESS_KEY, SECRET_KEY, SeaweedServer, find_weed  # noqa: E402


def run_ckptfs(code: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(code))
    return subprocess.run([sys.executable, "-m", "ckptfs", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=code, env=env)


class CodeNode(Node):
    """A bench_remote Node whose ckptfs is the one of checkout ``code``."""

    def __init__(self, code: Path, base: Path, remote: str, extra: list[str]) -> None:
        super().__init__(base, remote, extra)
        self.code = code

    def mount(self) -> None:
        self.mnt.mkdir(parents=True, exist_ok=True)
        for t in self.tiers:
            t.mkdir(parents=True, exist_ok=True)
        args = ["mount", str(self.mnt), "--state-dir", str(self.state), "--allow-shared-device"]
        for t in self.tiers:
            args += ["--local", str(t)]
        assert self.remote is not None
        args += ["--remote", self.remote]
        res = run_ckptfs(self.code, *args, *self.extra, timeout=300)
        with contextlib.suppress(OSError, ValueError):
            self.pid = int((self.state / "daemon.pid").read_text().strip())
        if res.returncode:
            raise BenchError(f"mount failed (exit {res.returncode}): {res.stderr.strip()}")

    def umount(self) -> None:
        res = run_ckptfs(self.code, "umount", str(self.mnt))
        if res.returncode:
            print(f"umount {self.mnt} failed: {res.stderr.strip()}; lazy unmount", file=sys.stderr)
            subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)], check=False)
        pid, self.pid = self.pid, None
        if pid is not None and not _gone(pid, 60):
            print(f"daemon {pid} still running 60 s after umount", file=sys.stderr)

    def sync(self) -> None:
        res = run_ckptfs(self.code, "sync", str(self.mnt), "--timeout", "1800", timeout=2000)
        if res.returncode:
            raise BenchError(f"ckptfs sync failed: {res.stderr.strip()}")


def perf_start(pid: int | None, out: Path) -> subprocess.Popen[bytes] | None:
    """``perf record -g`` of the daemon until stopped (SIGINT)."""
    if pid is None or shutil.which("perf") is None:
        return None
    return subprocess.Popen(["perf", "record", "-g", "-F", "499", "-p", str(pid), "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


COUNTERS = ("frame_buffers_made", "frame_buffers_reused", "copy_backs", "copy_backs_skipped",
            "heals")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--file-mib", type=int, default=128)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--into", choices=("memory", "files", "both"), default="memory")
    ap.add_argument("--pause", type=float, default=3.0)
    ap.add_argument("--mount-arg", action="append", default=[], metavar="ARG")
    ap.add_argument("--profile", type=Path, default=None, metavar="DIR")
    ap.add_argument("--profiler", choices=("pyspy", "perf"), default="pyspy")
    ap.add_argument("--dir", type=Path, default=Path("/work"))
    args = ap.parse_args(argv)
    codes: list[tuple[str, Path]] = []
    code_args: dict[str, list[str]] = {}
    for spec in args.code or [f"this={REPO}"]:
        name, _, rest = spec.partition("=")
        d, *more = rest.split("@")
        path = Path(d).resolve()
        if not (path / "ckptfs" / "__main__.py").is_file():
            ap.error(f"--code {spec}: not a ckptfs checkout")
        codes.append((name, path))
        code_args[name] = more
    weed = find_weed()
    if weed is None:
        raise SystemExit("weed not found")
    nbytes = args.files * args.file_mib * MiB
    gb = nbytes / 1e9
    intos = ["memory", "files"] if args.into == "both" else [args.into]
    print(f"{args.files} x {args.file_mib} MiB = {gb:.2f} GB; readers {args.threads}, boto3 "
          f"{args.workers} threads; targets {', '.join(n for n, _ in codes)}, boto3; "
          f"start {time.strftime('%H:%M:%S')}, {loadavg()}", flush=True)
    pattern = Pattern()
    files = [Source(pattern, i, args.file_mib * MiB) for i in range(args.files)]
    for i, f in enumerate(files):
        f.stamp(7000 + i)
    bufs: list[memoryview] = []
    for _ in files:
        b = bytearray(args.file_mib * MiB)
        prefault(b)
        bufs.append(memoryview(b))
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="ckptfs-bench-restore.") as tmp:
        base = Path(tmp)
        volumes = max(16, 2 * (len(codes) + 1) * (nbytes // (1 << 30) + 2) + 4)
        server = SeaweedServer(base / "seaweed", weed=weed, volume_size_limit_mb=1024,
                               volume_max=volumes)
        os.environ["AWS_ACCESS_KEY_ID"] = ACCESS_KEY
        os.environ["AWS_SECRET_ACCESS_KEY"] = SECRET_KEY
        nodes: dict[str, CodeNode] = {}
        ckpt = "checkpoint-100"
        try:
            server.start()
            client = s3_client(server, args.workers)
            for name, code in codes:
                prefix = f"restore-{name}-{uuid.uuid4().hex[:8]}"
                node = CodeNode(code, base / f"node-{name}",
                                f"s3://{server.bucket}/{prefix}?endpoint={server.endpoint}",
                                [*args.mount_arg, *code_args[name]])
                nodes[name] = node
                node.mount()
                save(node.mnt / ckpt, files, args.threads)
                node.sync()
                print(f"  saved and synced through {name} ({code})", flush=True)
            b3 = f"b3-{uuid.uuid4().hex[:8]}"
            boto3_upload(client, server.bucket, b3, files, args.workers)
            targets = [n for n, _ in codes] + ["boto3"]
            first = 0 if args.profile is None else -1
            for rnd in range(first, args.rounds):
                order = targets[rnd % len(targets):] + targets[:rnd % len(targets)]
                profiling = rnd < 0
                print(f"== round {rnd + 1}{' (profiled, not counted)' if profiling else ''}: "
                      f"{', '.join(order)}", flush=True)
                for into in intos:
                    boto_secs = None
                    row: dict[str, dict[str, float]] = {}
                    for t in order:
                        out = base / "out"
                        shutil.rmtree(out, ignore_errors=True)
                        node_ = nodes.get(t)
                        spy = None
                        if node_ is not None:
                            node_.umount()
                            node_.wipe_tiers()
                            drop_caches()
                            node_.mount()
                        os.sync()
                        drop_caches()
                        time.sleep(args.pause)
                        if node_ is not None and profiling and args.profile is not None:
                            args.profile.mkdir(parents=True, exist_ok=True)
                            spy = (py_spy_start(node_.pid, args.profile / f"{t}-{into}.txt")
                                   if args.profiler == "pyspy" else
                                   perf_start(node_.pid, args.profile / f"{t}-{into}.data"))
                        pid = node_.pid if node_ is not None else None
                        pids = (pid, server.pid, os.getpid())
                        before = [cpu_seconds(p) for p in pids]
                        t0 = time.perf_counter()
                        try:
                            if node_ is not None:
                                if into == "memory":
                                    read_to_memory(node_.mnt / ckpt, bufs, args.threads)
                                else:
                                    copy_to_files(node_.mnt / ckpt, out, len(files),
                                                  args.threads, MiB)
                            else:
                                boto3_download(client, server.bucket, b3, files, args.workers,
                                               bufs if into == "memory" else None,
                                               out if into == "files" else None)
                            secs = time.perf_counter() - t0
                            after = [cpu_seconds(p) for p in pids]
                        finally:
                            py_spy_stop(spy)
                        cpu = [(a - b) / gb if a is not None and b is not None else float("nan")
                               for a, b in zip(after, before, strict=True)]
                        if into == "memory":
                            for f, got in zip(files, bufs, strict=True):
                                same_bytes(f"{t} restored", got, f.view)
                        else:
                            check_files(out, files, bufs)
                        counters = node_.stats().get("counters", {}) if node_ else {}
                        row[t] = {"secs": secs, "daemon": cpu[0], "seaweed": cpu[1],
                                  "script": cpu[2]}
                        if t == "boto3":
                            boto_secs = secs
                        extra = " ".join(f"{k}={counters[k]}" for k in COUNTERS if k in counters)
                        print(f"  {into:6s} {t:8s} {secs:6.2f} s  CPU s/GB daemon "
                              f"{cpu[0]:.2f} SeaweedFS {cpu[1]:.2f} script {cpu[2]:.2f}  "
                              f"{loadavg()} {extra}", flush=True)
                    assert boto_secs is not None
                    for t, r in row.items():
                        r["ratio"] = boto_secs / r["secs"]
                        if not profiling:
                            results.setdefault((into, t), []).append(r)
                    print("  ratios (throughput vs boto3, this round): " + ", ".join(
                        f"{t} {r['ratio']:.2f}" for t, r in row.items() if t != "boto3"),
                        flush=True)
        finally:
            for node in nodes.values():
                node.umount()
            server.close()
    print(f"\nend {time.strftime('%H:%M:%S')}, {loadavg()}")
    print("| into | target | s, median (range) | ratio to boto3, each round | daemon CPU s/GB | "
          "SeaweedFS CPU s/GB | script CPU s/GB |")
    print("|---|---|---|---|---|---|---|")
    for (into, t), rs in results.items():
        times = [r["secs"] for r in rs]

        def cells(k: str, rs: list[dict[str, Any]] = rs) -> str:
            return ", ".join(f"{r[k]:.2f}" for r in rs)

        print(f"| {into} | {t} | {statistics.median(times):.2f} ({min(times):.2f}-{max(times):.2f})"
              f" | {cells('ratio')} | {cells('daemon')} | {cells('seaweed')} | "
              f"{cells('script')} |")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench_restore: {exc}", file=sys.stderr)
        sys.exit(1)
