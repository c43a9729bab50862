"""scripts/benchio.py, through a real mount: what bench.py's (c'') save by forked processes
relies on to measure a fair save.

A forked writer's buffer is shared copy-on-write with its parent, and the kernel copies a
shared anonymous page before it pins it for a direct-I/O write (ckptfs's write-only
handles are FOPEN_DIRECT_IO): a minor fault and a page copy per 4 KiB written. A rank's
tensors are its own memory, so ``own_pages`` makes the pages the writer's before the clock.
Until 2026-12-04 it assigned each MiB onto itself, a memmove onto the same address that
glibc returns from without storing, so the pages stayed shared and (c'') measured the
copies (docs/performance-history.md, "The 4-process save (session 28)").
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.mountutil import Mount
from tests.support.scripts import load_script

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
MiB = 1 << 20
PAGES = 4 * MiB // os.sysconf("SC_PAGE_SIZE")


def benchio() -> ModuleType:
    return load_script("benchio")


def minor_faults() -> int:
    with open("/proc/self/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[7])


def faults_of_forked_write(path: Path, view: memoryview, own: bool) -> int:
    """Minor faults of a forked child while it writes ``view`` to ``path`` (after
    ``own_pages`` if ``own``)."""
    bio = benchio()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, never return into pytest
        code = 1
        try:
            os.close(r)
            if own:
                bio.own_pages(view)
            before = minor_faults()
            bio.write_from(path, view)
            os.write(w, str(minor_faults() - before).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        got = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the writer process failed"
    return int(got)


def test_a_forked_writer_owns_its_pages_and_its_direct_io_writes_fault_no_more(
    ckpt: Mount,
) -> None:
    bio = benchio()
    src = bio.Source(bio.Pattern(8 * MiB), 7, 4 * MiB)
    shared = faults_of_forked_write(ckpt.mountpoint / "shared.bin", src.view, own=False)
    owned = faults_of_forked_write(ckpt.mountpoint / "owned.bin", src.view, own=True)
    # Shared: every page pinned is copied first (one fault each). Owned: the interpreter's
    # own few (objects it touches on shared heap pages).
    assert shared >= PAGES, shared
    assert owned < PAGES // 8, owned
    for name in ("shared.bin", "owned.bin"):
        assert (ckpt.mountpoint / name).read_bytes() == bytes(src.buf)


def test_own_pages_keeps_the_bytes() -> None:
    bio = benchio()
    buf = bytearray(os.urandom(3 * MiB + 123))
    want = bytes(buf)
    bio.own_pages(memoryview(buf)[5:])
    assert buf == want


def test_run_forked_reports_a_failed_job_and_waits_for_every_process() -> None:
    bio = benchio()

    def ok() -> None:
        pass

    def fails() -> None:
        raise ValueError("job 1 failed")

    assert bio.run_forked([ok, ok]) > 0
    with pytest.raises(bio.BenchError, match="job 1 failed"):
        bio.run_forked([ok, fails, ok], timeout=60)
