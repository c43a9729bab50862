"""The daemon's malloc settings: the write requests' freed memory is reused, not returned.

pyfuse3 hands every write request over as a fresh ``bytes``, and a chunk under
construction keeps them as its parts until the store has written it (vfs/chunkbuffer.py):
the trio thread copies none of them, and a save holds up to the memory budget's worth.
With glibc's defaults, parts freed at the top of the heap go back to the kernel (trim), and
blocks of a request's size are mapped afresh (its dynamic mmap threshold), so the next
requests' ``bytes`` land on new pages: a page fault per 4 KiB on the trio thread, inside
pyfuse3's copy (on a VM with free page reporting, a host fault too; measured: 8 to 10 times
the faults, and about 0.15 s/GB more on that thread). Kept for reuse instead, up to the
memory budget, which bounds what the parts take anyway.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger("ckptfs.daemon")

_M_TRIM_THRESHOLD = -1  # glibc's malloc.h
_M_MMAP_THRESHOLD = -3
# Blocks below this come from the heap: glibc's own ceiling for its dynamic threshold,
# which a daemon that freed a chunk-sized block had reached anyway (a FUSE request is at
# most 1 MiB). Setting it fixes it: the dynamic rule would map each request afresh again.
MMAP_THRESHOLD = 32 * 1024 * 1024
_INT_MAX = 2**31 - 1


def keep_freed(budget: int) -> bool:
    """Keep up to ``budget`` bytes of freed heap for reuse (glibc; elsewhere nothing is
    changed). True if set."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False  # not glibc: its allocator keeps its own rules
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    trim = max(min(budget, _INT_MAX), MMAP_THRESHOLD)
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, trim) == 1
    if not ok:
        log.warning("mallopt refused the heap settings: write requests may fault on new pages")
    return ok
