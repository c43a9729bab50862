"""READ through the direct path by chunks (docs/direct-path.md): ranges that start and end
anywhere (inside a chunk, on a boundary, past the end of the file) give exactly the
file's bytes, several chunks in flight at once; a handle that wrote bytes not committed
yet reads them back, as a FUSE reader of the same open file does."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import TEST_MOUNT_ARGS
from tests.support.direct import direct_mounted
from tests.support.mountutil import Mount

from ckptfs.client import connect

KiB = 1024
CHUNK = 256 * KiB  # TEST_MOUNT_ARGS' chunk size


@pytest.fixture
def mount(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Mount]:
    with direct_mounted(tmp_path, monkeypatch, 1, TEST_MOUNT_ARGS) as m:
        yield m


def test_reads_of_any_range_give_the_files_bytes(mount: Mount) -> None:
    data = os.urandom(9 * CHUNK + 777)
    path = mount.mountpoint / "f.bin"
    path.write_bytes(data)  # through FUSE
    rnd = random.Random(35)
    edges = [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 4 * CHUNK, len(data) - 1, len(data)]
    ranges = [(a, n) for a in edges for n in (1, CHUNK, 3 * CHUNK + 5, 2 << 20)]
    ranges += [(rnd.randrange(len(data)), rnd.randrange(1, 3 << 20)) for _ in range(40)]
    c = connect(mount.mountpoint, memory=4 << 20)  # a READ of up to 16 chunks at once
    assert c is not None
    with c:
        h, size = c.open(path)
        assert size == len(data)
        for off, n in ranges:
            buf = bytearray(n)
            got = c.preadinto(h, buf, off)
            assert bytes(buf[:got]) == data[off:off + n], (off, n)
        c.close(h)


def test_a_handle_reads_what_it_wrote_before_its_commit(mount: Mount) -> None:
    old = os.urandom(3 * CHUNK)
    path = mount.mountpoint / "g.bin"
    path.write_bytes(old)
    c = connect(mount.mountpoint, memory=1 << 20)
    assert c is not None
    with c:
        h, _size = c.open(path, os.O_RDWR)
        new = os.urandom(2 * CHUNK)  # whole chunks 1 and 2, not committed yet
        assert c.pwrite(h, new, CHUNK) == len(new)
        mid = CHUNK // 2
        buf = bytearray(3 * CHUNK)
        assert c.preadinto(h, buf, mid) == 3 * CHUNK - mid
        assert bytes(buf[:3 * CHUNK - mid]) == (old[:CHUNK] + new)[mid:]
        assert path.read_bytes() == old[:CHUNK] + new  # FUSE: the open file's bytes too
        c.close(h)
    assert path.read_bytes() == old[:CHUNK] + new
