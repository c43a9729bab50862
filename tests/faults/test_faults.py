"""Fault injection through real mounts: kill -9 mid-write, full tiers, vanished and corrupt tiers.

What must hold (docs: semantics):
* close()/fsync() is the commit point. After kill -9 of the daemon every file closed (or
  fsynced) before the kill reads back bit-identical after remount; a file being written
  shows its last committed content (a new one: size 0), never a half-written state.
* ``ckptfs fsck`` reports chunk files no committed file references ("orphan"), exit 1;
  ``--repair`` deletes them, exit 0.
* A full, vanished or failing tier gives ENOSPC/EIO to the writer, logs a clear error
  naming the tier, never returns wrong bytes and never corrupts other files.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import queue
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.mountutil import (
    FUSE_AVAILABLE,
    SKIP_REASON,
    Mount,
    drop_cached_pages,
    is_mounted,
    mounted,
    pid_alive,
    run_cli,
)

pytestmark = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)

KiB = 1024
MiB = 1024 * KiB
CHUNK_ARGS = ("--chunk-size", "1MiB")


# --------------------------------------------------------------------------- helpers


def blob(seed: int, size: int) -> bytes:
    """Deterministic incompressible bytes; the writer subprocess uses the same function."""
    return random.Random(seed).randbytes(size)


def chunk_files(tier: Path) -> set[Path]:
    """Every regular file under TIER/chunks (chunks and any temp files the daemon left)."""
    root = tier / "chunks"
    if not root.exists():
        return set()
    return {p for p in root.rglob("*") if p.is_file()}


def all_chunk_files(tiers: list[Path]) -> set[Path]:
    out: set[Path] = set()
    for t in tiers:
        out |= chunk_files(t)
    return out


def tier_bytes(tier: Path) -> int:
    return sum(p.stat().st_size for p in chunk_files(tier))


_DIGEST_PATH = re.compile(r"/chunks/([0-9a-f]{2})/(\1[0-9a-f]{62})$")


def is_chunk_path(p: Path) -> bool:
    return bool(_DIGEST_PATH.search(str(p)))


def wait_until(cond, timeout: float, what: str, interval: float = 0.05):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def kill9_daemon(m: Mount) -> None:
    """SIGKILL the daemon this test started and wait until it is really gone."""
    assert m.pid is not None
    pid = m.pid
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid), 30, f"daemon {pid} to die")
    m._forget_pid()


def write_file(path: Path, data: bytes, piece: int = 1 * MiB) -> int | None:
    """Write ``data`` with raw os.write calls and close; the errno of the first failure or None."""
    err: int | None = None
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        off = 0
        while off < len(data):
            off += os.write(fd, data[off : off + piece])
    except OSError as e:
        err = e.errno
    finally:
        try:
            os.close(fd)
        except OSError as e:
            err = err or e.errno
    return err


def read_or_errno(path: Path) -> bytes | int:
    try:
        with open(path, "rb", buffering=0) as f:
            out = bytearray()
            while block := f.read(1 * MiB):
                out += block
            return bytes(out)
    except OSError as e:
        assert e.errno is not None
        return e.errno


def describe(r: bytes | int) -> str:
    return errno.errorcode.get(r, str(r)) if isinstance(r, int) else f"{len(r)} bytes"


def log_lines_matching(m: Mount, *patterns: str) -> list[str]:
    """Log lines that match every one of the (case-insensitive) regexes."""
    regs = [re.compile(p, re.IGNORECASE) for p in patterns]
    return [ln for ln in m.log.splitlines() if all(r.search(ln) for r in regs)]


def write_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def fsck(state_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_cli("fsck", "--state-dir", str(state_dir), *extra, timeout=120)


# --------------------------------------------------------------------------- kill -9

WRITER = r"""
import json, os, random, sys
MiB = 1024 * 1024
mnt = sys.argv[1]
P = json.loads(sys.argv[2])
SIZES, REWRITE_SIZE, FSYNCED_SIZE, PARTIAL_SIZE = (
    P["closed"], P["rewrite"], P["fsynced"], P["partial"]
)
def blob(seed, size):
    return random.Random(seed).randbytes(size)
def say(*a):
    print(*a, flush=True)

