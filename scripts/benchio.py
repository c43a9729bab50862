"""I/O primitives shared by scripts/bench.py and scripts/bench_remote.py.

The benchmarks write what a framework writes: a state dict that is already in memory. So
every byte is built before any clock starts, into one preallocated buffer per file, and the
timed loops do nothing per block but a system call on a memoryview slice:

* ``Source`` - a file's contents: random (one shared ``os.urandom`` pattern, a slice at an
  offset that varies per 1 MiB block), with a 16-byte stamp (file id, block number) at the
  start of every 1 MiB block, so no two blocks (and so no two chunks) are identical and
  deduplication cannot flatter ckptfs; nothing compresses. ``stamp(id)`` rewrites only the
  stamps (cheap, untimed), so one buffer can be written several times as different data.
* ``write_from`` - ``os.write`` of 1 MiB memoryview slices, optional fsync, close.
* ``read_into`` - ``readinto`` a preallocated buffer of the file's size, 1 MiB at a time
  (as torch.load fills a tensor's storage); compare with ``same_bytes`` after the clock.
* ``cpu_seconds`` - utime + stime of a process from /proc/PID/stat (all its threads).
* ``thread_cpu_seconds`` / ``busiest_thread`` - the same per thread (/proc/PID/task/*/stat),
  and which thread used the most CPU during a step: a FUSE daemon's one request thread
  (pyfuse3's trio thread) caps its throughput at 1 / (its CPU s per GB), whatever the cores.
* ``run_forked`` - N forked worker processes, ready before the clock starts; timed until
  the last job returns.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import multiprocessing
import os
import struct
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

MiB = 1024 * 1024
BLOCK = MiB
STAMP = 16
PATTERN_SIZE = 64 * MiB
PAGE = mmap.PAGESIZE


class BenchError(Exception):
    pass


class Pattern:
    """One random pattern that every Source takes its blocks from."""

    def __init__(self, size: int = PATTERN_SIZE) -> None:
        self.data = memoryview(os.urandom(size))
        self.span = size - BLOCK

    def offset(self, file_id: int, block: int) -> int:
        return ((file_id * 7919 + block) * 4 * 4096 + block * 16) % self.span


def prefault(buf: bytearray) -> None:
    """Touch every page of ``buf`` now, so a timed loop never pays the first-touch fault
    (a host fault per page on a VM with free page reporting)."""
    if buf:
        ctypes.memset((ctypes.c_char * len(buf)).from_buffer(buf), 0, len(buf))


class Source:
    """A file's contents, built once; ``stamp`` makes it a different file's contents."""

    def __init__(self, pattern: Pattern, file_id: int, nbytes: int) -> None:
        self.nbytes = nbytes
        self.buf = bytearray(nbytes)
        self.view = memoryview(self.buf)
        for i, off in enumerate(range(0, nbytes, BLOCK)):
            n = min(BLOCK, nbytes - off)
            start = pattern.offset(file_id, i)
            self.view[off : off + n] = pattern.data[start : start + n]
        self.file_id = -1
        self.stamp(file_id)

    def stamp(self, file_id: int) -> None:
        if file_id == self.file_id:
            return
        for i, off in enumerate(range(0, self.nbytes - STAMP + 1, BLOCK)):
            struct.pack_into("<QQ", self.buf, off, file_id, i)
        self.file_id = file_id


def write_from(path: os.PathLike[str] | str, view: memoryview, fsync: bool = False) -> None:
    """Create ``path`` and write ``view`` with 1 MiB os.write calls (then fsync), close."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        total = len(view)
        off = 0
        while off < total:
            off += os.write(fd, view[off : off + BLOCK])  # a short write continues from there
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_into(path: os.PathLike[str] | str, view: memoryview) -> None:
    """Fill ``view`` (the file's size) from ``path`` with 1 MiB readinto calls; the file
    must be exactly that long."""
    total = len(view)
    got = 0
    with open(path, "rb", buffering=0) as f:
        while got < total:
            n = f.readinto(view[got : got + BLOCK])
            if not n:
                raise BenchError(f"{path}: read {got} bytes, expected {total}")
            got += n
        if f.readinto(bytearray(1)):
            raise BenchError(f"{path}: longer than the {total} bytes written")


def same_bytes(what: str, got: bytearray | memoryview, want: bytearray | memoryview) -> None:
    """Every byte of ``got`` equals ``want`` (one memcmp), or a BenchError naming the first
    1 MiB block and byte that differ."""
    if got == want:
        return
    g, w = memoryview(got), memoryview(want)
    if len(g) != len(w):
        raise BenchError(f"WRONG DATA in {what}: {len(g)} bytes, expected {len(w)}")
    for off in range(0, len(w), BLOCK):
        if g[off : off + BLOCK] != w[off : off + BLOCK]:
            a, b = bytes(g[off : off + BLOCK]), bytes(w[off : off + BLOCK])
            k = next(k for k in range(len(b)) if a[k] != b[k])
            raise BenchError(
                f"WRONG DATA in {what}: block {off // BLOCK} (offset {off}) differs at byte {k}"
            )


