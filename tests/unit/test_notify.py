"""The FUSE_NOTIFY_STORE message fuse/notify.py writes (include/uapi/linux/fuse.h), read
back from a pipe; the session's descriptor found among a process's descriptors."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from ckptfs.fuse.notify import FUSE_NOTIFY_STORE, KernelPages, SessionPages, session_fd


def test_a_store_is_one_message_header_then_bytes() -> None:
    r, w = os.pipe()
    try:
        data = bytearray(os.urandom(8192))
        KernelPages(w).store(42, 1 << 40, memoryview(data)[4096:])
        msg = os.read(r, 1 << 16)
    finally:
        os.close(r)
        os.close(w)
    length, code, unique = struct.unpack_from("<IiQ", msg)
    nodeid, offset, size, pad = struct.unpack_from("<QQII", msg, 16)
    assert (length, code, unique) == (len(msg), FUSE_NOTIFY_STORE, 0)
    assert (nodeid, offset, size, pad) == (42, 1 << 40, 4096, 0)
    assert msg[40:] == data[4096:]


def test_the_session_descriptor_is_the_one_open_on_dev_fuse(tmp_path: Path) -> None:
    (tmp_path / "3").symlink_to("/dev/null")
    (tmp_path / "7").symlink_to("/dev/fuse")
    assert session_fd(tmp_path) == 7
    (tmp_path / "9").symlink_to("/dev/fuse")
    assert session_fd(tmp_path) is None  # two sessions: which one is ours is not known


def test_without_a_descriptor_pushes_go_to_the_fallback() -> None:
    calls: list[tuple[int, int, bytes]] = []
    pages = SessionPages(lambda ino, off, data: calls.append((ino, off, bytes(data))),
                         find_fd=lambda: None)
    pages.store(5, 4096, b"x" * 4096)
    assert calls == [(5, 4096, b"x" * 4096)]


def test_a_kernel_refusal_is_an_oserror() -> None:
    r, w = os.pipe()
    os.close(r)
    try:
        with pytest.raises(BrokenPipeError):
            KernelPages(w).store(1, 0, b"y" * 4096)
    finally:
        os.close(w)