os.mkdir(os.path.join(mnt, "closed"))
for i, size in enumerate(SIZES):
    with open(os.path.join(mnt, "closed", f"f{i}.bin"), "wb") as f:
        f.write(blob(i, size))
    say("closed", i)
with open(os.path.join(mnt, "rewrite.bin"), "wb") as f:
    f.write(blob(1000, REWRITE_SIZE))
synced = open(os.path.join(mnt, "fsynced.bin"), "wb", buffering=0)
synced.write(blob(2000, FSYNCED_SIZE))
os.fsync(synced.fileno())
say("committed")
sys.stdin.readline()  # the test snapshots the tier directories now

# Phase 2: nothing below is ever committed.
rw = open(os.path.join(mnt, "rewrite.bin"), "r+b", buffering=0)
rw.write(blob(1001, 2 * MiB + 100))  # overwrite the start of a committed file
synced.write(blob(2001, 3 * MiB))  # grow past the fsynced content
part = open(os.path.join(mnt, "partial.bin"), "wb", buffering=0)
data = blob(3000, PARTIAL_SIZE)
step = 256 * 1024
for off in range(0, len(data), step):
    part.write(data[off:off + step])
say("ready")
sys.stdin.readline()  # the test has seen chunks of these writes on the tiers

# Phase 3: keep write requests in flight while the daemon is killed.
stream = open(os.path.join(mnt, "streaming.bin"), "wb", buffering=0)
piece = blob(4000, step)
for n in range(1024):  # at most 256 MiB; the kill comes long before
    stream.write(piece)
    if n == 16:
        say("streaming")
sys.stdin.readline()  # hold every file open until killed
"""

CLOSED_SIZES = [0, 1, 1 * MiB - 1, 1 * MiB, 1 * MiB + 1, 3 * MiB + 17, 5 * MiB]
REWRITE_SIZE = 3 * MiB + 5
FSYNCED_SIZE = 2 * MiB + 7
PARTIAL_SIZE = 24 * MiB


class LineReader:
    """Lines from a subprocess's stdout, read with a deadline (a thread feeds a queue)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.q: queue.Queue[str | None] = queue.Queue()
        assert proc.stdout is not None
        stdout = proc.stdout

        def pump() -> None:
            for line in stdout:
                self.q.put(line.rstrip("\n"))
            self.q.put(None)

        threading.Thread(target=pump, daemon=True).start()

    def expect(self, want: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"writer did not report {want!r} within {timeout:.0f}s")
            try:
                line = self.q.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                pytest.fail(f"writer exited before reporting {want!r}")
            if line == want:
                return


def check_committed_content(mnt: Path) -> None:
    for i, size in enumerate(CLOSED_SIZES):
        p = mnt / "closed" / f"f{i}.bin"
        r = read_or_errno(p)
        assert isinstance(r, bytes), f"{p.name}: reading a closed file failed: {describe(r)}"
        assert len(r) == size, f"{p.name}: size {len(r)} after the crash, closed with {size}"
        assert r == blob(i, size), f"{p.name}: content differs from what was closed"
    r = read_or_errno(mnt / "rewrite.bin")
    assert isinstance(r, bytes), describe(r)
    assert r == blob(1000, REWRITE_SIZE), (
        f"rewrite.bin ({len(r)} bytes) is not its last committed content: an uncommitted "
        "overwrite leaked through the crash"
    )
    r = read_or_errno(mnt / "fsynced.bin")
    assert isinstance(r, bytes), describe(r)
    assert len(r) == FSYNCED_SIZE and r == blob(2000, FSYNCED_SIZE), (
        f"fsynced.bin ({len(r)} bytes) is not its fsynced content ({FSYNCED_SIZE} bytes)"
    )
    for name in ("partial.bin", "streaming.bin"):
        part = mnt / name
        if part.exists():
            assert part.stat().st_size == 0, (
                f"{name} shows {part.stat().st_size} bytes of a write that was never committed"
            )
            assert read_or_errno(part) == b""


