"""The daemon's heap settings (daemon/heap.py): write requests' bytes, held as a chunk's
parts and freed together, are reused by the next requests instead of faulting in new
pages. Run in a child process: the settings are the whole process's."""

import subprocess
import sys

import pytest

_CHILD = r"""
import resource, sys
from ckptfs.daemon import heap
if sys.argv[1] == "keep":
    assert heap.keep_freed(256 * 1024 * 1024)
MiB = 1024 * 1024

def chunk():
    # 32 requests of 1 MiB, each touched as pyfuse3's copy touches it, held, then freed.
    parts = [b"x" * MiB for _ in range(32)]
    del parts

chunk()
chunk()  # the heap has settled (dynamic thresholds)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    chunk()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""

PAGES = 4 * 32 * 256  # the 4 KiB pages the four chunks' parts cover


def faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _CHILD, mode], capture_output=True,
                         text=True, check=True)
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_request_memory_is_reused_without_faults() -> None:
    assert faults("keep") < PAGES // 10
