#!/usr/bin/env python3
"""Throughput of ckptfs next to a plain directory and a null FUSE filesystem, in one run.

The same work runs on three targets, one after the other:

* ``plain``  - a directory on the base dir's disk (the kernel's own filesystem);
* ``ckptfs`` - a ckptfs mount with two ``--local`` tiers, both directories under the base dir,
  so on the SAME disk: striping cannot add bandwidth here, this measures overhead;
* ``nullfs`` - ``scripts/nullfs.py``, a pyfuse3 + trio filesystem that discards writes and reads
  zeros (it keeps an in-memory namespace, so the metadata tests run on it too): the ceiling
  of any Python FUSE daemon on this machine.

Like a framework's save (torch.save, DCP, HF Trainer), the data is in memory before any clock
starts: one preallocated buffer per file (scripts/benchio.py: random, a unique 16-byte stamp
per 1 MiB block, so nothing compresses or deduplicates), written with ``os.write`` of 1 MiB
memoryview slices. Reads ``readinto`` a preallocated, pre-faulted buffer of the file's size,
1 MiB at a time (as torch.load fills a tensor), and every byte is compared with the source
after the clock stops.

Tests:
  (a)   one file, write + close (no fsync: torch.save and HF Trainer do not fsync);
  (b)   one file, write + fsync + close;
  (c)   a checkpoint of 16 files written by 4 threads into ``tmp-checkpoint-N/``, each file
        fsynced, then the directory renamed to ``checkpoint-N/`` and its parent fsynced
        (as DCP / HF do);
  (c')  the same without any fsync;
  (c'') the same as (c) by 4 processes (forked after the data was built; each first stores
        into every page of its buffers, so they are its own as a rank's tensors are, not
        shared copy-on-write with the parent (--shared-pages: as before 2026-12-04); the clock
        runs from when all of them are waiting until the last one's files are written, not
        until the processes have exited);
  (d)   reads of (a) and (c): cold (sync + drop_caches; ckptfs is also unmounted and mounted
        again so its own caches are cold) and warm (read again at once); (c) with 4 threads;
  (t)   a real framework: torch.save of a state dict of 4 fp32 tensors (as much as the
        single file, built in memory before the clock), without and with fsync; torch.load
        of it, cold (as (d)), into new tensors, and torch.load(mmap=True) with every tensor
        then copied out (the pages arrive by faults through the page cache); each loaded
        tensor is compared with the saved one after the clock;
  (m)   metadata, 2000 files of 4 KiB in ONE directory: create + write 4 KiB + close, stat,
        rename (within the directory), unlink, each timed on its own, in operations per
        second; by 1 process, and by 4 processes sharing that directory (each its own 500
        names).

Next to every rate: the CPU seconds the serving daemon (ckptfs: the pid in STATE_DIR/
daemon.pid; nullfs: its process) used during the step, per GB (metadata: CPU ms per 1000
operations), from utime + stime in /proc/PID/stat; "+x" is what it used after the step
returned, until the next step began (background work the step left behind). Beside it, the
same for the daemon's busiest thread alone (/proc/PID/task/*/stat; pyfuse3's trio thread, as
a rule) and the ceiling it implies, 1 / (its CPU s per GB) in GB/s (metadata: op/s): that
thread runs on one core, so the daemon cannot go faster whatever the core count. The table
of rates is followed by one of the daemons' CPU.

Each pass runs the targets in turn, the order rotating from pass to pass (so no target is
always first), by default 3 passes (1 with --quick). The table shows the median of the
passes and the ckptfs range.

    python scripts/bench.py [--quick] [--size-gib N] [--dir BASE] [--json OUT] [--repeat N]
                            [--mount-arg=--some-flag ...] [--skip m,c2,...]
    python scripts/bench.py --metadata [--meta-files N] [--repeat N]   # only (m)
    python scripts/bench.py --remote [...]   # the remote tier (scripts/bench_remote.py)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchio import (  # noqa: E402
    BLOCK,
    BenchError,
    MiB,
    Pattern,
    Source,
    ThreadStep,
    busiest_thread,
    cpu_seconds,
    drop_caches,
    fsync_dir,
    own_pages,
    prefault,
    read_calls,
    read_into,
    run_forked,
    same_bytes,
    thread_cpu_seconds,
    write_from,
)

GiB = 1024 * MiB
META_SIZE = 4096

REPO = Path(__file__).resolve().parent.parent
NULLFS = REPO / "scripts" / "nullfs.py"
TARGETS = ("plain", "ckptfs", "nullfs", "base")
CPU_TARGETS = ("ckptfs", "nullfs", "base")  # the targets served by a daemon of their own
# "base": ckptfs run from another checkout (--base-code DIR), e.g. the code before a change,
# side by side with this one in the same run.
GROUPS = ("a", "b", "c", "c1", "c2", "d", "t", "m")  # c1 = (c'), c2 = (c'')
TORCH_TENSORS = 4  # (t): the state dict's fp32 tensors




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

    def daemon_pid(self) -> int | None:
        """The process serving this target (its CPU is measured per step), if any."""
        return None


class PlainTarget(Target):
    name = "plain"


class CkptfsTarget(Target):
    name = "ckptfs"

    def __init__(
        self, root: Path, extra: list[str], code: Path | None = None, encrypt: bool = False
    ) -> None:
        """``code``: run the ckptfs of that checkout instead of this one's (target "base").
        ``encrypt``: the test files go into an encrypted namespace, /enc (docs/governance.md)."""
        super().__init__(root)
        self.code = code
        if code is not None:
            self.name = "base"
        self.mnt = root / "mnt"
        self.state = root / "state"
        self.tiers = [root / "tier0", root / "tier1"]
        self.encrypt = encrypt
        self.dir = self.mnt / "enc" if encrypt else self.mnt
        self.extra = extra
        self.pid: int | None = None
        self.started: list[int] = []

    def _cli(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        env = None if self.code is None else {**os.environ, "PYTHONPATH": str(self.code)}
        return subprocess.run(
            [sys.executable, "-m", "ckptfs", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO if self.code is None else self.code,
            env=env,
        )

    def log_tail(self, n: int = 30) -> str:
        lines = _read(str(self.state / "ckptfs.log")).splitlines()
        return "\n".join(lines[-n:])

    def mount(self) -> None:
        self.mnt.mkdir(parents=True, exist_ok=True)
        for t in self.tiers:
            t.mkdir(parents=True, exist_ok=True)
        # Both tiers are directories on one disk here: say so (ckptfs refuses tiers sharing
        # a device otherwise).
        args = ["mount", str(self.mnt), "--state-dir", str(self.state), "--allow-shared-device"]
        for t in self.tiers:
            args += ["--local", str(t)]
        args.append("--allow-shared-device")  # both tiers on one disk, on purpose (see above)
        if self.encrypt:
            args += ["--config", str(self._encrypted_config())]
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
        self.dir.mkdir(exist_ok=True)
        self.events.setdefault("mount_s", []).append(time.perf_counter() - t0)

    def _encrypted_config(self) -> Path:
        """A KEK file (0600, outside the state dir) and a config whose /enc is encrypted."""
        kek, cfg = self.root / "kek", self.root / "encrypt.toml"
        if not kek.exists():
            fd = os.open(kek, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(32))
        cfg.write_text(f'[keys]\nkek_file = "{kek}"\n[[namespace]]\npath = "/enc"\n'
                       f"uids = [{os.getuid()}]\nencrypt = true\n")
        return cfg

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

    def daemon_pid(self) -> int | None:
        return self.pid

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

    def daemon_pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

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
    procs: int
    meta_files: int
    shared_pages: bool = False  # (c'') children write pages shared copy-on-write (--shared-pages)

    @property
    def ckpt_bytes(self) -> int:
        return self.ckpt_files * self.ckpt_file_bytes


@dataclass
class Test:
    key: str
    label: str
    group: str
    unit: str  # "bytes" (MB/s, CPU s/GB) or "ops" (op/s, CPU ms per 1000 ops)


def fmt_size(n: int) -> str:
    if n % GiB == 0:
        return f"{n // GiB} GiB"
    if n % MiB == 0:
        return f"{n // MiB} MiB"
    return f"{n} B"


META_OPS = ("create", "stat", "rename", "unlink")


def tests_for(p: Params) -> list[Test]:
    one = fmt_size(p.single_bytes)
    ck = f"ckpt {p.ckpt_files}x{fmt_size(p.ckpt_file_bytes)}"
    thr, prc = p.threads, p.procs
    tests = [
        Test("write_single", f"(a) write {one} file, close", "a", "bytes"),
        Test("write_single_fsync", f"(b) write {one} file, fsync, close", "b", "bytes"),
        Test("write_ckpt_fsync", f"(c) save {ck}, {thr} threads, fsync, rename", "c", "bytes"),
        Test("write_ckpt", f"(c') save {ck}, {thr} threads, no fsync, rename", "c1", "bytes"),
        Test("write_ckpt_procs", f"(c'') save {ck}, {prc} procs, fsync, rename", "c2", "bytes"),
        Test("read_single_cold", f"(d) read {one} file, cold", "d", "bytes"),
        Test("read_single_warm", f"(d) read {one} file, warm", "d", "bytes"),
        Test("read_ckpt_cold", f"(d) read ckpt, {thr} threads, cold", "d", "bytes"),
        Test("read_ckpt_warm", f"(d) read ckpt, {thr} threads, warm", "d", "bytes"),
        Test("torch_save", f"(t) torch.save {one} state dict", "t", "bytes"),
        Test("torch_save_fsync", f"(t) torch.save {one} state dict, fsync", "t", "bytes"),
        Test("torch_load_cold", f"(t) torch.load {one}, cold", "t", "bytes"),
        Test("torch_load_mmap_cold", f"(t) torch.load mmap {one}, copied, cold", "t", "bytes"),
    ]
    for n in (1, p.procs):
        who = "1 proc" if n == 1 else f"{n} procs"
        for op in META_OPS:
            what = "create+write 4K+close" if op == "create" else op
            tests.append(
                Test(f"meta_{op}_{n}p", f"(m) {p.meta_files} files: {what}, {who}", "m", "ops")
            )
    return tests


SINGLE_ID = 1
FSYNC_ID = 2
CKPT_ID = {"c": 100, "c1": 200, "c2": 300}  # file ids (stamps) of the three saves


@dataclass
class TargetResult:
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Buffers:
    """Everything the timed steps touch, built once before the first clock starts."""

    single: Source
    ckpt: list[Source]
    single_in: memoryview  # read targets, pre-faulted
    ckpt_in: list[memoryview]
    meta: bytes  # meta_files x 4 KiB, each file's own random bytes
    state: dict[str, torch.Tensor]  # (t): the state dict torch.save writes (empty without t)

    @classmethod
    def build(cls, p: Params, with_torch: bool) -> Buffers:
        pattern = Pattern()
        single = Source(pattern, SINGLE_ID, p.single_bytes)
        ckpt = [Source(pattern, CKPT_ID["c"] + i, p.ckpt_file_bytes) for i in range(p.ckpt_files)]
        single_in = bytearray(p.single_bytes)
        prefault(single_in)
        ckpt_in = []
        for _ in range(p.ckpt_files):
            b = bytearray(p.ckpt_file_bytes)
            prefault(b)
            ckpt_in.append(memoryview(b))
        meta = os.urandom(p.meta_files * META_SIZE)
        state: dict[str, torch.Tensor] = {}
        if with_torch:
            # Own copies of the single file's bytes (random, stamped per MiB), as fp32.
            single.stamp(SINGLE_ID)
            part = p.single_bytes // TORCH_TENSORS // 4 * 4
            for k in range(TORCH_TENSORS):
                raw = single.view[k * part : (k + 1) * part]
                state[f"layer{k}.weight"] = torch.frombuffer(raw, dtype=torch.float32).clone()
        return cls(single, ckpt, memoryview(single_in), ckpt_in, meta, state)

    @property
    def state_bytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.state.values())

    def stamp_ckpt(self, group: str) -> None:
        for i, s in enumerate(self.ckpt):
            s.stamp(CKPT_ID[group] + i)


def save_ckpt(
    parent: Path, step_no: int, b: Buffers, p: Params, fsync: bool, procs: bool
) -> float:
    """(c), (c'), (c''): write the files into tmp-checkpoint-N/ (fsync each if asked), then
    rename the directory to checkpoint-N/ (and fsync the parent if asked). The time from the
    mkdir to the end; with processes, from the moment they are all forked and waiting."""
    tmp = parent / f"tmp-checkpoint-{step_no}"
    final = parent / f"checkpoint-{step_no}"
    names = [f"shard-{i:05d}-of-{p.ckpt_files:05d}.bin" for i in range(p.ckpt_files)]

    def one(i: int) -> None:
        write_from(tmp / names[i], b.ckpt[i].view, fsync=fsync)

    def worker(k: int, n: int) -> None:
        for i in range(k, p.ckpt_files, n):
            one(i)

    def own(k: int, n: int) -> None:
        for i in range(k, p.ckpt_files, n):
            own_pages(b.ckpt[i].view)

    if procs:
        tmp.mkdir()  # before the fork: the children write into it
        t_write = run_forked(
            [functools.partial(worker, k, p.procs) for k in range(p.procs)],
            prepare=None if p.shared_pages
            else [functools.partial(own, k, p.procs) for k in range(p.procs)],
        )
        t0 = time.perf_counter()
    else:
        t0 = time.perf_counter()
        tmp.mkdir()
        t_write = 0.0
        with ThreadPoolExecutor(p.threads) as ex:
            list(ex.map(one, range(p.ckpt_files)))
    os.rename(tmp, final)
    if fsync:
        fsync_dir(parent)
    return t_write + time.perf_counter() - t0


def torch_save(path: Path, state: dict[str, torch.Tensor], fsync: bool) -> None:
    """(t): as most callers do, ``torch.save(state, path)`` (its own zip writer opens the
    file); with ``fsync``, as torch.distributed.checkpoint's FileSystemWriter does, into a
    stream it then fsyncs before closing."""
    if not fsync:
        torch.save(state, str(path))
        return
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def torch_load(path: Path, mmap: bool) -> dict[str, torch.Tensor]:
    """(t): the state dict in this process's memory: read by torch.load into new tensors,
    or mapped (mmap=True) and every tensor copied out, as a load onto a device does."""
    try:
        got = torch.load(str(path), weights_only=True, mmap=mmap)
    except (RuntimeError, ValueError, EOFError) as e:  # what torch raises for bad bytes
        raise BenchError(f"torch.load of {path}: {e}") from e
    return {k: v.clone() for k, v in got.items()} if mmap else dict(got)


def same_state(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], where: Path) -> None:
    if got.keys() != want.keys():
        raise BenchError(f"{where}: tensors {sorted(got)} != {sorted(want)}")
    for k, v in want.items():  # bit for bit: random fp32 bytes hold NaNs (NaN != NaN)
        if not torch.equal(got[k].view(torch.int32), v.view(torch.int32)):
            raise BenchError(f"WRONG DATA in {where}: tensor {k}")


def ckpt_paths(parent: Path, step_no: int, p: Params) -> list[Path]:
    d = parent / f"checkpoint-{step_no}"
    return [d / f"shard-{i:05d}-of-{p.ckpt_files:05d}.bin" for i in range(p.ckpt_files)]


def meta_names(p: Params, nprocs: int) -> list[list[str]]:
    """Each process's own names (all in one directory): process k has p.meta_files/n."""
    per = p.meta_files // nprocs
    return [[f"p{k}-{i:05d}.bin" for i in range(per)] for k in range(nprocs)]


def meta_op(op: str, d: Path, names: list[str], first: int, data: bytes) -> None:
    """One process's share of one metadata test; ``first`` is its first file's index
    into ``data`` (4 KiB per file)."""
    if op == "create":
        for j, name in enumerate(names):
            fd = os.open(d / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                off = (first + j) * META_SIZE
                if os.write(fd, data[off : off + META_SIZE]) != META_SIZE:
                    raise BenchError(f"short write of {d / name}")
            finally:
                os.close(fd)
    elif op == "stat":
        for name in names:
            if os.stat(d / name).st_size != META_SIZE:
                raise BenchError(f"{d / name}: size is not {META_SIZE}")
    elif op == "rename":
        for name in names:
            os.rename(d / name, d / ("r-" + name))
    elif op == "unlink":
        for name in names:
            os.unlink(d / ("r-" + name))
    else:
        raise ValueError(op)


def run_target(
    t: Target, b: Buffers, p: Params, groups: set[str], can_drop: bool, out: TargetResult,
    settle: float,
) -> None:
    single = t.dir / "single.bin"
    single_fsync = t.dir / "single-fsync.bin"
    # CPU of the serving daemon after the previous step: (key, pid, CPU s at its end).
    trailing: list[tuple[str, int, float]] = []

    def flush_trailing() -> None:
        """Book what the daemon used since the last step ended (before a remount ends it)."""
        while trailing:
            key, pid, c_end = trailing.pop()
            now = cpu_seconds(pid) if t.daemon_pid() == pid else None
            if now is not None and key in out.results:
                out.results[key]["cpu_after_s"] = now - c_end

    def record(
        key: str, unit: str, amount: int, secs: float, cpu: float | None,
        calls: int | None = None, busy: ThreadStep | None = None,
    ) -> None:
        r: dict[str, Any] = {"unit": unit, "amount": amount, "seconds": secs, "cpu_s": cpu,
                             "busiest_cpu_s": None if busy is None else busy.busiest_s,
                             "busiest_thread": None if busy is None else busy.busiest_name}
        # The busiest thread (pyfuse3's trio thread, as a rule) runs on one core: its CPU
        # per unit sets the daemon's ceiling however many cores there are.
        busiest = ""
        if busy is not None:
            b = busy.busiest_s * per_unit_scale(unit, amount)
            busiest = (f", busiest thread {busy.busiest_name!r} "
                       + (f"{b:.2f} s/GB" if unit == "bytes" else f"{b:.1f} ms/1000 ops")
                       + f" (ceiling {ceiling(b, unit, amount)})")
        if unit == "bytes":
            r["mb_per_s"] = amount / secs / 1e6
            rate = f"{r['mb_per_s']:10.1f} MB/s"
            per = f"; daemon {cpu / (amount / 1e9):.2f} CPU s/GB" if cpu is not None else ""
            per += busiest
            if calls is not None:
                # read(2) calls of the daemon per MiB: about its FUSE requests per MiB
                r["reads_per_mib"] = calls / (amount / MiB)
                per += f", {r['reads_per_mib']:.2f} reads/MiB"
        else:
            r["ops_per_s"] = amount / secs
            rate = f"{r['ops_per_s']:10.0f} op/s"
            per = f"; daemon {cpu * 1e6 / amount:.1f} CPU ms/1000 ops" if cpu is not None else ""
            per += busiest
        out.results[key] = r
        print(f"  {key:<20} {rate}  ({secs:.2f} s{per})", flush=True)

    def step(
        key: str,
        amount: int,
        fn: Callable[[], float | None],
        check: Callable[[], None] | None = None,
        pause: bool = True,
        unit: str = "bytes",
    ) -> None:
        """Time fn (or take the time it returns), with the daemon's CPU; then check."""
        if settle and pause:
            # Every write and cold read starts from the same state: no dirty data of the
            # previous step being written back, and memory freed by it already handed back to
            # the host. Warm reads follow at once: this kernel pages out idle page cache
            # (DAMON), so waiting would cool them.
            os.sync()
            time.sleep(settle)
        flush_trailing()
        pid = t.daemon_pid()
        c0 = cpu_seconds(pid)
        th0 = thread_cpu_seconds(pid)
        r0 = read_calls(pid)
        try:
            t0 = time.perf_counter()
            got = fn()
            secs = got if got is not None else time.perf_counter() - t0
            same = t.daemon_pid() == pid
            c1 = cpu_seconds(pid) if same else None
            th1 = thread_cpu_seconds(pid) if same else None
            r1 = read_calls(pid) if same else None
            if check is not None:
                check()
        except (BenchError, OSError) as e:
            msg = f"{type(e).__name__}: {e}" if isinstance(e, OSError) else str(e)
            out.errors.append(f"{key}: {msg}")
            print(f"  {key:<20} FAILED: {msg}", flush=True)
            return
        cpu = c1 - c0 if c0 is not None and c1 is not None else None
        calls = r1 - r0 if r0 is not None and r1 is not None else None
        record(key, unit, amount, secs, cpu, calls, busiest_thread(th0, th1))
        # "After" starts when the check is done: its reads are the benchmark's, not the step's.
        c2 = cpu_seconds(pid) if t.daemon_pid() == pid else None
        if pid is not None and c2 is not None:
            trailing.append((key, pid, c2))

    def make_cold(n: int) -> None:
        flush_trailing()
        t0 = time.perf_counter()
        t.make_cold()
        out.extra[f"make_cold_s_{n}"] = time.perf_counter() - t0

    def check_single() -> None:
        if t.verify:
            b.single.stamp(SINGLE_ID)
            same_bytes(str(single), b.single_in, b.single.view)

    def read_ckpt() -> None:
        paths = ckpt_paths(t.dir, CKPT_ID["c"], p)
        with ThreadPoolExecutor(p.threads) as ex:
            list(ex.map(lambda i: read_into(paths[i], b.ckpt_in[i]), range(p.ckpt_files)))

    def check_ckpt() -> None:
        if t.verify:
            b.stamp_ckpt("c")
            for i, path in enumerate(ckpt_paths(t.dir, CKPT_ID["c"], p)):
                same_bytes(str(path), b.ckpt_in[i], b.ckpt[i].view)

    def own(view: memoryview) -> None:
        """Untimed: a buffer that an earlier fork shared ((c''), (m)) is this process's own
        again, so a direct-I/O write from it takes no fault per page (benchio.own_pages)."""
        if not p.shared_pages:
            own_pages(view)

    def saved(group: str, fsync: bool, procs: bool) -> Callable[[], float]:
        def run() -> float:
            b.stamp_ckpt(group)
            if not procs:  # the processes own their pages themselves (save_ckpt)
                for s in b.ckpt:
                    own(s.view)
            return save_ckpt(t.dir, CKPT_ID[group], b, p, fsync=fsync, procs=procs)

        return run

    def drop_ckpt(group: str) -> None:
        """(c') and (c'') are not read back: give their space back early."""
        shutil.rmtree(t.dir / f"checkpoint-{CKPT_ID[group]}", ignore_errors=True)

    t.start()
    b.single.stamp(SINGLE_ID)
    own(b.single.view)
    if "a" in groups:
        step("write_single", p.single_bytes, lambda: write_from(single, b.single.view))
    if "b" in groups:
        b.single.stamp(FSYNC_ID)
        step(
            "write_single_fsync",
            p.single_bytes,
            lambda: write_from(single_fsync, b.single.view, fsync=True),
        )
        with contextlib.suppress(OSError):
            single_fsync.unlink()  # (b) is not read back
    if "c" in groups:
        step("write_ckpt_fsync", p.ckpt_bytes, saved("c", fsync=True, procs=False))
    if "c1" in groups:
        step("write_ckpt", p.ckpt_bytes, saved("c1", fsync=False, procs=False))
        drop_ckpt("c1")
    if "c2" in groups:
        step("write_ckpt_procs", p.ckpt_bytes, saved("c2", fsync=True, procs=True))
        drop_ckpt("c2")

    if "d" in groups:
        # The reads need (a) and (c); written untimed here if those tests were skipped.
        if "a" not in groups:
            b.single.stamp(SINGLE_ID)
            write_from(single, b.single.view)
        if "c" not in groups:
            saved("c", fsync=True, procs=False)()
        for what in ("single", "ckpt"):
            size = p.single_bytes if what == "single" else p.ckpt_bytes
            if what == "single":
                fn: Callable[[], None] = lambda: read_into(single, b.single_in)  # noqa: E731
                check = check_single
            else:
                fn, check = read_ckpt, check_ckpt
            if can_drop:
                make_cold(1 if what == "single" else 2)
                step(f"read_{what}_cold", size, fn, check)
            else:
                out.skipped[f"read_{what}_cold"] = "not root: cannot drop caches"
            step(f"read_{what}_warm", size, fn, check, pause=False)

    if "t" in groups:
        model, model_fsync = t.dir / "model.pt", t.dir / "model-fsync.pt"
        step("torch_save", b.state_bytes, lambda: torch_save(model, b.state, fsync=False))
        step("torch_save_fsync", b.state_bytes,
             lambda: torch_save(model_fsync, b.state, fsync=True))
        with contextlib.suppress(OSError):
            model_fsync.unlink()  # only model.pt is read back
        loaded: dict[str, torch.Tensor] = {}

        def load(mmap: bool) -> Callable[[], None]:
            def run() -> None:
                loaded.update(torch_load(model, mmap))
            return run

        def check_state() -> None:
            try:
                same_state(loaded, b.state, model)
            finally:
                loaded.clear()  # the next load allocates its own tensors again

        for key, mmap in (("torch_load_cold", False), ("torch_load_mmap_cold", True)):
            if not t.verify:
                out.skipped[key] = "reads zeros: nothing torch.load can parse"
            elif can_drop:
                make_cold(3 if mmap else 4)
                step(key, b.state_bytes, load(mmap), check_state)
            else:
                out.skipped[key] = "not root: cannot drop caches"
        with contextlib.suppress(OSError):
            model.unlink()

    if "m" in groups:
        for n in (1, p.procs):
            d = t.dir / f"meta-{n}p"
            d.mkdir()
            shares = meta_names(p, n)
            total = sum(len(s) for s in shares)
            for op in META_OPS:

                def go(op: str = op, d: Path = d, shares: list[list[str]] = shares) -> float | None:
                    if len(shares) == 1:
                        meta_op(op, d, shares[0], 0, b.meta)
                        return None
                    starts = [sum(len(s) for s in shares[:k]) for k in range(len(shares))]
                    return run_forked(
                        [
                            functools.partial(meta_op, op, d, s, first, b.meta)
                            for s, first in zip(shares, starts, strict=True)
                        ]
                    )

                def check(op: str = op, d: Path = d, shares: list[list[str]] = shares) -> None:
                    if op == "stat" and t.verify:  # contents, after the clock
                        first = 0
                        for s in shares:
                            for j, name in enumerate(s):
                                off = (first + j) * META_SIZE
                                got = (d / name).read_bytes()
                                if got != b.meta[off : off + META_SIZE]:
                                    raise BenchError(f"WRONG DATA in {d / name}")
                            first += len(s)
                    if op == "unlink" and os.listdir(d):
                        raise BenchError(f"{d} is not empty after the unlinks")

                step(f"meta_{op}_{n}p", total, go, check, pause=op == "create", unit="ops")
            shutil.rmtree(d, ignore_errors=True)
    flush_trailing()
    t.stop()


# --------------------------------------------------------------------------------------
# report


def rate_key(unit: str) -> str:
    return "mb_per_s" if unit == "bytes" else "ops_per_s"


def rates_all(rs: list[TargetResult] | None, t: Test) -> list[float]:
    k = rate_key(t.unit)
    return [r.results[t.key][k] for r in rs or [] if t.key in r.results]


def rate(rs: list[TargetResult] | None, t: Test) -> float | None:
    """The median over passes (None if no pass measured it)."""
    vals = rates_all(rs, t)
    return statistics.median(vals) if vals else None


def cpu_per_unit(rs: list[TargetResult] | None, t: Test) -> tuple[float | None, float | None]:
    """Median daemon CPU per GB (s) or per 1000 ops (ms) during the step, and after it."""
    scale = (lambda r: 1e9 / r["amount"]) if t.unit == "bytes" else (lambda r: 1e6 / r["amount"])
    during, after = [], []
    for r in rs or []:
        res = r.results.get(t.key)
        if res is None or res.get("cpu_s") is None:
            continue
        during.append(res["cpu_s"] * scale(res))
        if res.get("cpu_after_s") is not None:
            after.append(res["cpu_after_s"] * scale(res))
    return (
        statistics.median(during) if during else None,
        statistics.median(after) if after else None,
    )


def per_unit_scale(unit: str, amount: int) -> float:
    """Seconds of CPU -> s per GB (bytes) or ms per 1000 operations (ops)."""
    return 1e9 / amount if unit == "bytes" else 1e6 / amount


def ceiling(per_unit: float | None, unit: str, amount: int) -> str:
    """The rate a thread that costs ``per_unit`` (s/GB, or ms per 1000 ops) allows at most,
    on a core of its own: 1 / per_unit, in GB/s (or op/s). Below one clock tick of CPU in
    the step (the resolution of /proc), only a bound: ">x"."""
    if per_unit is None:
        return "-"
    floor = per_unit_scale(unit, amount) / os.sysconf("SC_CLK_TCK")  # one tick, per unit
    top = 1.0 if unit == "bytes" else 1e6
    v, sign = (top / floor, ">") if per_unit < floor else (top / per_unit, "")
    return f"{sign}{v:.2f} GB/s" if unit == "bytes" else f"{sign}{v:.0f} op/s"


def busiest_per_unit(rs: list[TargetResult] | None, t: Test) -> tuple[float | None, str, int]:
    """Median CPU of the daemon's busiest thread per GB (s) or per 1000 ops (ms) during the
    step; the thread's name (names joined by "," if the passes differ); the step's amount."""
    vals, names, amount = [], [], 0
    for r in rs or []:
        res = r.results.get(t.key)
        if res is None or res.get("busiest_cpu_s") is None:
            continue
        amount = res["amount"]
        vals.append(res["busiest_cpu_s"] * per_unit_scale(t.unit, amount))
        names.append(res["busiest_thread"])
    return (statistics.median(vals) if vals else None,
            ",".join(sorted(set(names), key=names.index)), amount)


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def fmt_ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}"


def print_table(
    tests: list[Test], res: dict[str, list[TargetResult]], passes: int
) -> list[dict[str, Any]]:
    rows = []
    w = max(len(t.label) for t in tests)
    head = (
        f"{'test':<{w}}  {'unit':>4}  {'plain':>8}  {'ckptfs':>8}  {'nullfs':>8}  "
        f"{'ck/plain':>8}  {'ck/null':>7}  {'ckptfs range':>13}"
    )
    with_base = bool(res.get("base"))
    if with_base:
        head += f"  {'base':>8}  {'base/plain':>10}"
    print(head)
    print("-" * len(head))
    for t in tests:
        vals = {name: rate(res.get(name), t) for name in TARGETS}

        def cell(v: float | None, name: str, key: str = t.key) -> str:
            if v is not None:
                return f"{v:8.1f}" if v < 1e5 else f"{v:8.0f}"
            rs = res.get(name)
            if not rs:
                return f"{'-':>8}"
            if any(key in r.skipped for r in rs):
                return f"{'skipped':>8}"
            if all(key not in r.results for r in rs) and not any(r.errors for r in rs):
                return f"{'-':>8}"
            return f"{'FAILED':>8}"

        ck_all = rates_all(res.get("ckptfs"), t)
        rng = f"{min(ck_all):.0f}-{max(ck_all):.0f}" if ck_all else "-"
        r_plain, r_null = ratio(vals["ckptfs"], vals["plain"]), ratio(vals["ckptfs"], vals["nullfs"])
        unit = "MB/s" if t.unit == "bytes" else "op/s"
        print(
            f"{t.label:<{w}}  {unit:>4}  {cell(vals['plain'], 'plain')}  "
            f"{cell(vals['ckptfs'], 'ckptfs')}  {cell(vals['nullfs'], 'nullfs')}  "
            f"{'-' if r_plain is None else f'{r_plain:.2f}':>8}  "
            f"{'-' if r_null is None else f'{r_null:.2f}':>7}  {rng:>13}"
            + (f"  {cell(vals['base'], 'base')}  {fmt_ratio(ratio(vals['base'], vals['plain'])):>10}"
               if with_base else "")
        )
        ck_cpu, ck_cpu_after = cpu_per_unit(res.get("ckptfs"), t)
        null_cpu, _ = cpu_per_unit(res.get("nullfs"), t)
        busiest = {n: busiest_per_unit(res.get(n), t) for n in CPU_TARGETS}
        rows.append(
            {
                "test": t.key,
                "label": t.label,
                "unit": "MB/s" if t.unit == "bytes" else "ops/s",
                **{f"{n}": vals[n] for n in TARGETS},
                **{f"{n}_all": rates_all(res.get(n), t) for n in TARGETS},
                "ckptfs_over_plain": r_plain,
                "ckptfs_over_null": r_null,
                "cpu_unit": "s/GB" if t.unit == "bytes" else "ms/1000 ops",
                "ckptfs_cpu": ck_cpu,
                "ckptfs_cpu_after": ck_cpu_after,
                "nullfs_cpu": null_cpu,
                "base_over_plain": ratio(vals["base"], vals["plain"]),
                "base_cpu": cpu_per_unit(res.get("base"), t)[0],
                **{f"{n}_busiest_cpu": busiest[n][0] for n in CPU_TARGETS},
                **{f"{n}_busiest_thread": busiest[n][1] or None for n in CPU_TARGETS},
                **{f"{n}_ceiling": (None if (b := busiest[n][0]) is None or b == 0
                                    else (1.0 if t.unit == "bytes" else 1e6) / b)
                   for n in CPU_TARGETS},
                "ceiling_unit": "GB/s" if t.unit == "bytes" else "ops/s",
            }
        )
    what = f"median of {passes} passes" if passes > 1 else "one pass"
    print(
        f"MB/s = 10^6 bytes per second, op/s = operations per second ({what}); wall clock of "
        "the whole operation (open to close, fsync and rename included where named)."
    )
    print_cpu_table(tests, res, w, with_base)
    if passes > 1:
        print(f"range over the {passes} passes (min-max):")
        for t in tests:
            cells = []
            for name in TARGETS:
                v = rates_all(res.get(name), t)
                cells.append(f"{name} {min(v):.0f}-{max(v):.0f}" if v else f"{name} -")
            print(f"  {t.label:<{w}}  " + "   ".join(cells))
    return rows


def fmt_cpu(v: float, t: Test) -> str:
    return f"{v:.2f}" if t.unit == "bytes" else f"{v:.0f}"


def print_cpu_table(
    tests: list[Test], res: dict[str, list[TargetResult]], w: int, with_base: bool
) -> None:
    """The serving daemons' CPU per unit of work: all threads, the busiest thread, and the
    rate that thread allows at most (it runs on one core however many there are)."""
    names = [n for n in CPU_TARGETS if n != "base" or with_base]
    head = f"{'daemon CPU':<{w}}  {'unit':>6}" + "".join(
        f"  {n + ' CPU':>11}  {'busiest':>7}  {'ceiling':>11}" for n in names
    ) + "  busiest thread (" + " / ".join(names) + ")"
    print()
    print(head)
    print("-" * len(head))
    for t in tests:
        cells, threads = [], []
        for n in names:
            during, after = cpu_per_unit(res.get(n), t)
            busy, thread, amount = busiest_per_unit(res.get(n), t)
            text = "-" if during is None else fmt_cpu(during, t)
            if during is not None and after is not None:
                text += "+" + fmt_cpu(after, t)
            b = "-" if busy is None else fmt_cpu(busy, t)
            c = ceiling(busy, t.unit, amount) if busy is not None else "-"
            cells.append(f"  {text:>11}  {b:>7}  {c:>11}")
            threads.append(thread or "-")
        unit = "s/GB" if t.unit == "bytes" else "ms/kop"
        print(f"{t.label:<{w}}  {unit:>6}" + "".join(cells) + "  " + " / ".join(threads))
    print(
        "CPU = the serving daemon's utime+stime during the step (all threads), s per GB "
        "(MB/s rows) or ms per 1000 operations (ms/kop, op/s rows); +x = what it used after "
        "the step, until the next began. The plain directory's CPU is the kernel's and is not "
        "attributed."
    )
    print(
        "busiest = the same for the daemon's busiest thread alone (/proc/PID/task/*/stat; "
        "threads that ended during the step are not counted); ceiling = 1 / busiest, the "
        "rate that thread allows on a core of its own, however many cores (>x: it used less "
        "than one clock tick, 1/SC_CLK_TCK s, in the step)."
    )


def mem_available() -> int:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--remote" in argv:
        # Every other argument is bench_remote's (its --quick, --json, --repeat, ...).
        import bench_remote

        return bench_remote.main([a for a in argv if a != "--remote"])
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Tests: " + "; ".join(
            ["a = (a)", "b = (b)", "c = (c)", "c1 = (c')", "c2 = (c'')", "d = (d)", "t = (t)",
             "m = (m)"]
        ),
    )
    ap.add_argument(
        "--size-gib",
        type=float,
        default=None,
        help="size of the single file (a, b) and of each checkpoint (c); default 2 "
        "(0.25 with --quick)",
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
        "--base-code", type=Path, default=None, metavar="DIR",
        help="also run target 'base': the ckptfs of the checkout DIR (e.g. `git worktree add "
        "DIR COMMIT`), side by side with this one (adds base to --only)",
    )
    ap.add_argument(
        "--metadata", action="store_true",
        help="only the metadata tests (m), on plain and ckptfs unless --only says otherwise "
        "(the same as --skip a,b,c,c1,c2,d,t --only plain,ckptfs; about a minute per pass)",
    )
    ap.add_argument(
        "--only",
        default=None,
        help="comma-separated subset of targets (default: plain,ckptfs,nullfs; with "
        "--metadata: plain,ckptfs)",
    )
    ap.add_argument(
        "--skip", default="", metavar="TESTS",
        help=f"comma-separated tests to leave out ({', '.join(GROUPS)}); the reads (d) write "
        "what they read untimed if (a) or (c) is skipped",
    )
    ap.add_argument("--ckpt-files", type=int, default=16)
    ap.add_argument("--threads", type=int, default=4, help="writer/reader threads in (c), (d)")
    ap.add_argument("--procs", type=int, default=4, help="processes in (c'') and (m)")
    ap.add_argument(
        "--shared-pages", action="store_true",
        help="(c''): the children write their buffers as forked, shared copy-on-write with "
        "the parent (before 2026-12-04 always so), and the parent does not make pages an "
        "earlier fork shared its own again; by default each child first stores into every "
        "page, owning them as a rank owns its tensors, and so does the parent before its "
        "own writes",
    )
    ap.add_argument(
        "--meta-files", type=int, default=None,
        help="files in the metadata tests (m), default 2000 (400 with --quick)",
    )
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
    ap.add_argument(
        "--mount-arg", action="append", default=[], metavar="ARG",
        help="one more argument for `ckptfs mount` (repeatable; write it as "
        "--mount-arg=--some-flag so it is not taken for an option of this script)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (for debugging)")
    ap.add_argument(
        "--encrypt", action="store_true",
        help="target ckptfs writes into an encrypted namespace (AES-256-GCM; a KEK file and "
        "a [[namespace]] config are made in the temp dir)",
    )
    ap.add_argument(
        "--remote", action="store_true",
        help="run the remote-tier benchmark instead (scripts/bench_remote.py); every other "
        "argument goes to it (`bench.py --remote --help` lists them)",
    )
    args = ap.parse_args(argv)

    if args.metadata:
        args.skip = ",".join(g for g in GROUPS if g != "m")
        if args.only is None:
            args.only = "plain,ckptfs"
        if args.size_gib is None:
            args.size_gib = 1 / 16  # no big file is written; only sizes the buffer checks
    size_gib = args.size_gib if args.size_gib is not None else (0.25 if args.quick else 2.0)
    single_bytes = int(size_gib * GiB) // BLOCK * BLOCK
    ckpt_file_bytes = single_bytes // args.ckpt_files // BLOCK * BLOCK
    if single_bytes <= 0 or ckpt_file_bytes <= 0:
        ap.error("--size-gib too small")
    meta_files = args.meta_files if args.meta_files is not None else (400 if args.quick else 2000)
    if args.procs < 1 or meta_files < args.procs:
        ap.error("--procs must be at least 1 and at most --meta-files")
    meta_files -= meta_files % args.procs  # an equal share per process
    p = Params(
        single_bytes, args.ckpt_files, ckpt_file_bytes, args.threads, args.procs, meta_files,
        shared_pages=args.shared_pages,
    )
    targets = [t.strip() for t in (args.only or "plain,ckptfs,nullfs").split(",") if t.strip()]
    if args.base_code is not None:
        if not (args.base_code / "ckptfs" / "__main__.py").is_file():
            ap.error(f"--base-code: {args.base_code} is not a ckptfs checkout")
        args.base_code = args.base_code.resolve()
        if "base" not in targets:
            targets.append("base")
    elif "base" in targets:
        ap.error("--only base needs --base-code DIR")
    for t in targets:
        if t not in TARGETS:
            ap.error(f"--only: unknown target {t!r} (known: {', '.join(TARGETS)})")
    skip = {g.strip() for g in args.skip.split(",") if g.strip()}
    if skip - set(GROUPS):
        ap.error(f"--skip: unknown tests {sorted(skip - set(GROUPS))} (known: {', '.join(GROUPS)})")
    groups = set(GROUPS) - skip

    parent = args.dir
    if parent is None:
        parent = Path("/work") if os.path.isdir("/work") else Path(tempfile.gettempdir())
    parent.mkdir(parents=True, exist_ok=True)
    # Peak use: one target at a time holds (a), (c) and one more checkpoint; ckptfs adds
    # its catalog.
    need = int((2 * p.single_bytes + 2 * p.ckpt_bytes) * 1.1)
    st = os.statvfs(parent)
    if st.f_bavail * st.f_frsize < need + GiB:
        print(
            f"bench: {parent} has {st.f_bavail * st.f_frsize / GiB:.1f} GiB free, "
            f"need {need / GiB:.1f} GiB + 1 GiB",
            file=sys.stderr,
        )
        return 2
    # Sources and read buffers of (a) and (c), plus room for the page cache of the reads.
    mem_need = 2 * (p.single_bytes + p.ckpt_bytes)
    if "t" in groups:
        mem_need += 2 * p.single_bytes  # the state dict and what a load makes of it
    if mem_available() < mem_need + max(p.single_bytes, p.ckpt_bytes) + GiB:
        print(
            f"bench: {mem_available() / GiB:.1f} GiB of memory available, the buffers need "
            f"{mem_need / GiB:.1f} GiB plus page cache: use a smaller --size-gib",
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
    tests = [t for t in tests_for(p) if t.group in groups]
    extra_ckptfs = (["--chunk-size", args.chunk_size] if args.chunk_size else []) + list(
        args.mount_arg
    )
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
            f"  (a),(b) one file of {fmt_size(p.single_bytes)}; (c),(c'),(c'') "
            f"{p.ckpt_files} files x {fmt_size(p.ckpt_file_bytes)} by {p.threads} threads "
            f"or {p.procs} processes; (m) {p.meta_files} files of 4 KiB in one directory, "
            f"1 process and {p.procs} processes ({p.meta_files // p.procs} names each)"
        )
        print(
            "  data: built in memory before the clocks (random 64 MiB pattern, unique 16-byte "
            "stamp per MiB block: no two chunks identical, nothing compresses); written with "
            "1 MiB os.write of memoryview slices, read with 1 MiB readinto into pre-faulted "
            "buffers of the file's size, every byte compared after the clock"
        )
        print(
            f"  ckptfs: two --local tiers, {base}/ckptfs/tier0 and tier1 -- both on "
            f"{info['disk']}, THE SAME DISK as the plain directory: striping cannot add "
            "bandwidth here; this measures ckptfs's overhead"
            + (f"; extra mount args: {' '.join(extra_ckptfs)}" if extra_ckptfs else "")
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
        t0 = time.perf_counter()
        bufs = Buffers.build(p, with_torch="t" in groups)
        print(f"  buffers built in {time.perf_counter() - t0:.1f} s", flush=True)
        stuck: set[str] = set()
        active = [n for n in TARGETS if n in targets]
        for npass in range(1, passes + 1):
            # The order rotates each pass: a target always run first (or right after
            # another) would carry the effects of that position (the page cache the one
            # before left, the VM's reclaim over time) into every pass of its rows.
            turn = (npass - 1) % len(active)
            for name in active[turn:] + active[:turn]:
                if name in stuck:
                    continue
                root = base / name
                tgt: Target
                if name == "plain":
                    tgt = PlainTarget(root)
                elif name == "ckptfs":
                    tgt = CkptfsTarget(root, extra_ckptfs, encrypt=args.encrypt)
                elif name == "base":
                    tgt = CkptfsTarget(root, extra_ckptfs, code=args.base_code)
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
                    run_target(tgt, bufs, p, groups, is_root, out, settle)
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
                    "procs": p.procs,
                    "meta_files": p.meta_files,
                    "shared_pages": p.shared_pages,
                    "block": BLOCK,
                    "quick": args.quick,
                    "chunk_size": args.chunk_size,
                    "mount_args": extra_ckptfs,
                    "tests": sorted(groups),
                    "settle_s": settle,
                    "method": "from memory (preallocated buffers, os.write / readinto)",
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
