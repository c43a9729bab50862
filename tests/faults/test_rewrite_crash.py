"""Overwriting a file in place (``open(path, "wb")``, as ``torch.save("latest.pt")`` does)
through a real mount: the truncate of O_TRUNC is visible to every handle at once but becomes
durable only with the file's next commit, so a daemon killed with -9 mid-rewrite leaves the
previous content (docs/semantics.md). A reader that opens and closes the file meanwhile
must not commit the half-written version."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.mountutil import Mount

if TYPE_CHECKING:
    from tests.conftest import CkptFactory

KiB = 1024
MiB = 1024 * KiB
# Every test kills its daemon: the remount warns that it cleans up the stale mount.
pytestmark = pytest.mark.allow_log_warnings("cleaning up stale mount")

OLD_SIZE = 8 * MiB  # 32 chunks of the tests' 256 KiB
NEW_PART = 3 * MiB + 5 * KiB  # whole chunks (already stored) and a partial one

# Holds the file open for writing until its stdin closes; says "ready" once the bytes are
# in the daemon (Python's buffer flushed).
WRITER = """
import os, sys
path, seed, n, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
f = open(path, mode, buffering=0)
f.write(((bytes([seed]) * 4096) * (n // 4096 + 1))[:n])
print("ready", flush=True)
sys.stdin.readline()
"""


def pattern(seed: int, n: int) -> bytes:
    return ((bytes([seed]) * 4096) * (n // 4096 + 1))[:n]


def fsynced_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


@pytest.fixture
def writers() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=30)


def start_writer(
    procs: list[subprocess.Popen[str]], path: Path, seed: int, n: int, mode: str = "wb"
) -> subprocess.Popen[str]:
    p = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(seed), str(n), mode],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    procs.append(p)
    assert p.stdout is not None
    assert p.stdout.readline().strip() == "ready", "the writer did not start"
    return p


def crash_and_remount(m: Mount, procs: list[subprocess.Popen[str]]) -> None:
    m.kill9()
    for p in procs:
        p.kill()
        p.wait(timeout=30)
    m.start()


@pytest.mark.parametrize("peek", ["alone", "reader-peeks", "touched"])
def test_kill9_during_rewrite_keeps_the_previous_content(
    ckpt_factory: CkptFactory, writers: list[subprocess.Popen[str]], peek: str
) -> None:
    m = ckpt_factory.mount()
    path = m.mountpoint / "latest.pt"
    old = os.urandom(OLD_SIZE)
    fsynced_file(path, old)
    start_writer(writers, path, 7, NEW_PART)
    assert os.stat(path).st_size == NEW_PART  # the truncate and the new bytes show at once
    if peek == "reader-peeks":
        # Another handle opened during the rewrite sees the new version, then closes:
        # that close is not a commit point for the writer's half-done version.
        with open(path, "rb") as r:
            assert os.fstat(r.fileno()).st_size == NEW_PART
            assert r.read() == pattern(7, NEW_PART)
    elif peek == "touched":
        # touch(1) opens for writing, sets the times and closes, writing nothing.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK)
        try:
            os.utime(fd)
        finally:
            os.close(fd)
    crash_and_remount(m, writers)
    assert path.read_bytes() == old


def test_another_handle_sees_the_truncate_at_once(
    ckpt_factory: CkptFactory, writers: list[subprocess.Popen[str]]
) -> None:
    m = ckpt_factory.mount()
    path = m.mountpoint / "latest.pt"
    fsynced_file(path, os.urandom(OLD_SIZE))
    with open(path, "rb") as r:  # opened before the rewrite starts
        assert os.fstat(r.fileno()).st_size == OLD_SIZE
        w = start_writer(writers, path, 3, 0)  # O_TRUNC, nothing written yet
        assert os.fstat(r.fileno()).st_size == 0
        assert os.pread(r.fileno(), 4096, 0) == b""
        assert w.stdin is not None
        w.stdin.close()  # the writer closes: its (empty) version is committed
        w.wait(timeout=30)
    crash_and_remount(m, [])
    assert path.read_bytes() == b""  # O_TRUNC and close with no write: the empty file


def test_rewrite_then_close_is_the_new_content_after_a_crash(
    ckpt_factory: CkptFactory, writers: list[subprocess.Popen[str]]
) -> None:
    m = ckpt_factory.mount()
    path = m.mountpoint / "latest.pt"
    fsynced_file(path, os.urandom(OLD_SIZE))
    w = start_writer(writers, path, 9, NEW_PART)
    assert w.stdin is not None
    w.stdin.close()
    assert w.wait(timeout=30) == 0
    crash_and_remount(m, [])
    assert path.read_bytes() == pattern(9, NEW_PART)
    ckpt_factory.remount(m)
    assert path.read_bytes() == pattern(9, NEW_PART)


def test_truncate_of_a_file_nobody_writes_is_committed_at_once(
    ckpt_factory: CkptFactory, writers: list[subprocess.Popen[str]]
) -> None:
    m = ckpt_factory.mount()
    path, other = m.mountpoint / "a", m.mountpoint / "b"
    old = os.urandom(OLD_SIZE)
    fsynced_file(path, old)
    fsynced_file(other, old)
    os.truncate(path, MiB + 1)  # closed file: truncate(2) is committed at once
    with open(other, "rb") as r:  # only a reader has it open: committed at once too
        os.truncate(other, 5)
        assert os.fstat(r.fileno()).st_size == 5
    crash_and_remount(m, [])
    assert path.read_bytes() == old[: MiB + 1]
    assert other.read_bytes() == old[:5]


def test_truncate_while_a_writer_has_the_file_open_joins_its_version(
    ckpt_factory: CkptFactory, writers: list[subprocess.Popen[str]]
) -> None:
    m = ckpt_factory.mount()
    path = m.mountpoint / "f"
    old = os.urandom(OLD_SIZE)
    fsynced_file(path, old)
    start_writer(writers, path, 5, 2 * MiB, mode="r+b")  # overwrites the first 2 MiB
    os.truncate(path, 3 * MiB)
    assert os.stat(path).st_size == 3 * MiB  # seen at once
    crash_and_remount(m, writers)  # before the writer's commit: neither is durable
    assert path.read_bytes() == old


def test_kill9_after_many_small_closes_keeps_every_closed_file(
    ckpt_factory: CkptFactory, writers: list[subprocess.Popen[str]]
) -> None:
    # The many-small-files path (issue 12): every close is a commit, whatever the put of
    # its frame looks like; a file still open at the crash is empty (it was new).
    m = ckpt_factory.mount()
    d = m.mountpoint / "shards"
    d.mkdir()
    files = {d / f"f{i:03d}.bin": os.urandom(4 * KiB) for i in range(200)}
    for path, data in files.items():
        path.write_bytes(data)
    start_writer(writers, d / "open.bin", 5, 4 * KiB, mode="xb")
    m.kill9()
    for tier in m.locals:  # before the remount, which would clean them up
        assert list((tier / "tmp").iterdir()) == []  # no frame left half-written
    for p in writers:
        p.kill()
        p.wait(timeout=30)
    m.start()
    for path, data in files.items():
        assert path.read_bytes() == data
    assert (d / "open.bin").read_bytes() == b""