@pytest.mark.slow
@pytest.mark.allow_log_warnings("cleaning up stale mount")
def test_kill9_mid_write_then_remount_and_fsck(tmp_path: Path) -> None:
    tiers = [tmp_path / "tier0", tmp_path / "tier1"]
    # A small memory budget forces the daemon to put chunks of the unfinished 24 MiB
    # write on the tiers before close: those become the orphans fsck must find.
    cfg = write_config(
        tmp_path / "ckptfs.toml",
        'chunk_size = "1MiB"\nmemory_budget = "8MiB"\n',
    )
    with mounted(tmp_path, n_local=2, extra_args=("--config", str(cfg))) as m:
        assert m.locals == tiers
        params = {
            "closed": CLOSED_SIZES,
            "rewrite": REWRITE_SIZE,
            "fsynced": FSYNCED_SIZE,
            "partial": PARTIAL_SIZE,
        }
        writer = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(m.mountpoint), json.dumps(params)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            lines = LineReader(writer)
            lines.expect("committed", 120)
            committed = all_chunk_files(tiers)
            assert writer.stdin is not None
            writer.stdin.write("go\n")
            writer.stdin.flush()
            lines.expect("ready", 120)
            # The uncommitted data has reached the tiers as chunk files.
            wait_until(
                lambda: len(all_chunk_files(tiers) - committed) >= 4,
                60,
                "chunks of the unfinished write to appear on the tiers "
                "(memory_budget is 8 MiB, 29 MiB are buffered)",
            )
            writer.stdin.write("go\n")
            writer.stdin.flush()
            lines.expect("streaming", 120)
            kill9_daemon(m)
        finally:
            writer.kill()
            writer.wait(timeout=30)

        # The mount is stale now; `ckptfs mount` itself must clean it up.
        with pytest.raises(OSError) as ei:
            os.listdir(m.mountpoint)
        assert ei.value.errno in (errno.ENOTCONN, errno.ECONNABORTED), ei.value
        m.start()

        check_committed_content(m.mountpoint)
        names = sorted(p.name for p in m.mountpoint.iterdir())
        assert set(names) <= {
            "closed",
            "rewrite.bin",
            "fsynced.bin",
            "partial.bin",
            "streaming.bin",
        }, names
        assert sorted(p.name for p in (m.mountpoint / "closed").iterdir()) == sorted(
            f"f{i}.bin" for i in range(len(CLOSED_SIZES))
        )
        m.stop()
        assert not is_mounted(m.mountpoint)

        leftovers = all_chunk_files(tiers) - committed
        assert leftovers, "the uncommitted chunks vanished before fsck (mount cleaned them?)"
        assert committed <= all_chunk_files(tiers), "committed chunks were lost"

        res = fsck(m.state_dir)
        out = res.stdout + res.stderr
        assert res.returncode == 1, (
            f"fsck should find orphans (exit 1), got {res.returncode}:\n{out}"
        )
        assert "orphan" in out.lower(), out
        assert all_chunk_files(tiers) == committed | leftovers, (
            "fsck without --repair deleted files"
        )

        res = fsck(m.state_dir, "--repair")
        out = res.stdout + res.stderr
        assert res.returncode == 0, f"fsck --repair exit {res.returncode}:\n{out}"
        remaining = all_chunk_files(tiers)
        assert not (remaining - committed), (
            f"fsck --repair left {len(remaining - committed)} unreferenced files: "
            f"{sorted(str(p) for p in remaining - committed)[:5]}"
        )
        assert committed <= remaining, "fsck --repair deleted chunks of committed files"

        res = fsck(m.state_dir)
        assert res.returncode == 0, (
            f"second fsck not clean ({res.returncode}):\n{res.stdout}{res.stderr}"
        )

        m.start()
        check_committed_content(m.mountpoint)


