"""Large offsets and arbitrary byte names through a real mount.

Every offset the kernel accepts either works or fails with EFBIG at the write (past
MAX_FILE_SIZE), never reads back wrong (issue 33: a write at 2**57 read back as zeros,
through a new open too, until a remount).
"""

from __future__ import annotations

import errno
import os

import pytest

from tests.support.mountutil import Mount

from ckptfs.vfs.openfile import MAX_FILE_SIZE

CHUNK = 256 * 1024  # must match conftest.TEST_MOUNT_ARGS
KERNEL_MAX = 2**63 - 1  # MAX_LFS_FILESIZE: the kernel refuses larger offsets itself
MARK = b"TAIL-MARKER"


def _pread_fresh(path: os.PathLike[str] | str, n: int, off: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, n, off)
    finally:
        os.close(fd)


@pytest.mark.parametrize("off", [2**56, 2**57, 2**59 + CHUNK - 10, MAX_FILE_SIZE - len(MARK)])
def test_a_write_at_a_large_offset_reads_back_right(ckpt: Mount, off: int) -> None:
    path = ckpt.mountpoint / "big"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        assert os.pwrite(fd, MARK, off) == len(MARK)
        os.fsync(fd)
        assert os.pread(fd, len(MARK), off) == MARK
    finally:
        os.close(fd)
    assert _pread_fresh(path, len(MARK) + 8, off - 4) == bytes(4) + MARK
    assert os.stat(path).st_size == off + len(MARK)
    ckpt.stop()
    ckpt.start()
    assert _pread_fresh(path, len(MARK) + 8, off - 4) == bytes(4) + MARK


def test_past_the_largest_file_size_a_write_and_a_truncate_fail_with_efbig(ckpt: Mount) -> None:
    path = ckpt.mountpoint / "big"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        for off in (MAX_FILE_SIZE, 2**62, KERNEL_MAX - len(MARK)):
            with pytest.raises(OSError) as exc:
                os.pwrite(fd, MARK, off)
            assert exc.value.errno == errno.EFBIG, off
        with pytest.raises(OSError) as exc:
            os.ftruncate(fd, MAX_FILE_SIZE + 1)
        assert exc.value.errno == errno.EFBIG
        # Across the bound: a short write up to it.
        assert os.pwrite(fd, MARK, MAX_FILE_SIZE - 4) == 4
        os.fsync(fd)
        assert os.pread(fd, 100, MAX_FILE_SIZE - 8) == bytes(4) + MARK[:4]
    finally:
        os.close(fd)
    assert os.stat(path).st_size == MAX_FILE_SIZE
    with pytest.raises(OSError) as exc:
        os.truncate(path, KERNEL_MAX)
    assert exc.value.errno == errno.EFBIG
    assert _pread_fresh(path, 100, MAX_FILE_SIZE - 8) == bytes(4) + MARK[:4]
