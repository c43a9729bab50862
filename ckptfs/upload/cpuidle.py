"""Idle cores of the machine, measured from /proc/stat between two samples.

The uploader asks this while a save runs (``upload_during_save = "auto"``): on a GPU node
with dozens of idle cores, uploads may overlap the save; on a small node whose cores the
save keeps busy, they wait for it. Reading /proc/stat is a blocking read: worker thread.
"""

from __future__ import annotations

import os


def _cpu_line(path: str) -> tuple[int, int]:
    """(idle, total) jiffies of all cpus: idle counts idle + iowait."""
    with open(path) as f:
        fields = f.readline().split()
    values = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return values[3] + values[4], sum(values)


class IdleCores:
    def __init__(self, path: str = "/proc/stat", cores: int | None = None) -> None:
        self.path = path
        self.cores = cores if cores is not None else len(os.sched_getaffinity(0))
        self._last: tuple[int, int] | None = None

    def sample(self) -> float | None:
        """Blocking: idle cores since the previous sample (None at the first, or if
        /proc/stat cannot be read: the caller then keeps deferring)."""
        try:
            now = _cpu_line(self.path)
        except (OSError, ValueError, IndexError):
            return None
        last, self._last = self._last, now
        if last is None or now[1] <= last[1]:
            return None
        return self.cores * (now[0] - last[0]) / (now[1] - last[1])