def test_fsck_finds_and_repairs_planted_orphans(tmp_path: Path) -> None:
    """Deterministic orphans: chunk files of a deleted file, put back behind the daemon's back."""
    with mounted(tmp_path, n_local=2, extra_args=CHUNK_ARGS) as m:
        keep = blob(1, 2 * MiB + 3)
        assert write_file(m.mountpoint / "keep.bin", keep) is None
        before = all_chunk_files(m.locals)
        assert write_file(m.mountpoint / "gone.bin", blob(2, 3 * MiB + 1)) is None
        new = all_chunk_files(m.locals) - before
        assert len(new) >= 3, f"a 3 MiB file with 1 MiB chunks made {len(new)} chunk files"
        assert all(is_chunk_path(p) for p in new), sorted(map(str, new))
        saved = {p: p.read_bytes() for p in new}
        (m.mountpoint / "gone.bin").unlink()
        m.stop()

        res = fsck(m.state_dir)
        assert res.returncode == 0, (
            f"fsck after a clean umount: {res.returncode}\n{res.stdout}{res.stderr}"
        )

        for p, data in saved.items():
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        res = fsck(m.state_dir)
        out = res.stdout + res.stderr
        assert res.returncode == 1, f"planted orphans not found ({res.returncode}):\n{out}"
        assert "orphan" in out.lower(), out
        assert all(p.exists() for p in saved), "fsck without --repair deleted something"

        res = fsck(m.state_dir, "--repair")
        assert res.returncode == 0, f"fsck --repair: {res.returncode}\n{res.stdout}{res.stderr}"
        assert not any(p.exists() for p in saved), "fsck --repair left orphans behind"
        assert before <= all_chunk_files(m.locals), "fsck --repair deleted live chunks"
        assert fsck(m.state_dir).returncode == 0

        m.start()
        assert read_or_errno(m.mountpoint / "keep.bin") == keep
        assert not (m.mountpoint / "gone.bin").exists()
        bad = [ln for ln in m.log.splitlines() if "ERROR" in ln or "Traceback" in ln]
        assert not bad, "unexpected errors in the daemon log:\n" + "\n".join(bad[:20])


# --------------------------------------------------------------------------- full tiers


def small_tiers_config(path: Path, tiers: list[Path], capacity: str) -> Path:
    text = 'chunk_size = "1MiB"\n'
    for i, t in enumerate(tiers):
        t.mkdir(parents=True, exist_ok=True)
        text += f'\n[[tier]]\nname = "small{i}"\nkind = "local"\npath = "{t}"\ncapacity = "{capacity}"\n'
    return write_config(path, text)


def assert_failed_file_not_presented(path: Path) -> None:
    if path.exists():
        r = read_or_errno(path)
        assert r == b"" or r == errno.EIO, (
            f"{path.name}: a write that failed shows {describe(r)}; its last committed "
            "content is empty"
        )


def failed_big_writes(mnt: Path, seed: int, allowed: tuple[int, ...], trials: int = 6) -> None:
    """Write 16 MiB that cannot fit, then at once reopen and read the file, as a retrying
    application would. The failed write must never be visible: the file reads empty (its
    last committed content), never as the written length of zeros or partial data.

    Several trials, because the reopen races with the kernel's asynchronous RELEASE.
    """
    for t in range(trials):
        path = mnt / f"big{t}.bin"
        err = write_file(path, blob(seed + t, 16 * MiB))
        assert err in allowed, f"16 MiB that cannot fit gave {describe(err or 0)}, want {allowed}"
        assert_failed_file_not_presented(path)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


@pytest.mark.allow_log_errors
def test_tier_capacity_full_gives_enospc(tmp_path: Path) -> None:
    tiers = [tmp_path / "cap0", tmp_path / "cap1"]
    cfg = small_tiers_config(tmp_path / "ckptfs.toml", tiers, "4MiB")
    with mounted(tmp_path, n_local=0, extra_args=("--config", str(cfg))) as m:
        mnt = m.mountpoint
        small = blob(10, 100 * KiB)
        fill = blob(11, 2 * MiB)
        assert write_file(mnt / "small.bin", small) is None
        assert write_file(mnt / "fill.bin", fill) is None

        failed_big_writes(mnt, 12, (errno.ENOSPC,))
        for t in tiers:
            assert tier_bytes(t) <= 4 * MiB, f"{t.name} holds {tier_bytes(t)} bytes, capacity 4 MiB"

        drop_cached_pages(mnt / "small.bin", mnt / "fill.bin")
        assert read_or_errno(mnt / "small.bin") == small
        assert read_or_errno(mnt / "fill.bin") == fill
        assert log_lines_matching(m, r"ENOSPC|no space|full|capacity"), (
            "no log line explains the ENOSPC:\n" + m.log[-3000:]
        )

        # Free space again: the filesystem works as before.
        (mnt / "fill.bin").unlink()
        after = blob(13, 4 * MiB)
        wait_until(
            lambda: write_file(mnt / "after.bin", after) is None,
            15,
            "a 4 MiB write to succeed after deleting files (space of the failed write not reclaimed?)",
            interval=0.5,
        )
        assert read_or_errno(mnt / "after.bin") == after
        assert read_or_errno(mnt / "small.bin") == small
        for t in tiers:
            assert tier_bytes(t) <= 4 * MiB

        m.stop()
        m.start()
        assert read_or_errno(mnt / "after.bin") == after
        assert read_or_errno(mnt / "small.bin") == small
        assert not (mnt / "fill.bin").exists()


