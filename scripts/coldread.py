#!/usr/bin/env python3
"""coldread: cold reads only, several ckptfs builds side by side, alternating, several rounds.

The read steps of scripts/bench.py ((d), cold) without the rest of it: each target gets its
files once (a 1 GiB file, and 16 files of 1/16 of it for 4 reader threads), then every
round makes each target cold (sync, ckptfs unmounted, ``drop_caches``, mounted again, a
pause) and reads with 1 MiB ``readinto`` into a preallocated, pre-faulted buffer, as
bench.py does; every byte is compared after the clock stops. The targets take turns in
every round (the order rotates), so a loaded machine's drift hits them alike. Printed per
read: MB/s and the daemon's CPU seconds per GB (utime + stime from /proc, all threads, and
split into the trio thread and the others).

    python scripts/coldread.py --code base=/tmp/base --code new=. --rounds 3 [--nullfs]
        [--plain] [--size-mib 1024] [--profile DIR --profiler pyspy|perf]

``--code NAME=DIR``: run the ckptfs of checkout DIR as target NAME (default: this one).
``--profile DIR``: record each daemon during its first round's reads (not counted).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import CkptfsTarget, NullfsTarget, PlainTarget, Target  # noqa: E402
from benchio import (  # noqa: E402
    MiB,
    Pattern,
    Source,
    cpu_seconds,
    prefault,
    read_into,
    same_bytes,
    write_from,
)

VENV_BIN = Path(sys.executable).parent


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread kind: the trio loop (the main thread) and the others."""
    out = {"loop": 0.0, "threads": 0.0}
    tck = os.sysconf("SC_CLK_TCK")
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                cpu = (int(fields[11]) + int(fields[12])) / tck
                out["loop" if int(tid) == pid else "threads"] += cpu
    return out