def fsync_dir(path: os.PathLike[str] | str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of a process (all threads) so far; None if it is gone."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return _utime_stime(stat)


def _utime_stime(stat: str) -> float:
    """utime + stime in seconds from a /proc stat line (fields after the ``)`` of comm)."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_seconds(pid: int | None) -> dict[int, tuple[str, float]] | None:
    """Per thread of a process: tid -> (its comm name, utime + stime seconds so far), from
    /proc/PID/task/TID/stat; None if the process is gone. A thread that ends between the
    listing and its read is left out. Resolution: one clock tick (1 / SC_CLK_TCK s) per
    thread."""
    if pid is None:
        return None
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    out: dict[int, tuple[str, float]] = {}
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended after the listing
            continue
        # comm may hold spaces and parentheses: it runs from the first "(" to the last ")"
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        out[int(tid)] = (name, _utime_stime(stat))
    return out or None  # a live process has at least one thread


class ThreadStep(NamedTuple):
    """A process's CPU during a step, from two ``thread_cpu_seconds`` snapshots."""

    total: float  # CPU seconds of the threads alive at the end, during the step
    busiest_tid: int
    busiest_name: str
    busiest_s: float  # CPU seconds of the busiest thread during the step


def busiest_thread(
    before: dict[int, tuple[str, float]] | None, after: dict[int, tuple[str, float]] | None
) -> ThreadStep | None:
    """The step between two snapshots of one process: the CPU of all its threads and of the
    one that used the most (None if either snapshot is missing).

    A thread that appeared during the step counts from 0. A thread that ended during the step
    is not in ``after`` and its CPU is lost: ``total`` can be below the process's own
    ``cpu_seconds`` difference (which keeps what ended threads used), and a short-lived
    thread that was the busiest is missed. A tid reused within the step would count from its
    old value (the kernel reuses a tid only after pid_max others)."""
    if before is None or after is None or not after:
        return None
    total = 0.0
    best: tuple[int, str, float] | None = None
    for tid, (name, secs) in after.items():
        prev = before.get(tid)
        used = secs - prev[1] if prev is not None else secs
        used = max(used, 0.0)
        total += used
        if best is None or used > best[2]:
            best = (tid, name, used)
    assert best is not None
    return ThreadStep(total, *best)


def read_calls(pid: int | None) -> int | None:
    """read(2)-family calls of a process so far (/proc/PID/io ``syscr``); None if unknown.
    A FUSE daemon reads /dev/fuse once per request, so during a save (no tier reads) the
    difference is about the number of FUSE requests it received."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("syscr:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def own_pages(view: memoryview) -> None:
    """Store into every page of ``view`` once (its own byte back), so that this process owns
    them: after a fork they are shared copy-on-write with the parent, and the kernel copies
    a shared anonymous page before it pins it for a direct-I/O write (a FUSE write with
    FOPEN_DIRECT_IO, an O_DIRECT write), which a plain buffered write never does; and a
    page the parent shared once is still marked so after its children are gone, so its
    first pin takes a fault too. A rank's tensors are its own memory, so the benchmark's
    writers own theirs before the clock.

    One byte stored per page, not each MiB assigned onto itself: that is memmove(p, p, n),
    which glibc returns from without storing anything when source and destination are the
    same, so it left every page shared (bench.py's (c'') from 2026-12-03 to 2026-12-04)."""
    n = len(view)
    if not n:
        return
    b = view if view.format == "B" and view.ndim == 1 else view.cast("B")
    n = len(b)
    for off in range(0, n, PAGE):
        b[off] = b[off]
    b[n - 1] = b[n - 1]  # the page of the last byte, when the view does not start on a page


def _child(job: Callable[[], None], ready: Any, go: Any, done: Any, errors: Any,
           prepare: Callable[[], None] | None, ends: Any, k: int) -> None:
    if prepare is not None:
        prepare()
    ready.wait(60)
    if not go.wait(60):
        os._exit(3)
    try:
        job()
    except BaseException as exc:  # reported to the parent, then exit 1
        errors.put(f"{type(exc).__name__}: {exc}")
        done.abort()
        os._exit(1)
    ends[k] = time.perf_counter()  # CLOCK_MONOTONIC: the same clock in every process
    with contextlib.suppress(threading.BrokenBarrierError):
        done.wait(3600)  # exit only once every job has ended: no exit while others write


def run_forked(jobs: list[Callable[[], None]], timeout: float = 3600.0,
               prepare: list[Callable[[], None]] | None = None) -> float:
    """Run each job in its own forked process; return the wall time from the moment all
    of them are forked and waiting until the last job returns. The processes exit only
    after that, outside the clock: a child's exit tears down the address space it inherited
    (0.1-0.2 s with bench.py's buffers, on a core the others' writes need), which a rank
    does not pay at the end of a save. What a job needs (its data) must exist before this
    call: the children share it with the parent copy-on-write. ``prepare[i]``, if given,
    runs in job i's process before the clock (e.g. ``own_pages``)."""
    ctx = multiprocessing.get_context("fork")
    ready = ctx.Barrier(len(jobs) + 1)
    go = ctx.Event()
    done = ctx.Barrier(len(jobs) + 1)
    errors = ctx.SimpleQueue()
    ends = ctx.Array("d", len(jobs), lock=False)
    preps: list[Callable[[], None] | None] = list(prepare) if prepare else [None] * len(jobs)
    procs = [ctx.Process(target=_child, args=(job, ready, go, done, errors, prep, ends, k))
             for k, (job, prep) in enumerate(zip(jobs, preps, strict=True))]
    try:
        for p in procs:
            p.start()
        ready.wait(60)
        t0 = time.perf_counter()
        go.set()
        with contextlib.suppress(threading.BrokenBarrierError):  # a job failed: see below
            done.wait(timeout)
        deadline = time.monotonic() + 60
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
    finally:
        for p in procs:  # only on an error or a timeout: end our own children, by PID
            if p.is_alive():
                p.terminate()
                p.join(10)
            if p.is_alive():
                p.kill()
                p.join(10)
    msgs = []
    while not errors.empty():
        msgs.append(errors.get())
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if msgs or bad:
        raise BenchError(f"worker process failed (exit codes {bad}): {'; '.join(msgs)}")
    if min(ends) <= 0.0:
        raise BenchError("a worker process ended without reporting its end time")
    return max(ends) - t0
