"""Chunks read ahead are pushed into the kernel's page cache (vfs/pagepush.py): on a real
FUSE mount (256 KiB chunks), a cold sequential read gets the right bytes with fewer of
them sent as replies, and what a writer changed is what every later read sees."""

from __future__ import annotations

import ctypes
import functools
import json
import mmap
import os
import threading
import time
from pathlib import Path
from typing import Any

from tests.conftest import CkptFactory
from tests.support.mountutil import wait_until

MiB = 1024 * 1024
CHUNK = 256 * 1024  # conftest.TEST_MOUNT_ARGS
PAGE = mmap.PAGESIZE


def facts(state_dir: Path) -> dict[str, Any]:
    try:
        out: dict[str, Any] = json.loads((state_dir / "stats.json").read_text())
    except (OSError, ValueError):
        return {}
    return out


def read_into(path: Path, size: int, step: int = MiB) -> bytes:
    buf = bytearray(size)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        got = 0
        while got < size:
            n = f.readinto(view[got:got + step])
            assert n, f"short read at {got}"
            got += n
    return bytes(buf)


def read_ahead_bytes(mountpoint: Path) -> int:
    """The kernel's read-ahead of the mount (its bdi, found by the mount's device)."""
    st = os.stat(mountpoint)
    kb = Path(f"/sys/class/bdi/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/read_ahead_kb")
    return int(kb.read_text()) * 1024