@pytest.mark.allow_log_errors
def test_capacity_counts_across_remount(tmp_path: Path) -> None:
    """Bytes already on the tiers count against capacity after a remount, too."""
    tiers = [tmp_path / "cap0", tmp_path / "cap1"]
    cfg = small_tiers_config(tmp_path / "ckptfs.toml", tiers, "4MiB")
    with mounted(tmp_path, n_local=0, extra_args=("--config", str(cfg))) as m:
        first = blob(20, 5 * MiB)
        assert write_file(m.mountpoint / "first.bin", first) is None
        m.stop()
        m.start()
        err = write_file(m.mountpoint / "second.bin", blob(21, 5 * MiB))
        assert err == errno.ENOSPC, f"10 MiB fit into 8 MiB of capacity ({describe(err or 0)})"
        for t in tiers:
            assert tier_bytes(t) <= 4 * MiB
        assert read_or_errno(m.mountpoint / "first.bin") == first


@pytest.fixture
def tmpfs_tiers(tmp_path: Path) -> Iterator[list[Path]]:
    """Two 4 MiB tmpfs mounts used as tier directories: a device that really fills up."""
    tiers = [tmp_path / "dev0", tmp_path / "dev1"]
    mounted_here: list[Path] = []
    try:
        for t in tiers:
            t.mkdir()
            res = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(t)],
                capture_output=True,
                text=True,
            )
            if res.returncode != 0:
                pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
            mounted_here.append(t)
        yield tiers
    finally:
        for t in mounted_here:
            if subprocess.run(["umount", str(t)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(t)], capture_output=True)


@pytest.mark.allow_log_errors
def test_real_full_device(tmp_path: Path, tmpfs_tiers: list[Path]) -> None:
    base = tmp_path / "fs"
    base.mkdir()
    m = Mount(base / "mnt", base / "state", tmpfs_tiers, CHUNK_ARGS)
    try:
        m.start()
        mnt = m.mountpoint
        small = blob(30, 100 * KiB)
        assert write_file(mnt / "small.bin", small) is None
        failed_big_writes(mnt, 31, (errno.ENOSPC, errno.EIO))
        drop_cached_pages(mnt / "small.bin")
        assert read_or_errno(mnt / "small.bin") == small
        assert log_lines_matching(m, r"ENOSPC|no space|full"), (
            "no log line explains the full device"
        )

        after = blob(32, 2 * MiB)
        wait_until(
            lambda: write_file(mnt / "after.bin", after) is None,
            15,
            "a 2 MiB write to succeed once the big file is gone (space not reclaimed?)",
            interval=0.5,
        )
        m.stop()
        m.start()
        assert read_or_errno(mnt / "small.bin") == small
        assert read_or_errno(mnt / "after.bin") == after
        m.stop()
    finally:
        m.cleanup()


# --------------------------------------------------------------------------- vanished tier


def write_tracking(m: Mount, name: str, data: bytes) -> set[int]:
    """Write and close a file; return the indexes of the tiers that got its new chunks."""
    before = [chunk_files(t) for t in m.locals]
    assert write_file(m.mountpoint / name, data) is None, name
    return {i for i, t in enumerate(m.locals) if chunk_files(t) - before[i]}


