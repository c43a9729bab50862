#!/usr/bin/env python3
"""Throughput of ckptfs next to a plain directory and a null FUSE filesystem, in one run.

The same work runs on three targets, one after the other:

* ``plain``  - a directory on the base dir's disk (the kernel's own filesystem);
* ``ckptfs`` - a ckptfs mount with two ``--local`` tiers, both directories under the base dir,
  so on the SAME disk: striping cannot add bandwidth here, this measures overhead;
* ``nullfs`` - ``scripts/nullfs.py``, a pyfuse3 + trio filesystem that discards writes and reads
  zeros: the ceiling of any Python FUSE daemon on this machine.

Tests: (a) one big file written with 1 MiB writes, then closed; (b) the same with fsync before
close; (c) a checkpoint directory of 16 files written by 4 threads; (d) sequential reads of (a)
and (c), cold (sync + drop_caches; ckptfs is also unmounted and mounted again so its own
caches are cold) and warm (read again at once). Cold reads need root.

Data is random and incompressible: one 64 MiB ``os.urandom`` pattern, and every 1 MiB block is
a 16-byte prefix (file number, block number) followed by a slice of that pattern at an offset
that varies per block, so no two chunks are identical (ckptfs deduplicates identical chunks).
Reads check a sample of blocks (every 16th and the last of each file) byte for byte.

Each pass runs the three targets in turn, and by default there are 3 passes (1 with --quick).
The table shows the median of the passes, followed by the range.

    python scripts/bench.py [--quick] [--size-gib N] [--dir BASE] [--json OUT] [--repeat N]
    python scripts/bench.py --remote [--files N --file-mib M]   # the remote tier (bench_remote.py)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MiB = 1024 * 1024
GiB = 1024 * MiB
BLOCK = MiB
PREFIX = 16
PATTERN_SIZE = 64 * MiB
VERIFY_EVERY = 16

REPO = Path(__file__).resolve().parent.parent
NULLFS = REPO / "scripts" / "nullfs.py"
TARGETS = ("plain", "ckptfs", "nullfs")


class BenchError(Exception):
    pass


# --------------------------------------------------------------------------------------
# data


class Data:
    """Deterministic, incompressible, never-repeating 1 MiB blocks built from one pattern."""

    def __init__(self) -> None:
        self.pattern = memoryview(os.urandom(PATTERN_SIZE))
        self._span = PATTERN_SIZE - BLOCK

    def parts(self, file_id: int, block: int) -> tuple[bytes, memoryview]:
        prefix = struct.pack("<QQ", file_id, block)
        off = ((file_id * 7919 + block) * 4 * 4096 + block * 16) % self._span
        return prefix, self.pattern[off : off + BLOCK - PREFIX]

    def block(self, file_id: int, block: int) -> bytes:
        prefix, body = self.parts(file_id, block)
        return prefix + bytes(body)


def write_file(path: Path, data: Data, file_id: int, nbytes: int, fsync: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        nblocks = (nbytes + BLOCK - 1) // BLOCK
        for i in range(nblocks):
            prefix, body = data.parts(file_id, i)
            want = min(BLOCK, nbytes - i * BLOCK)
            bufs: list[Any] = [prefix, body] if want == BLOCK else [(prefix + bytes(body))[:want]]
            n = os.writev(fd, bufs)
            if n != want:  # short write: finish it the slow way
                rest = b"".join(bytes(b) for b in bufs)[n:]
                while rest:
                    rest = rest[os.write(fd, rest) :]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


Samples = dict[int, bytes]


def expected_samples(data: Data, file_id: int, nbytes: int) -> Samples:
    """The blocks a read checks (every VERIFY_EVERY-th and the last), built before timing."""
    nblocks = (nbytes + BLOCK - 1) // BLOCK
    picks = set(range(0, nblocks, VERIFY_EVERY)) | {nblocks - 1}
    return {i: data.block(file_id, i)[: min(BLOCK, nbytes - i * BLOCK)] for i in sorted(picks)}


def read_file(path: Path, samples: Samples | None, nbytes: int) -> None:
    """Read sequentially with 1 MiB reads; compare the sampled blocks unless None.

    Nothing is allocated per block inside the loop: the expected blocks were built before
    the clock started, and bytearray == bytes is a single memcmp.
    """
    buf = bytearray(BLOCK)
    mv = memoryview(buf)
    total = 0
    with open(path, "rb", buffering=0) as f:
        i = 0
        while True:
            # Fill a whole block (a read may return less) so blocks line up for checking.
            got = 0
            while got < BLOCK:
                n = f.readinto(mv[got:])
                if not n:
                    break
                got += n
            if got == 0:
                break
            total += got
            want = samples.get(i) if samples is not None else None
            if want is not None and (buf if got == BLOCK else buf[:got]) != want:
                bad = next(
                    (k for k in range(min(got, len(want))) if buf[k] != want[k]),
                    min(got, len(want)),
                )
                raise BenchError(
                    f"WRONG DATA in {path}: block {i} (file offset {i * BLOCK}) differs "
                    f"at byte {bad} of the block (got {got} bytes, expected {len(want)})"
                )
            i += 1
            if got < BLOCK:
                break
    if total != nbytes:
        raise BenchError(f"{path}: read {total} bytes, expected {nbytes}")


# --------------------------------------------------------------------------------------
# machine


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def mount_of(path: Path) -> tuple[str, str, str]:
    """(device, mount point, fstype) of the filesystem holding ``path``."""
    real = os.path.realpath(path)
    best = ("?", "/", "?")
    for line in _read("/proc/mounts").splitlines():
        dev, mnt, fstype = line.split()[:3]
        mnt = mnt.replace("\\040", " ")
        if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best[1]):
            best = (dev, mnt, fstype)
    return best


def machine_info(base: Path) -> dict[str, Any]:
    cpu = "?"
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kib = 0
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            mem_kib = int(line.split()[1])
    dev, mnt, fstype = mount_of(base)
    st = os.statvfs(base)
    rotational = "?"
    name = os.path.basename(os.path.realpath(dev)) if dev.startswith("/dev/") else ""
    if name:
        rot = _read(f"/sys/class/block/{name}/queue/rotational").strip()
        if not rot:  # a partition: ask its disk
            rot = _read(f"/sys/class/block/{name}/../queue/rotational").strip()
        rotational = {"0": "non-rotational", "1": "rotational (or unknown virtual disk)"}.get(
            rot, "?"
        )
    fuse_version = "?"
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["fusermount3", "--version"], capture_output=True, text=True, timeout=10
        )
        fuse_version = (out.stdout + out.stderr).strip().splitlines()[0]
    ckptfs_version = "?"
    with contextlib.suppress(OSError, subprocess.SubprocessError, IndexError):
        out = subprocess.run(
            [sys.executable, "-m", "ckptfs", "--version"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
        ckptfs_version = (
            (out.stdout + out.stderr).strip().splitlines()[-1] if out.returncode == 0 else "?"
        )
    try:
        import pyfuse3

        pyfuse3_version = pyfuse3.__version__
    except Exception:  # noqa: BLE001
        pyfuse3_version = "not importable"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "ram_gib": round(mem_kib / 1024 / 1024, 1),
        "base_dir": str(base),
        "disk": dev,
        "disk_kind": rotational,
        "filesystem": fstype,
        "mounted_on": mnt,
        "disk_size_gib": round(st.f_blocks * st.f_frsize / GiB, 1),
        "disk_free_gib": round(st.f_bavail * st.f_frsize / GiB, 1),
        "kernel": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "pyfuse3": pyfuse3_version,
        "fusermount3": fuse_version,
        "ckptfs": ckptfs_version,
        "root": os.geteuid() == 0,
        # Proactive reclaim (DAMON) pages out idle page cache: warm reads must follow at once.
        "damon_active": _read("/sys/kernel/mm/damon/admin/kdamonds/0/state").strip() == "on",
        # Free page reporting (virtio-balloon): freed guest memory goes back to the host within
        # seconds, so every new page-cache page costs a host fault on first touch.
        "free_page_reporting": os.path.exists("/sys/module/page_reporting"),
    }


# --------------------------------------------------------------------------------------
# mounts


def is_mounted(path: Path) -> bool:
    real = os.path.realpath(path)
    return any(
        line.split()[1] == real for line in _read("/proc/mounts").splitlines() if line.strip()
    )


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    # a zombie that is not our child still answers kill(0)
    return "State:\tZ" not in _read(f"/proc/{pid}/status")


def wait_pid_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


def kill_pid(pid: int) -> None:
    """End a process this script started, by PID: SIGTERM, then SIGKILL."""
    with contextlib.suppress(ProcessLookupError):
        if not pid_alive(pid):
            return
        os.kill(pid, signal.SIGTERM)
        if not wait_pid_gone(pid, 10):
            os.kill(pid, signal.SIGKILL)
            wait_pid_gone(pid, 10)


def force_unmount(mnt: Path) -> None:
    if is_mounted(mnt):
        r = subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True, text=True)
        if r.returncode != 0 and is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)


class Target:
    name = "?"
    verify = True

    def __init__(self, root: Path) -> None:
        self.root = root
        self.dir = root  # where the test files go
        self.events: dict[str, list[float]] = {}

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)

    def make_cold(self) -> None:
        """Drop every cache between the data and the reader."""
        drop_caches()

    def stop(self) -> None:
        pass

    def cleanup(self) -> None:
        """Best effort, always called: unmount, kill what we started, remove our files."""
        shutil.rmtree(self.root, ignore_errors=True)

    def describe(self) -> str:
        return str(self.dir)


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


class PlainTarget(Target):
    name = "plain"


class CkptfsTarget(Target):
    name = "ckptfs"

    def __init__(self, root: Path, extra: list[str]) -> None:
        super().__init__(root)
        self.mnt = root / "mnt"
        self.state = root / "state"
        self.tiers = [root / "tier0", root / "tier1"]
        self.dir = self.mnt
        self.extra = extra
        self.pid: int | None = None
        self.started: list[int] = []

    def _cli(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ckptfs", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO,
        )

    def log_tail(self, n: int = 30) -> str:
        lines = _read(str(self.state / "ckptfs.log")).splitlines()
        return "\n".join(lines[-n:])

    def mount(self) -> None:
        self.mnt.mkdir(parents=True, exist_ok=True)
        for t in self.tiers:
            t.mkdir(parents=True, exist_ok=True)
        args = ["mount", str(self.mnt), "--state-dir", str(self.state)]
        for t in self.tiers:
            args += ["--local", str(t)]
        t0 = time.perf_counter()
        try:
            r = self._cli(*args, *self.extra, timeout=120)
        finally:
            # Whatever happened, a daemon that wrote its pid is ours to stop.
            with contextlib.suppress(OSError, ValueError):
                pid = int((self.state / "daemon.pid").read_text().strip())
                if pid not in self.started and pid_alive(pid):
                    self.started.append(pid)
                    self.pid = pid
        if r.returncode != 0:
            raise BenchError(
                f"ckptfs mount failed (exit {r.returncode}): {r.stderr.strip()}\n{self.log_tail()}"
            )
        if not is_mounted(self.mnt):
            raise BenchError(f"ckptfs mount returned 0 but {self.mnt} is not mounted")
        self.events.setdefault("mount_s", []).append(time.perf_counter() - t0)

    def umount(self) -> None:
        t0 = time.perf_counter()
        r = self._cli("umount", str(self.mnt), timeout=900)
        dt = time.perf_counter() - t0
        if r.returncode != 0:
            raise BenchError(
                f"ckptfs umount failed (exit {r.returncode}): {r.stderr.strip()}\n{self.log_tail()}"
            )
        if is_mounted(self.mnt):
            raise BenchError(f"ckptfs umount returned 0 but {self.mnt} is still mounted")
        if self.pid is not None:
            if not wait_pid_gone(self.pid, 60):
                raise BenchError(f"ckptfs daemon {self.pid} still running 60 s after umount")
            self.started.remove(self.pid)
            self.pid = None
        self.events.setdefault("umount_s", []).append(dt)

    def start(self) -> None:
        super().start()
        self.mount()

    def make_cold(self) -> None:
        self.umount()
        drop_caches()
        self.mount()

    def stop(self) -> None:
        self.umount()

    def cleanup(self) -> None:
        force_unmount(self.mnt)
        for pid in list(self.started):
            kill_pid(pid)
        self.started.clear()
        if is_mounted(self.mnt):
            print(f"  ! {self.mnt} is still mounted; leaving {self.root} in place", file=sys.stderr)
            return
        super().cleanup()

    def describe(self) -> str:
        tiers = ", ".join(str(t) for t in self.tiers)
        return f"{self.mnt} (--local {tiers}; state {self.state})"


class NullfsTarget(Target):
    name = "nullfs"
    verify = False  # reads are zeros by design

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.mnt = root / "mnt"
        self.dir = self.mnt
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        super().start()
        self.mnt.mkdir(exist_ok=True)
        with open(self.root / "nullfs.log", "wb") as logf:  # the child keeps its own copy
            self.proc = subprocess.Popen(
                [sys.executable, str(NULLFS), str(self.mnt)],
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + 30
        while not is_mounted(self.mnt):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(
                    f"nullfs did not mount: {_read(str(self.root / 'nullfs.log'))[-2000:]}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        r = subprocess.run(["fusermount3", "-u", str(self.mnt)], capture_output=True, text=True)
        if r.returncode != 0:
            raise BenchError(f"fusermount3 -u {self.mnt}: {r.stderr.strip()}")
        if self.proc is not None:
            self.proc.wait(timeout=30)

    def cleanup(self) -> None:
        force_unmount(self.mnt)
        if self.proc is not None:
            if self.proc.poll() is None:
                kill_pid(self.proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        if is_mounted(self.mnt):
            print(f"  ! {self.mnt} is still mounted; leaving {self.root} in place", file=sys.stderr)
            return
        super().cleanup()

    def describe(self) -> str:
        return f"{self.mnt} (scripts/nullfs.py: writes discarded, reads zeros)"


# --------------------------------------------------------------------------------------
# the work


@dataclass
class Params:
    single_bytes: int
    ckpt_files: int
    ckpt_file_bytes: int
    threads: int

    @property
    def ckpt_bytes(self) -> int:
        return self.ckpt_files * self.ckpt_file_bytes


@dataclass
class Test:
    key: str
    label: str
    nbytes: Callable[[Params], int]


def fmt_size(n: int) -> str:
    if n % GiB == 0:
        return f"{n // GiB} GiB"
    if n % MiB == 0:
        return f"{n // MiB} MiB"
    return f"{n} B"


def tests_for(p: Params) -> list[Test]:
    one = fmt_size(p.single_bytes)
    ck = f"{p.ckpt_files}x{fmt_size(p.ckpt_file_bytes)}"
    return [
        Test("write_single", f"(a) write {one} file, close", lambda p: p.single_bytes),
        Test("write_single_fsync", f"(b) write {one} file, fsync, close", lambda p: p.single_bytes),
        Test("write_ckpt", f"(c) write ckpt {ck}, {p.threads} threads", lambda p: p.ckpt_bytes),
        Test("read_single_cold", f"(d) read {one} file, cold", lambda p: p.single_bytes),
        Test("read_single_warm", f"(d) read {one} file, warm", lambda p: p.single_bytes),
        Test("read_ckpt_cold", f"(d) read ckpt, {p.threads} threads, cold", lambda p: p.ckpt_bytes),
        Test("read_ckpt_warm", f"(d) read ckpt, {p.threads} threads, warm", lambda p: p.ckpt_bytes),
    ]


SINGLE_ID = 1
FSYNC_ID = 2
CKPT_ID0 = 100


@dataclass
class TargetResult:
    results: dict[str, dict[str, float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def timed(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_target(
    t: Target, data: Data, p: Params, can_drop: bool, out: TargetResult, settle: float
) -> None:
    # Expected contents of the sampled blocks, built once, outside the timed reads.
    single_samples = expected_samples(data, SINGLE_ID, p.single_bytes) if t.verify else None
    ckpt_samples = [
        expected_samples(data, CKPT_ID0 + i, p.ckpt_file_bytes) if t.verify else None
        for i in range(p.ckpt_files)
    ]
    single = t.dir / "single.bin"
    single_fsync = t.dir / "single-fsync.bin"
    ckpt = t.dir / "checkpoint-000100"
    names = [ckpt / f"shard-{i:05d}-of-{p.ckpt_files:05d}.bin" for i in range(p.ckpt_files)]

    def record(key: str, nbytes: int, secs: float) -> None:
        out.results[key] = {"bytes": nbytes, "seconds": secs, "mb_per_s": nbytes / secs / 1e6}
        print(f"  {key:<20} {nbytes / secs / 1e6:10.1f} MB/s  ({secs:.2f} s)", flush=True)

    def write_ckpt() -> None:
        ckpt.mkdir()
        with ThreadPoolExecutor(p.threads) as ex:
            list(
                ex.map(
                    lambda i: write_file(names[i], data, CKPT_ID0 + i, p.ckpt_file_bytes),
                    range(p.ckpt_files),
                )
            )

    def read_ckpt() -> None:
        with ThreadPoolExecutor(p.threads) as ex:
            list(
                ex.map(
                    lambda i: read_file(names[i], ckpt_samples[i], p.ckpt_file_bytes),
                    range(p.ckpt_files),
                )
            )

    def step(key: str, nbytes: int, fn: Callable[[], None], pause: bool = True) -> None:
        if settle and pause:
            # Every write and cold read starts from the same state: no dirty data of the
            # previous step being written back, and memory freed by it already handed back to
            # the host. Warm reads follow at once: this kernel pages out idle page cache
            # (DAMON), so waiting would cool them.
            os.sync()
            time.sleep(settle)
        try:
            record(key, nbytes, timed(fn))
        except BenchError as e:
            out.errors.append(f"{key}: {e}")
            print(f"  {key:<20} FAILED: {e}", flush=True)
        except OSError as e:
            out.errors.append(f"{key}: {type(e).__name__}: {e}")
            print(f"  {key:<20} FAILED: {type(e).__name__}: {e}", flush=True)

    t.start()
    step(
        "write_single", p.single_bytes, lambda: write_file(single, data, SINGLE_ID, p.single_bytes)
    )
    step(
        "write_single_fsync",
        p.single_bytes,
        lambda: write_file(single_fsync, data, FSYNC_ID, p.single_bytes, fsync=True),
    )
    with contextlib.suppress(OSError):
        single_fsync.unlink()  # (b) is not read back; give its space back early
    step("write_ckpt", p.ckpt_bytes, write_ckpt)

    if can_drop:
        t0 = time.perf_counter()
        t.make_cold()
        out.extra["make_cold_s_1"] = time.perf_counter() - t0
        step(
            "read_single_cold",
            p.single_bytes,
            lambda: read_file(single, single_samples, p.single_bytes),
        )
    else:
        out.skipped["read_single_cold"] = "not root: cannot drop caches"
    step(
        "read_single_warm",
        p.single_bytes,
        lambda: read_file(single, single_samples, p.single_bytes),
        pause=False,
    )
    if can_drop:
        t0 = time.perf_counter()
        t.make_cold()
        out.extra["make_cold_s_2"] = time.perf_counter() - t0
        step("read_ckpt_cold", p.ckpt_bytes, read_ckpt)
    else:
        out.skipped["read_ckpt_cold"] = "not root: cannot drop caches"
    step("read_ckpt_warm", p.ckpt_bytes, read_ckpt, pause=False)
    t.stop()


# --------------------------------------------------------------------------------------
# report


def ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}"


def mbps_all(rs: list[TargetResult] | None, key: str) -> list[float]:
    return [r.results[key]["mb_per_s"] for r in rs or [] if key in r.results]


def mbps(rs: list[TargetResult] | None, key: str) -> float | None:
    """The median over passes (None if no pass measured it)."""
    vals = mbps_all(rs, key)
    return statistics.median(vals) if vals else None


def print_table(
    tests: list[Test], res: dict[str, list[TargetResult]], passes: int
) -> list[dict[str, Any]]:
    rows = []
    w = max(len(t.label) for t in tests)
    head = (
        f"{'test':<{w}}  {'plain':>9}  {'ckptfs':>9}  {'nullfs':>9}  "
        f"{'ckptfs/plain':>12}  {'ckptfs/null':>11}"
    )
    print(head)
    print("-" * len(head))
    for t in tests:
        vals = {name: mbps(res.get(name), t.key) for name in TARGETS}

        def cell(v: float | None, name: str, key: str = t.key) -> str:
            if v is not None:
                return f"{v:9.1f}"
            rs = res.get(name)
            if not rs:
                return f"{'-':>9}"
            if any(key in r.skipped for r in rs):
                return f"{'skipped':>9}"
            return f"{'FAILED':>9}"

        print(
            f"{t.label:<{w}}  {cell(vals['plain'], 'plain')}  {cell(vals['ckptfs'], 'ckptfs')}  "
            f"{cell(vals['nullfs'], 'nullfs')}  {ratio(vals['ckptfs'], vals['plain']):>12}  "
            f"{ratio(vals['ckptfs'], vals['nullfs']):>11}"
        )
        rows.append(
            {
                "test": t.key,
                "label": t.label,
                **{f"{n}_mb_per_s": vals[n] for n in TARGETS},
                **{f"{n}_all_mb_per_s": mbps_all(res.get(n), t.key) for n in TARGETS},
                "ckptfs_over_plain": None
                if not (vals["ckptfs"] and vals["plain"])
                else vals["ckptfs"] / vals["plain"],
                "ckptfs_over_null": None
                if not (vals["ckptfs"] and vals["nullfs"])
                else vals["ckptfs"] / vals["nullfs"],
            }
        )
    what = f"median of {passes} passes" if passes > 1 else "one pass"
    print(
        f"MB/s = 10^6 bytes per second ({what}), wall clock of the whole operation "
        "(open to close, fsync included where named)."
    )
    if passes > 1:
        print(f"range over the {passes} passes (min-max MB/s):")
        for t in tests:
            cells = []
            for name in TARGETS:
                v = mbps_all(res.get(name), t.key)
                cells.append(f"{name} {min(v):.0f}-{max(v):.0f}" if v else f"{name} -")
            print(f"  {t.label:<{w}}  " + "   ".join(cells))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--size-gib",
        type=float,
        default=None,
        help="size of the single file (a, b) and of the checkpoint (c); default 2",
    )
    ap.add_argument(
        "--dir",
        type=Path,
        default=None,
        help="base dir; a fresh temp dir is made inside it and removed at the end "
        "(default: on the disk of /work)",
    )
    ap.add_argument(
        "--json", type=Path, default=None, metavar="OUT", help="write machine-readable results here"
    )
    ap.add_argument("--quick", action="store_true", help="small smoke run (256 MiB sizes)")
    ap.add_argument(
        "--only",
        default=",".join(TARGETS),
        help="comma-separated subset of targets (default: plain,ckptfs,nullfs)",
    )
    ap.add_argument("--ckpt-files", type=int, default=16)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument(
        "--settle",
        type=float,
        default=None,
        help="seconds to wait (after a sync) before each timed step (default 5, 0 with --quick)",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="passes over all targets, interleaved; the table shows the median "
        "(default 3, or 1 with --quick)",
    )
    ap.add_argument("--chunk-size", default=None, help="passed to ckptfs mount --chunk-size")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (for debugging)")
    ap.add_argument(
        "--remote", action="store_true",
        help="run the remote-tier benchmark instead (scripts/bench_remote.py: stall with and "
        "without a remote tier, time to durable vs a boto3 upload, on a local SeaweedFS)",
    )
    args, rest = ap.parse_known_args(argv)
    if args.remote:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import bench_remote

        return bench_remote.main(rest)
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")

    size_gib = args.size_gib if args.size_gib is not None else (0.25 if args.quick else 2.0)
    single_bytes = int(size_gib * GiB) // BLOCK * BLOCK
    ckpt_file_bytes = single_bytes // args.ckpt_files // BLOCK * BLOCK
    if single_bytes <= 0 or ckpt_file_bytes <= 0:
        ap.error("--size-gib too small")
    p = Params(single_bytes, args.ckpt_files, ckpt_file_bytes, args.threads)
    targets = [t.strip() for t in args.only.split(",") if t.strip()]
    for t in targets:
        if t not in TARGETS:
            ap.error(f"--only: unknown target {t!r} (known: {', '.join(TARGETS)})")

    parent = args.dir
    if parent is None:
        parent = Path("/work") if os.path.isdir("/work") else Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    # Peak use: one target at a time holds (a) + (b) + (c); ckptfs adds its catalog.
    need = int((2 * p.single_bytes + p.ckpt_bytes) * 1.1)
    st = os.statvfs(parent)
    if st.f_bavail * st.f_frsize < need + GiB:
        print(
            f"bench: {parent} has {st.f_bavail * st.f_frsize / GiB:.1f} GiB free, "
            f"need {need / GiB:.1f} GiB + 1 GiB",
            file=sys.stderr,
        )
        return 2
    base = Path(tempfile.mkdtemp(prefix="ckptfs-bench.", dir=parent))

    # SIGTERM/SIGHUP become KeyboardInterrupt so every finally block runs.
    def _interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)

    is_root = os.geteuid() == 0
    results: dict[str, list[TargetResult]] = {}
    passes = args.repeat if args.repeat is not None else (1 if args.quick else 3)
    if passes < 1:
        ap.error("--repeat must be at least 1")
    settle = args.settle if args.settle is not None else (0.0 if args.quick else 5.0)
    tests = tests_for(p)
    try:
        info = machine_info(base)
        print("== machine")
        print(f"  CPU        {info['cpu']} ({info['cores']} cores)")
        print(f"  RAM        {info['ram_gib']} GiB")
        print(f"  base dir   {base}")
        print(
            f"  disk       {info['disk']} ({info['disk_kind']}), {info['filesystem']} on "
            f"{info['mounted_on']}, {info['disk_size_gib']} GiB, {info['disk_free_gib']} GiB free"
        )
        print(f"  kernel     {info['kernel']}")
        print(f"  python     {info['python']}; pyfuse3 {info['pyfuse3']}; {info['fusermount3']}")
        print(f"  ckptfs     {info['ckptfs']}")
        if info["damon_active"]:
            print(
                "  note       DAMON proactive reclaim is on: page cache idle for about a minute is"
                " paged out, so warm reads run right after the cold ones, with no pause"
            )
        if info["free_page_reporting"]:
            print(
                "  note       free page reporting is on (a VM handing free memory back to its"
                " host): a page-cache page that is new, or was freed more than ~2 s ago, costs a"
                " host fault on first touch. Buffered writes pay it; every target pays it alike"
                " thanks to the pause before each step."
            )
        print("== setup")
        print(
            f"  (a),(b) one file of {fmt_size(p.single_bytes)}, 1 MiB writes; "
            f"(c) {p.ckpt_files} files x {fmt_size(p.ckpt_file_bytes)} by {p.threads} threads"
        )
        print(
            "  data: random (os.urandom 64 MiB pattern), unique 16-byte prefix per MiB block: "
            "no two chunks are identical, nothing compresses"
        )
        print(
            f"  ckptfs: two --local tiers, {base}/ckptfs/tier0 and tier1 -- both on "
            f"{info['disk']}, THE SAME DISK as the plain directory: striping cannot add "
            "bandwidth here; this measures ckptfs's overhead"
        )
        print(
            f"  before each write and cold read: sync, then {settle:g} s pause"
            + (" (no pause: numbers depend on what the previous step left)" if not settle else "")
        )
        if not is_root:
            print("  not root: cold reads skipped (drop_caches needs root)")
        else:
            print(
                "  cold = sync + echo 3 > /proc/sys/vm/drop_caches; ckptfs also unmounted "
                "and mounted again before each cold read"
            )
        data = Data()
        extra_ckptfs = ["--chunk-size", args.chunk_size] if args.chunk_size else []
        stuck: set[str] = set()
        for npass in range(1, passes + 1):
            for name in TARGETS:
                if name not in targets or name in stuck:
                    continue
                root = base / name
                tgt: Target
                if name == "plain":
                    tgt = PlainTarget(root)
                elif name == "ckptfs":
                    tgt = CkptfsTarget(root, extra_ckptfs)
                else:
                    tgt = NullfsTarget(root)
                load = os.getloadavg()[0]
                print(
                    f"== pass {npass}/{passes}: {name}: {tgt.describe()}"
                    f"  [1-min load {load:.2f}, this benchmark included]",
                    flush=True,
                )
                out = TargetResult()
                out.extra["loadavg_1min_at_start"] = load
                results.setdefault(name, []).append(out)
                try:
                    run_target(tgt, data, p, is_root, out, settle)
                except (BenchError, OSError, subprocess.SubprocessError) as e:
                    out.errors.append(f"{type(e).__name__}: {e}")
                    print(f"  FAILED: {type(e).__name__}: {e}", flush=True)
                finally:
                    if isinstance(tgt, CkptfsTarget):
                        out.extra.update({k: v for k, v in tgt.events.items()})
                        if out.errors:
                            out.extra["log_tail"] = tgt.log_tail(50)
                    tgt.cleanup()
                    if root.exists():  # cleanup refused: something is still mounted
                        stuck.add(name)
                if isinstance(tgt, CkptfsTarget) and tgt.events:
                    ev = tgt.events
                    print(
                        "  mount times (s): "
                        + ", ".join(f"{x:.2f}" for x in ev.get("mount_s", []))
                        + "; umount times (s): "
                        + ", ".join(f"{x:.2f}" for x in ev.get("umount_s", []))
                    )
        print("== results")
        rows = print_table(tests, results, passes)
        failed = {n: [e for r in rs for e in r.errors] for n, rs in results.items()}
        failed = {n: errs for n, errs in failed.items() if errs}
        for n, errs in failed.items():
            for msg in errs:
                print(f"  {n}: {msg}")
        if args.json:
            doc = {
                "machine": info,
                "params": {
                    "single_bytes": p.single_bytes,
                    "ckpt_files": p.ckpt_files,
                    "ckpt_file_bytes": p.ckpt_file_bytes,
                    "threads": p.threads,
                    "block": BLOCK,
                    "quick": args.quick,
                    "chunk_size": args.chunk_size,
                    "settle_s": settle,
                    "ckptfs_tiers": "2 x --local on the same disk as plain",
                },
                "rows": rows,
                "passes": passes,
                "targets": {
                    n: [
                        {
                            "results": r.results,
                            "errors": r.errors,
                            "skipped": r.skipped,
                            "extra": r.extra,
                        }
                        for r in rs
                    ]
                    for n, rs in results.items()
                },
                "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(doc, indent=2) + "\n")
            print(f"  results written to {args.json}")
        return 1 if failed else 0
    finally:
        if args.keep:
            print(f"  kept {base}")
        else:
            leftover = [
                n for n in TARGETS if (base / n / "mnt").exists() and is_mounted(base / n / "mnt")
            ]
            if leftover:
                print(
                    f"  ! still mounted under {base}: {leftover}; not removing it", file=sys.stderr
                )
            else:
                shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as exc:
        print(
            f"bench: interrupted ({exc or 'SIGINT'})",
            file=sys.stderr,
        )
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(1)