class CacheView:
    """A read-only shared mapping of [lo, hi) (page aligned) of an open file, never touched
    but where asked: which of its pages the kernel's page cache holds (mincore: no fault,
    so no read request), and holding some there (a page mapped into a process is not
    dropped by drop_caches, and reclaim sees it referenced)."""

    def __init__(self, fd: int, lo: int, hi: int) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.libc.mmap.restype = ctypes.c_void_p
        self.libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                   ctypes.c_int, ctypes.c_int, ctypes.c_long]
        self.libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
        self.libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self.length = hi - lo
        addr = self.libc.mmap(None, self.length, mmap.PROT_READ, mmap.MAP_SHARED, fd, lo)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap")
        self.addr: int = addr

    def resident(self) -> list[int]:
        """The pages (indexes from ``lo``) the page cache holds."""
        vec = ctypes.create_string_buffer(self.length // PAGE)
        if self.libc.mincore(self.addr, self.length, vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        return [i for i, b in enumerate(vec.raw) if b & 1]

    def hold(self, pages: list[int]) -> None:
        """Map these (resident) pages into this process: a minor fault each, no request."""
        for i in pages:
            ctypes.string_at(self.addr + i * PAGE, 1)

    def close(self) -> None:
        self.libc.munmap(self.addr, self.length)


def test_a_cold_sequential_read_is_served_partly_from_pushed_pages(
    ckpt_factory: CkptFactory,
) -> None:
    """The reader reads the first chunk; the kernel asks for it and its read-ahead window,
    nothing more while the reader waits. Pages the page cache holds past that window were
    pushed: the test waits until 2 MiB of them are there (mincore, the kernel's own word),
    then reads on and gets them without a request. Decided, not raced: a reader at full
    speed on a loaded machine would otherwise catch up with the pushes and its requests
    answer the rest. The test maps those pages while it reads: a page cache emptied
    meanwhile (drop_caches, memory pressure) keeps them, and would otherwise make the
    kernel ask for them again (16 MiB replied for this 16 MiB file, once, under load)."""
    m = ckpt_factory.mount()
    data = os.urandom(16 * MiB)  # 64 chunks
    (m.mountpoint / "f.bin").write_bytes(data)
    ckpt_factory.remount(m)  # a new kernel mount: no page of it is cached
    asked = CHUNK + read_ahead_bytes(m.mountpoint)  # what the kernel may ask for so far
    buf = bytearray(len(data))
    view = memoryview(buf)
    with open(m.mountpoint / "f.bin", "rb", buffering=0) as f:
        assert f.readinto(view[:CHUNK]) == CHUNK
        cache = CacheView(f.fileno(), asked, len(data))
        try:
            wait_until(lambda: len(cache.resident()) * PAGE >= 2 * MiB, 30,
                       "2 MiB pushed into the page cache past the kernel's read-ahead")
            held = cache.resident()
            cache.hold(held)  # kept there while the reader reads on (nothing evicts them)
            pushed_before = len(held) * PAGE
            got = CHUNK
            while got < len(data):
                n = f.readinto(view[got:got + MiB])
                assert n, f"short read at {got}"
                got += n
        finally:
            cache.close()
    assert bytes(buf) == data
    done = time.time()
    wait_until(lambda: (m.state_dir / "stats.json").stat().st_mtime > done + 0.1, 10,
               "a stats snapshot after the read")
    snap = facts(m.state_dir)
    counters = snap["counters"]
    # Read bytes count replies and pushed pages alike.
    replied = snap["app"]["read_bytes"] - counters["page_cache_pushed_bytes"]
    assert counters.get("page_cache_push_errors", 0) == 0, counters
    # Pushed by worker threads writing /dev/fuse themselves (fuse/notify.py), not pyfuse3.
    assert "page-cache pushes write /dev/fuse" in m.log, m.log[-2000:]
    # The reader got every byte; the daemon replied with fewer: the pages pushed before
    # it read on (nobody had asked for them) came from the page cache.
    assert replied <= len(data) - pushed_before, (replied, pushed_before, counters)


def test_what_a_writer_changed_is_what_reads_see_while_pushes_run(
    ckpt_factory: CkptFactory,
) -> None:
    """A reader keeps reading the file sequentially (its readahead pushes pages) while a
    writer rewrites it three times; afterwards every read sees the last version: no push
    of an older version landed after a write."""
    m = ckpt_factory.mount()
    path = m.mountpoint / "f.bin"
    size = 8 * MiB
    path.write_bytes(os.urandom(size))
    ckpt_factory.remount(m)
    stop = threading.Event()
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            while not stop.is_set():
                read_into(path, size)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    t = threading.Thread(target=reader)
    t.start()
    try:
        last = b""
        for _ in range(3):
            last = os.urandom(size)
            with open(path, "r+b", buffering=0) as f:
                for off in range(0, size, MiB):
                    f.write(last[off:off + MiB])
                os.fsync(f.fileno())
    finally:
        stop.set()
        t.join(60)
    assert not errors, errors
    assert read_into(path, size) == last
    assert read_into(path, size, step=MiB // 4) == last
    counters = facts(m.state_dir).get("counters", {})
    assert counters.get("page_cache_push_errors", 0) == 0, counters


def test_readers_of_items_of_one_file_each_get_readahead_and_pushes(
    ckpt_factory: CkptFactory,
) -> None:
    """As torch.distributed.checkpoint's reader reads items (by offset and length), three
    readers, each with its own handle, read their own item of one file, their requests
    interleaved one by one (one thread, POSIX_FADV_RANDOM: each read asks for exactly its
    pages, nothing more, in this order). Each reader's requests go on where its last
    ended, so each is sequential on its own: readahead runs and pushes pages into each
    item ahead of its reader (decided by the kernel's mincore, waited for, as above).
    With one state per file, the interleaved requests never looked sequential: no push."""
    m = ckpt_factory.mount()
    head, item, piece = 100 * 1024 + 17, 6 * CHUNK + 1000, 64 * 1024
    data = os.urandom(head + 3 * item)  # a header nobody reads, then three items
    (m.mountpoint / "f.distcp").write_bytes(data)
    ckpt_factory.remount(m)  # a new kernel mount: no page of it is cached
    starts = [head + k * item for k in range(3)]
    fds = [os.open(m.mountpoint / "f.distcp", os.O_RDONLY) for _ in starts]
    views: list[CacheView] = []
    try:
        for fd in fds:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        got = [bytearray() for _ in starts]

        def read_round() -> None:
            for k, fd in enumerate(fds):
                at = starts[k] + len(got[k])
                n = min(piece, starts[k] + item - at)
                if n > 0:
                    got[k] += os.pread(fd, n, at)

        for _ in range(CHUNK // piece + 2):  # each reader crosses a chunk's end
            read_round()
        # Pages past what each reader asked for (its next page on) within its item.
        for k, fd in enumerate(fds):
            lo = -(-(starts[k] + len(got[k])) // PAGE) * PAGE
            views.append(CacheView(fd, lo, (starts[k] + item) // PAGE * PAGE))
        for k, view in enumerate(views):
            pushed_ahead = functools.partial(lambda v: len(v.resident()) * PAGE >= CHUNK // 2,
                                             view)
            wait_until(pushed_ahead, 30, f"pages pushed ahead of reader {k} in its item")
            view.hold(view.resident())
        while any(len(g) < item for g in got):
            read_round()
    finally:
        for view in views:
            view.close()
        for fd in fds:
            os.close(fd)
    for k, start in enumerate(starts):
        assert bytes(got[k]) == data[start:start + item], f"reader {k} got wrong bytes"
    done = time.time()
    wait_until(lambda: (m.state_dir / "stats.json").stat().st_mtime > done + 0.1, 10,
               "a stats snapshot after the read")
    counters = facts(m.state_dir)["counters"]
    assert counters.get("page_cache_push_errors", 0) == 0, counters
    assert counters.get("page_cache_pushed_bytes", 0) >= 3 * CHUNK // 2, counters


def test_a_look_at_an_items_end_does_not_stop_the_pushes_before_it(
    ckpt_factory: CkptFactory,
) -> None:
    """torch.load, reading a DCP item, reads its first page, then the zip directory at the
    item's end, then the item from its start. The look at the end must not stop the pushes
    of the chunks between (the reader comes back to them): with one high-water mark per
    file, those that started after the look pushed nothing, and the item's middle went
    through replies. The reader here waits after its look until pages of the middle are
    cached (mincore; POSIX_FADV_RANDOM: the kernel asks for nothing it did not read)."""
    m = ckpt_factory.mount()
    item = 24 * CHUNK + 1000
    data = os.urandom(item + 3 * CHUNK)
    (m.mountpoint / "f.distcp").write_bytes(data)
    ckpt_factory.remount(m)  # a new kernel mount: no page of it is cached
    fd = os.open(m.mountpoint / "f.distcp", os.O_RDONLY)
    view: CacheView | None = None
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        got = bytearray(os.pread(fd, PAGE, 0))  # the item's first page
        assert os.pread(fd, PAGE, item - PAGE) == data[item - PAGE:item]  # its directory
        view = CacheView(fd, 2 * CHUNK, 20 * CHUNK)  # its middle, nothing asked there
        middle = view
        wait_until(lambda: len(middle.resident()) * PAGE >= 4 * CHUNK, 30,
                   "pages pushed into the item's middle after the look at its end")
        view.hold(view.resident())
        while len(got) < item:
            got += os.pread(fd, min(MiB, item - len(got)), len(got))
    finally:
        if view is not None:
            view.close()
        os.close(fd)
    assert bytes(got) == data[:item]
