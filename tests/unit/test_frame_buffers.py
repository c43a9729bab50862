"""The receive buffers of chunk GETs and uploads (chunks/bufpool.py) are private
anonymous memory: mmap's default, a shared mapping, is shmem, whose pages cost more to
fault in."""

import ctypes
from pathlib import Path

from ckptfs.chunks.bufpool import FramePool

MiB = 1024 * 1024


def _mapping_of(address: int) -> tuple[str, dict[str, str]]:
    """The permissions and the fields of the /proc/self/smaps entry holding ``address``."""
    perms, fields, inside = "", {}, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and len(head) >= 5 and all(c in "0123456789abcdef-" for c in head[0]):
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            inside = lo <= address < hi
            if inside:
                perms = head[1]
            continue
        if inside and ":" in line:
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    return perms, fields


def test_new_buffers_are_private_anonymous_memory() -> None:
    buf = FramePool(keep=1).take(16 * MiB)
    assert buf is not None
    buf[:] = b"\x01" * len(buf)  # touched, as a GET's body fills it
    holder = ctypes.c_char.from_buffer(buf)
    address = ctypes.addressof(holder)
    del holder
    perms, fields = _mapping_of(address)
    assert perms.endswith("p"), f"shared mapping ({perms}): shmem pages"
    assert "AnonHugePages" in fields and "ShmemPmdMapped" in fields  # smaps was read
    assert int(fields["Anonymous"].split()[0]) >= 16 * 1024  # kB: private anonymous pages


def test_idle_buffers_beyond_keep_are_held_while_the_cache_has_room() -> None:
    """Several chunks leaving the read cache at once (files of several readers ending
    together) give back more buffers than ``keep``: they are held while the cache's unused
    room covers them, so the next reads reuse them instead of mapping new ones."""
    room = [64 * MiB]
    pool = FramePool(keep=1, room=lambda: room[0])
    bufs = [pool.take(16 * MiB) for _ in range(5)]
    assert pool.made == 5
    for b in bufs:
        pool.give(b)
    assert pool.idle == 4  # 4 x 16 MiB fit the room; the oldest went
    del bufs, b
    again = [pool.take(16 * MiB) for _ in range(4)]
    assert pool.made == 5 and pool.reused == 4
    room[0] = 0  # the cache is full again: back to ``keep``
    for b in again:
        pool.give(b)
    assert pool.idle == 1


def test_without_room_the_pool_keeps_keep_buffers() -> None:
    pool = FramePool(keep=2)
    bufs = [pool.take(2 * MiB) for _ in range(4)]
    for b in bufs:
        pool.give(b)
    assert pool.idle == 2
    pool.clear()
    assert pool.idle == 0
