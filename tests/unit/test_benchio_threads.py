"""scripts/benchio.py's per-thread CPU: the snapshot of /proc/PID/task and the step between two
snapshots that bench.py reports as the daemon's busiest thread (and the ceiling it implies)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from types import ModuleType

from tests.support.scripts import load_script

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
BURN_S = 0.3  # CPU seconds the burner uses: 30 clock ticks at 100 Hz, far above the others
NAME = "bench-burner"  # its comm (at most 15 bytes)


def benchio() -> ModuleType:
    return load_script("benchio")


def test_the_thread_that_burns_cpu_is_the_busiest() -> None:
    """A thread started during the step (so it counts from 0) that uses BURN_S of CPU, by
    its own clock, while this thread waits on an Event: it is the busiest, by tid and name."""
    bio = benchio()
    burned, stop = threading.Event(), threading.Event()
    tid: list[int] = []

    def burn() -> None:
        me = threading.get_native_id()
        with open(f"/proc/self/task/{me}/comm", "w") as f:  # the name the kernel reports
            f.write(NAME)
        tid.append(me)
        start = time.thread_time()
        n = 0
        while time.thread_time() - start < BURN_S:
            n += 1
        burned.set()
        stop.wait(60)  # stays alive: a thread that ended is not in the second snapshot

    before = bio.thread_cpu_seconds(os.getpid())
    t = threading.Thread(target=burn, daemon=True)
    t.start()
    try:
        assert burned.wait(60)
        after = bio.thread_cpu_seconds(os.getpid())
    finally:
        stop.set()
        t.join(60)
    assert before is not None and after is not None
    assert tid[0] not in before and after[tid[0]][0] == NAME
    step = bio.busiest_thread(before, after)
    assert step is not None
    assert (step.busiest_tid, step.busiest_name) == (tid[0], NAME)
    assert 0 < step.busiest_s <= step.total


def test_step_between_snapshots() -> None:
    """New threads count from 0, ended threads are lost, and a missing snapshot is None."""
    bio = benchio()
    before = {1: ("main", 10.0), 2: ("worker", 5.0), 3: ("gone", 7.0)}
    after = {1: ("main", 10.5), 2: ("worker", 5.25), 4: ("new", 0.75)}
    step = bio.busiest_thread(before, after)
    assert step == bio.ThreadStep(total=1.5, busiest_tid=4, busiest_name="new", busiest_s=0.75)
    assert bio.busiest_thread(None, after) is None
    assert bio.busiest_thread(before, None) is None
    assert bio.thread_cpu_seconds(None) is None


def test_snapshot_of_this_process() -> None:
    """Every thread of this process is listed, by its tid, with a name and CPU seconds that
    do not go backwards."""
    bio = benchio()
    first = bio.thread_cpu_seconds(os.getpid())
    second = bio.thread_cpu_seconds(os.getpid())
    assert first is not None and second is not None
    me = threading.get_native_id()
    assert me in first and me in second
    assert second[me][1] >= first[me][1] >= 0
    assert all(isinstance(name, str) and name for name, _ in second.values())
