#!/usr/bin/env python3
"""The metadata rows (m) of scripts/bench.py alone, for one or several builds side by side.

Each round mounts every build in turn (the order alternates between rounds) as bench.py
mounts ckptfs (two ``--local`` tiers on one disk), makes one directory through the mount
and runs the (m) workload in it from this process (or ``--procs`` forked ones): create +
write 4 KiB + close, stat, rename, unlink of ``--files`` files, each timed on its own.
Next to the rate: the daemon's CPU (utime + stime) per operation, the figure that holds on
a shared machine. ``--profile OP`` records the daemon with py-spy during that operation
(one SVG per build and round, raw stacks with ``--profile-format raw``). ``--requests``
also counts the FUSE requests per operation (from the daemon's metrics, served on a
loopback port for the run). ``--pin CPU`` runs the daemon's threads and the workload on
that one CPU: the difference to an unpinned round is what waking a thread on the other
CPU costs (on this VM, an interprocessor interrupt through the host).

    python scripts/bench_meta.py --code base=/tmp/base --code new=. [--rounds 3]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import META_SIZE, CkptfsTarget, meta_op  # noqa: E402
from benchio import run_forked  # noqa: E402

OPS = ("create", "stat", "rename", "unlink")
REPO = Path(__file__).resolve().parent.parent
PY_SPY = REPO / ".venv" / "bin" / "py-spy"


def cpu_split(pid: int | None) -> tuple[float, float]:
    """User and system CPU seconds of a process (all threads) so far."""
    if pid is None:
        return float("nan"), float("nan")
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tck = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tck, int(fields[12]) / tck


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def request_counts(port: int) -> dict[str, float]:
    """The daemon's FUSE requests so far, by operation (ckptfs_fuse_op_seconds_count)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        r'^ckptfs_fuse_op_seconds_count\{op="(\w+)"\} (\S+)$', text, re.M)}


def pin(pid: int, cpu: int) -> None:
    """Every thread of ``pid`` onto ``cpu`` (threads started later inherit it)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(tid), {cpu})


def run_op(op: str, d: Path, files: int, procs: int, data: bytes) -> float:
    if procs == 1:
        t0 = time.perf_counter()
        meta_op(op, d, [f"p0-{i:05d}.bin" for i in range(files)], 0, data)
        return time.perf_counter() - t0
    per = files // procs
    return run_forked([
        functools.partial(meta_op, op, d, [f"p{k}-{i:05d}.bin" for i in range(per)], k * per, data)
        for k in range(procs)
    ])


def one_build(label: str, code: Path, root: Path, args: argparse.Namespace, data: bytes,
              rnd: int) -> dict[str, dict[str, float]]:
    code_dir, _, extra = str(code).partition("@")  # DIR@ARGS: extra mount args of this build
    port = free_port() if args.requests else None
    metrics = [] if port is None else ["--metrics-address", f"127.0.0.1:{port}"]
    t = CkptfsTarget(root / label, list(args.mount_arg) + metrics + extra.split(),
                     code=Path(code_dir).resolve())
    out: dict[str, dict[str, float]] = {}
    own_cpus = os.sched_getaffinity(0)
    try:
        t.start()
        pid = t.daemon_pid()
        if args.pin is not None and pid is not None:
            pin(pid, args.pin)
            os.sched_setaffinity(0, {args.pin})  # the workload (and its forked processes)
        d = t.dir / "meta"
        d.mkdir()
        for op in OPS:
            spy = None
            if op in args.profile.split(",") and pid is not None:
                fmt = args.profile_format
                dest = Path(args.profile_dir) / f"{label}-{op}-r{rnd}.{'svg' if fmt == 'flamegraph' else 'txt'}"
                spy = subprocess.Popen(
                    [str(PY_SPY), "record", "-p", str(pid), "-r", "200", "--threads",
                     "-f", fmt, "-o", str(dest)] + (["--native"] if args.native else ["--nonblocking"]),
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)
            time.sleep(args.settle)
            c0 = request_counts(port) if port is not None else {}
            u0, s0 = cpu_split(pid)
            secs = run_op(op, d, args.files, args.procs, data)
            u1, s1 = cpu_split(pid)
            reqs = ""
            if port is not None:
                time.sleep(0.5)  # the RELEASEs the kernel sends after close returned
                c1 = request_counts(port)
                reqs = "  requests/op: " + ", ".join(
                    f"{k} {(c1[k] - c0.get(k, 0)) / args.files:.2f}"
                    for k in sorted(c1) if c1[k] != c0.get(k, 0))
            if spy is not None:
                spy.send_signal(2)
                spy.wait(60)
            cpu, sys_cpu = (u1 - u0) + (s1 - s0), s1 - s0
            out[op] = {"ops_s": args.files / secs, "cpu_us": cpu * 1e6 / args.files,
                       "sys_us": sys_cpu * 1e6 / args.files}
            print(f"  r{rnd} {label:<6} {op:<7} {args.files / secs:8.0f} op/s  "
                  f"{cpu * 1e6 / args.files:7.0f} us CPU/op (sys {sys_cpu * 1e6 / args.files:.0f})"
                  + reqs, flush=True)
        if any(d.iterdir()):
            raise SystemExit(f"{d} not empty after the unlinks")
        t.stop()
    finally:
        os.sched_setaffinity(0, own_cpus)
        t.cleanup()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--code", action="append", default=[], metavar="LABEL=DIR",
                    help="a build to run (a checkout, optionally @'extra mount args'); "
                    "default: this one as 'new'")
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settle", type=float, default=1.0, help="pause before each op (s)")
    ap.add_argument("--mount-arg", action="append", default=[], metavar="ARG")
    ap.add_argument("--dir", default=None, help="base dir (default: a temp dir)")
    ap.add_argument("--profile", default="", metavar="OPS", help="e.g. create,rename")
    ap.add_argument("--profile-format", default="flamegraph", choices=("flamegraph", "raw"))
    ap.add_argument("--profile-dir", default=".")
    ap.add_argument("--native", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--requests", action="store_true",
                    help="count the FUSE requests per operation (daemon metrics on loopback)")
    ap.add_argument("--pin", type=int, default=None, metavar="CPU",
                    help="run the daemon's threads and the workload on this one CPU")
    args = ap.parse_args()
    Path(args.profile_dir).mkdir(parents=True, exist_ok=True)
    builds = [tuple(c.split("=", 1)) for c in args.code] or [("new", str(REPO))]
    data = os.urandom(args.files * META_SIZE)
    root = Path(tempfile.mkdtemp(prefix="bench-meta-", dir=args.dir))
    results: dict[str, list[dict[str, dict[str, float]]]] = {label: [] for label, _ in builds}
    try:
        for rnd in range(args.rounds):
            order = builds if rnd % 2 == 0 else builds[::-1]
            for label, code in order:
                results[label].append(one_build(label, Path(code), root, args, data, rnd))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nmedians of {args.rounds} rounds, {args.files} files, {args.procs} process(es):")
    for op in OPS:
        cells = []
        for label, _ in builds:
            rs = results[label]
            rate = statistics.median(r[op]["ops_s"] for r in rs)
            cpu = statistics.median(r[op]["cpu_us"] for r in rs)
            cells.append(f"{label} {rate:7.0f} op/s {cpu:6.0f} us")
        print(f"  {op:<7} " + " | ".join(cells))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