def read_direct(path: Path, view: memoryview) -> None:
    """``read_into`` through an O_DIRECT handle (FUSE mounts: the daemon's reply lands in
    ``view`` itself, no page cache): 1 MiB ``readv`` calls."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    try:
        got = 0
        while got < len(view):
            n = os.readv(fd, [view[got:got + MiB]])
            if not n:
                raise OSError(f"{path}: short read at {got}")
            got += n
    finally:
        os.close(fd)


def _counters(t: Target) -> str:
    """The receive-buffer counters of a ckptfs daemon (its stats file, written each second)."""
    state = getattr(t, "state", None)
    if state is None:
        return ""
    time.sleep(1.2)
    with contextlib.suppress(OSError, ValueError):
        facts = json.loads((state / "stats.json").read_text())
        c = facts.get("counters", {})
        # Bytes sent as replies: read bytes count pushed pages too (vfs/pagepush.py).
        read = facts.get("app", {}).get("read_bytes", 0)
        c["replied_mib"] = (read - c.get("page_cache_pushed_bytes", 0)) // MiB
        return " ".join(f"{k}={c[k]}" for k in sorted(c)
                        if k.startswith(("frame_buffers", "page_cache", "replied")))
    return ""


class Recorder:
    """py-spy or perf attached to a daemon for the length of a read."""

    def __init__(self, kind: str, pid: int, out: Path) -> None:
        if kind == "pyspy":
            # --nonblocking: py-spy otherwise stops every thread for each sample and waits
            # until all have stopped; a page-cache push blocked in the kernel on a page a
            # reader's pending FUSE read holds never stops, and that read's answer needs the
            # stopped trio thread: the reads hung with the daemon idle (docs/performance.md).
            cmd = [str(VENV_BIN / "py-spy"), "record", "--threads", "-r", "200", "-p", str(pid),
                   "--format", "raw", "-o", str(out) + ".txt", "--nonblocking"]
        else:
            cmd = ["perf", "record", "-g", "-p", str(pid), "-o", str(out) + ".perf"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # attached before the clock starts

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--code", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--plain", action="store_true")
    ap.add_argument("--nullfs", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--skip-single", action="store_true")
    ap.add_argument("--skip-multi", action="store_true")
    ap.add_argument("--settle", type=float, default=3.0)
    ap.add_argument("--mount-arg", action="append", default=[])
    ap.add_argument("--dir", type=Path, default=Path("/work"))
    ap.add_argument("--profile", type=Path, default=None)
    ap.add_argument("--profiler", choices=("pyspy", "perf"), default="pyspy")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--o-direct", action="store_true",
                    help="FUSE targets read through O_DIRECT handles (no page cache)")
    ap.add_argument("--log-grep", default=None, help="print the daemon log lines with this")
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="coldread-", dir=args.dir))
    size = args.size_mib * MiB
    per = size // args.files
    targets: list[Target] = []
    if args.plain:
        targets.append(PlainTarget(root / "plain"))
    for spec in args.code or [f"this={Path(__file__).resolve().parent.parent}"]:
        name, _, d = spec.partition("=")
        node = CkptfsTarget(root / name, args.mount_arg, Path(d).resolve())
        node.name = name
        targets.append(node)
    if args.nullfs:
        targets.append(NullfsTarget(root / "nullfs"))
    pattern = Pattern()
    single = Source(pattern, 1, size)
    multi = [Source(pattern, 100 + i, per) for i in range(args.files)]
    into = bytearray(size)
    prefault(into)
    view = memoryview(into)
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    try:
        for t in targets:
            t.start()
            if not args.skip_single:
                write_from(t.dir / "single.bin", single.view)
            for i, s in enumerate(multi if not args.skip_multi else []):
                write_from(t.dir / f"m{i:02d}.bin", s.view)
            results[t.name] = {"single": [], "multi": []}
        os.sync()
        for r in range(args.rounds):
            order = targets[r % len(targets):] + targets[: r % len(targets)]
            for t in order:
                for kind in ("single", "multi"):
                    if (kind == "single" and args.skip_single) or (kind == "multi" and args.skip_multi):
                        continue
                    t.make_cold()
                    os.sync()
                    time.sleep(args.settle)
                    pid = t.daemon_pid()
                    rec = None
                    if args.profile is not None and r == 0 and pid is not None:
                        args.profile.mkdir(parents=True, exist_ok=True)
                        rec = Recorder(args.profiler, pid, args.profile / f"{t.name}-{kind}")
                    c0 = cpu_seconds(pid)
                    th0 = thread_cpu(pid) if pid else None
                    t0 = time.perf_counter()
                    rd = read_direct if args.o_direct and not isinstance(t, PlainTarget) else read_into
                    if kind == "single":
                        rd(t.dir / "single.bin", view)
                    else:
                        with ThreadPoolExecutor(args.threads) as ex:
                            list(ex.map(lambda i, rd=rd, d=t.dir: rd(d / f"m{i:02d}.bin",
                                                                     view[i * per:(i + 1) * per]),
                                        range(args.files)))
                    secs = time.perf_counter() - t0
                    c1 = cpu_seconds(pid)
                    th1 = thread_cpu(pid) if pid else None
                    if rec is not None:
                        rec.stop()
                    if t.verify:
                        if kind == "single":
                            same_bytes(f"{t.name} single", view, single.view)
                        else:
                            for i, s in enumerate(multi):
                                same_bytes(f"{t.name} m{i}", view[i * per:(i + 1) * per], s.view)
                    n = size if kind == "single" else per * args.files
                    row: dict[str, float] = {"mb_s": n / secs / 1e6, "round": r}
                    line = f"round {r} {t.name:>8} {kind:>6}: {row['mb_s']:7.0f} MB/s"
                    if c0 is not None and c1 is not None and th0 and th1:
                        gb = n / 1e9
                        row["cpu_gb"] = (c1 - c0) / gb
                        row["loop_gb"] = (th1["loop"] - th0["loop"]) / gb
                        row["threads_gb"] = (th1["threads"] - th0["threads"]) / gb
                        line += (f"  daemon {row['cpu_gb']:.2f} CPU s/GB (loop {row['loop_gb']:.2f},"
                                 f" threads {row['threads_gb']:.2f})")
                    if rec is not None:
                        line += "  [profiled, not counted]"
                    else:
                        results[t.name][kind].append(row)
                    line += f"  load {os.getloadavg()[0]:.1f}"
                    if args.log_grep and hasattr(t, "state"):
                        for ln in (t.state / "ckptfs.log").read_text().splitlines():
                            if args.log_grep in ln:
                                print("    " + ln[-160:])
                    counters = _counters(t)
                    if counters:
                        line += f"  {counters}"
                    print(line, flush=True)
        print("\nmedians (range):")
        for name, kinds in results.items():
            for kind, rows in kinds.items():
                if not rows:
                    continue
                mb = [x["mb_s"] for x in rows]
                cpu = [x["cpu_gb"] for x in rows if "cpu_gb" in x]
                line = f"  {name:>8} {kind:>6}: {statistics.median(mb):6.0f} MB/s ({min(mb):.0f}-{max(mb):.0f})"
                if cpu:
                    line += f"  {statistics.median(cpu):.2f} CPU s/GB ({min(cpu):.2f}-{max(cpu):.2f})"
                print(line)
        if args.json is not None:
            args.json.write_text(json.dumps(results, indent=1))
    finally:
        for t in targets:
            with contextlib.suppress(Exception):
                t.stop()
            t.cleanup()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
