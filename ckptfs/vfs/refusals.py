"""Refused access, for the audit log (docs/governance.md "Refused access").

Each refusal of the namespace rules (vfs/access.py: EACCES at a lookup, open, create,
remove, rename, link, setattr or xattr call into a namespace the caller does not own) is
counted in memory, no I/O on the request path, under (uid, namespace, operation). The first
refusal of such a key opens a window of ``window_s``; at its end one ``access_refused``
record with the count is noted for the audit log (written with the next batch of noted
records, catalog/audit.py) and one WARNING line is logged. So a stranger's scan of a
namespace costs one record per operation and window, never one per attempt. Windows still
open at an unmount are closed then (``close``); a daemon killed loses them, as it loses
the noted opens.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import trio

from ..catalog.audit import AuditRecord
from ..catalog.protocols import AuditCatalog
from ..wakeup import Wakeup

log = logging.getLogger("ckptfs.access")

DEFAULT_WINDOW_S = 60.0
OPEN_MAX = 4096  # windows open at once; beyond, the oldest is closed early (memory bound)
PIDS_MAX = 8  # distinct pids named in a record


@dataclass
class _Window:
    ends: float  # trio clock
    first_ns: int
    last_ns: int
    count: int
    pids: list[int]


class Refusals:
    """The open windows of refused access, and the task that closes them."""

    def __init__(self, catalog: AuditCatalog | None, window_s: float = DEFAULT_WINDOW_S) -> None:
        self.catalog = catalog
        self.window_s = window_s
        self._open: dict[tuple[int, str, str], _Window] = {}
        self._wake = Wakeup()
        self.recorded = 0  # records noted (tests, status)

    def note(self, uid: int, pid: int, namespace: str, op: str) -> None:
        """One refusal (trio thread, never blocks)."""
        now_ns = time.time_ns()
        key = (uid, namespace, op)
        w = self._open.get(key)
        if w is None:
            if len(self._open) >= OPEN_MAX:
                self._close(next(iter(self._open)))
            w = self._open[key] = _Window(trio.current_time() + self.window_s, now_ns, now_ns,
                                          0, [])
            self._wake.set()
        w.count += 1
        w.last_ns = now_ns
        if pid not in w.pids and len(w.pids) < PIDS_MAX:
            w.pids.append(pid)

    def pending(self) -> int:
        """Refusals counted in windows not closed yet."""
        return sum(w.count for w in self._open.values())

    def _close(self, key: tuple[int, str, str]) -> None:
        w = self._open.pop(key)
        uid, namespace, op = key
        log.warning("access refused: uid %d, %s in namespace %s, %d time(s) in %.1f s "
                    "(pids %s)", uid, op, namespace, w.count, (w.last_ns - w.first_ns) / 1e9,
                    ", ".join(map(str, w.pids)))
        if self.catalog is not None:
            self.catalog.audit_note(AuditRecord(
                "access_refused", namespace, uid, w.pids[0], time_ns=w.first_ns,
                detail={"op": op, "namespace": namespace, "count": w.count,
                        "first_ns": w.first_ns, "last_ns": w.last_ns,
                        "window_s": self.window_s, "pids": list(w.pids)}))
        self.recorded += 1

    def close(self) -> int:
        """Close every open window now (an unmount); how many records."""
        keys = list(self._open)
        for key in keys:
            self._close(key)
        return len(keys)

    async def run(self) -> None:
        """Close each window at its end."""
        while True:
            if not self._open:
                self._wake.clear()
                await self._wake.wait()
                continue
            ends = min(w.ends for w in self._open.values())
            await trio.sleep_until(ends)
            now = trio.current_time()
            for key in [k for k, w in self._open.items() if w.ends <= now]:
                self._close(key)
