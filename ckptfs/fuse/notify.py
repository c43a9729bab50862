"""FUSE_NOTIFY_STORE written to /dev/fuse by the caller's thread, without the GIL.

Why not pyfuse3's ``notify_store``: it was taken to hold the GIL; pyfuse3 3.5.0 in fact
releases it around libfuse's call (its __init__.pyx, ``with nogil``), so both paths copy
outside the GIL; it is pyfuse3's read *reply* (``fuse_reply_buf``) that holds it. This one
needs no libfuse session state and says what it sends (vfs/pagepush.py). The message is a plain
``writev`` on the session's /dev/fuse descriptor (include/uapi/linux/fuse.h): a
``fuse_out_header`` whose ``unique`` is 0 and whose ``error`` is the notify code, then a
``fuse_notify_store_out`` (node id, offset, size), then the bytes. The kernel copies them
into the inode's page cache during the write, and ``os.writev`` releases the GIL around it,
so every push thread copies at once while the trio thread goes on answering.

Everything else (requests, replies, invalidations) stays with pyfuse3.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from collections.abc import Callable
from pathlib import Path

from ..vfs.chunkbuffer import Buffer

log = logging.getLogger("ckptfs.fuse")

FUSE_NOTIFY_STORE = 4
# struct fuse_out_header { uint32_t len; int32_t error; uint64_t unique; }
_OUT_HEADER = struct.Struct("<IiQ")
# struct fuse_notify_store_out { uint64_t nodeid; uint64_t offset; uint32_t size; uint32_t padding; }
_STORE_OUT = struct.Struct("<QQII")
_HEADERS = _OUT_HEADER.size + _STORE_OUT.size


def session_fd(proc_fd: Path = Path("/proc/self/fd")) -> int | None:
    """The /dev/fuse descriptor of this process's session (a daemon serves one mount), or
    None when there is none or more than one (then pyfuse3's own call is used)."""
    found: list[int] = []
    for entry in proc_fd.iterdir():
        try:
            if os.readlink(entry) == "/dev/fuse":
                found.append(int(entry.name))
        except OSError:  # closed since the listing (the listing's own descriptor)
            continue
    return found[0] if len(found) == 1 else None


class KernelPages:
    """Writes bytes into the kernel's page cache of an inode (``store``), from any thread."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def store(self, ino: int, offset: int, data: Buffer) -> None:
        """Blocking; OSError as the kernel answers (ENOENT: it holds no inode ``ino``)."""
        view = memoryview(data).cast("B")
        size = view.nbytes
        head = _OUT_HEADER.pack(_HEADERS + size, FUSE_NOTIFY_STORE, 0) + _STORE_OUT.pack(
            ino, offset, size, 0
        )
        written = os.writev(self.fd, [head, view])
        if written != _HEADERS + size:  # one message is one write: never partial
            raise OSError(f"short notify write to /dev/fuse: {written} of {_HEADERS + size}")


class SessionPages:
    """``store`` for the composition root: built before the session exists, it finds the
    session's descriptor at the first push (pushes start only while the mount serves) and
    keeps it; without one it uses ``fallback`` (pyfuse3's notify_store), and says so once."""

    def __init__(self, fallback: Callable[[int, int, Buffer], None],
                 find_fd: Callable[[], int | None] = session_fd) -> None:
        self._fallback = fallback
        self._find_fd = find_fd
        self._lock = threading.Lock()
        self._resolved = False
        self._pages: KernelPages | None = None

    def _kernel(self) -> KernelPages | None:
        with self._lock:
            if not self._resolved:
                fd = self._find_fd()
                self._pages = None if fd is None else KernelPages(fd)
                self._resolved = True
                if fd is None:
                    log.info("no single /dev/fuse descriptor found: page-cache pushes go "
                             "through pyfuse3's notify_store")
                else:
                    log.info("page-cache pushes write /dev/fuse (fd %d) from worker threads", fd)
            return self._pages

    def store(self, ino: int, offset: int, data: Buffer) -> None:
        pages = self._kernel()
        if pages is None:
            self._fallback(ino, offset, data)
        else:
            pages.store(ino, offset, data)
