#!/usr/bin/env python3
"""firsttouch: what the first write to new memory costs on this VM, after drop_caches.

The benchmark VM reports free memory back to its host (virtio-balloon free page reporting,
/sys/module/page_reporting, order 9). Memory freed by ``drop_caches`` is handed back within
seconds; the next first touch of it faults in the host, and that time is charged to the
guest thread that touched it. A FUSE daemon's reply copy is such a first touch of the
reader's new page-cache pages; a plain directory's read is not (the host's disk emulation
writes those pages). Prints CPU seconds per GiB: first touch, rewrite. Needs root.

    python scripts/firsttouch.py
"""

from __future__ import annotations

import ctypes
import mmap
import os
import resource
import time

GiB = 1 << 30
libc = ctypes.CDLL(None)


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def touch(n: int) -> tuple[float, float]:
    """CPU seconds of memset over a new private mapping of ``n`` bytes: first, again."""
    m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE)
    holder = ctypes.c_char.from_buffer(m)
    addr = ctypes.c_void_p(ctypes.addressof(holder))
    c0 = cpu()
    libc.memset(addr, 1, ctypes.c_size_t(n))
    c1 = cpu()
    libc.memset(addr, 2, ctypes.c_size_t(n))
    c2 = cpu()
    del holder
    m.close()
    return round(c1 - c0, 3), round(c2 - c1, 3)


def main() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")
    time.sleep(5)
    print("after drop_caches + 5 s (first touch, rewrite):", touch(GiB))
    print("at once:", touch(GiB))
    print("at once:", touch(GiB))
    time.sleep(5)
    print("after 5 s idle:", touch(GiB))


if __name__ == "__main__":
    main()