@pytest.mark.allow_log_errors
@pytest.mark.allow_log_warnings("statfs: tier local0", "cannot sync")  # its directory is gone
def test_vanished_tier(tmp_path: Path) -> None:
    with mounted(tmp_path, n_local=2, extra_args=CHUNK_ARGS) as m:
        files: dict[str, bytes] = {}
        where: dict[str, set[int]] = {}
        for k in range(8):
            files[f"small{k}.bin"] = blob(100 + k, 200 * KiB + k)
        for k in range(3):
            files[f"multi{k}.bin"] = blob(200 + k, 3 * MiB + 333)
        for name, data in files.items():
            where[name] = write_tracking(m, name, data)
            assert where[name], f"{name}: no chunk file appeared on any tier after close"

        # Remove the tier that holds data, preferring one that leaves some file whole.
        def pick() -> int:
            for v in (0, 1):
                if any(w == {1 - v} for w in where.values()) and any(
                    v in w for w in where.values()
                ):
                    return v
            return 0 if any(0 in w for w in where.values()) else 1

        v = pick()
        gone = m.locals[v]
        backup = tmp_path / "backup"
        shutil.copytree(gone, backup)
        shutil.rmtree(gone)
        drop_cached_pages(*(m.mountpoint / name for name in files))

        lost = [n for n, w in where.items() if v in w]
        whole = [n for n, w in where.items() if v not in w]
        assert lost, "no file had a chunk on the removed tier"
        for name in lost:
            r = read_or_errno(m.mountpoint / name)
            assert r == errno.EIO or r == files[name], (
                f"{name} (chunks on the vanished tier) read as {describe(r)}: must be EIO, never wrong bytes"
            )
        for name in whole:
            r = read_or_errno(m.mountpoint / name)
            assert r == files[name], f"{name} lives on the healthy tier but read as {describe(r)}"

        new: dict[str, bytes] = {}
        for k in range(6):
            name = f"new{k}.bin"
            data = blob(300 + k, (300 * KiB + k) if k % 2 else (2 * MiB + k))
            err = write_file(m.mountpoint / name, data)
            if err is None:
                new[name] = data
                assert read_or_errno(m.mountpoint / name) == data, name
            else:
                assert err == errno.EIO, f"writing {name} with a vanished tier gave {describe(err)}"
        assert not chunk_files(gone), (
            f"the daemon recreated the vanished tier {gone} and wrote chunks into it"
        )
        names = (f"local{v}", str(gone))
        hits = [
            ln
            for ln in log_lines_matching(
                m, r"error|fail|missing|unavailable|vanish|offline|EIO|no such"
            )
            if any(n in ln for n in names)
        ]
        assert hits, f"no log line names the vanished tier {names}:\n{m.log[-3000:]}"
        for name in whole:
            assert read_or_errno(m.mountpoint / name) == files[name]

        m.stop()
        # The device comes back: everything reads again.
        if gone.exists():
            shutil.copytree(backup, gone, dirs_exist_ok=True)
        else:
            shutil.move(str(backup), str(gone))
        m.start()
        for name, data in {**files, **new}.items():
            r = read_or_errno(m.mountpoint / name)
            assert r == data, f"{name} after the tier came back: {describe(r)}"


# --------------------------------------------------------------------------- corrupt chunks


@pytest.mark.allow_log_errors
def test_corrupt_and_truncated_chunks_give_eio(tmp_path: Path) -> None:
    with mounted(tmp_path, n_local=2, extra_args=CHUNK_ARGS) as m:
        data = {
            "flipped.bin": blob(40, 3 * MiB + 9),
            "truncated.bin": blob(41, 2 * MiB + 1),
            "intact.bin": blob(42, 2 * MiB + 2),
        }
        chunks: dict[str, set[Path]] = {}
        for name, d in data.items():
            before = all_chunk_files(m.locals)
            assert write_file(m.mountpoint / name, d) is None
            chunks[name] = all_chunk_files(m.locals) - before
            assert chunks[name], name
        m.stop()

        victim = sorted(chunks["flipped.bin"])[0]
        raw = bytearray(victim.read_bytes())
        raw[len(raw) // 2] ^= 0x40  # one bit, in the payload
        victim.write_bytes(bytes(raw))
        short = sorted(chunks["truncated.bin"])[0]
        os.truncate(short, short.stat().st_size // 2)

        m.start()
        for name in ("flipped.bin", "truncated.bin"):
            r = read_or_errno(m.mountpoint / name)
            assert r == errno.EIO, (
                f"{name} with a damaged chunk read as {describe(r)}, expected EIO"
            )
        assert read_or_errno(m.mountpoint / "intact.bin") == data["intact.bin"]
        assert log_lines_matching(m, r"corrupt|digest|checksum|mismatch|verif|truncat|short"), (
            "no log line reports the damaged chunks:\n" + m.log[-3000:]
        )
        # Damage is not contagious: new writes and the intact file keep working.
        fresh = blob(43, 1 * MiB + 5)
        assert write_file(m.mountpoint / "fresh.bin", fresh) is None
        assert read_or_errno(m.mountpoint / "fresh.bin") == fresh
