"""The daemon's health as an orchestrator sees it: ``/healthz`` on the metrics port answers
200 only while the mount serves requests (Kubernetes readiness and liveness probes,
docs/kubernetes.md).

"Serves" is proven by a round trip through the kernel: ``statvfs`` of the mount point,
which the kernel never answers from a cache, so it reaches the daemon's loop. The probe
runs in a thread of its own, one at a time: a hung mount leaves one probe thread waiting
in the kernel (never one per scrape), and every scrape meanwhile answers 503 after the
probe's deadline.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

__all__ = ["MountProbe"]


class MountProbe:
    """``check()`` starts a probe unless one is in flight, and waits for it at most
    ``timeout_s``; it returns (serving, one line saying why), the exporter's HealthCheck."""

    def __init__(self, mountpoint: Path, timeout_s: float = 5.0) -> None:
        self.mountpoint = mountpoint
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._done: threading.Event | None = None
        self._since = 0.0  # monotonic start of the probe in flight
        self._last = (False, "not probed yet")

    def check(self) -> tuple[bool, str]:
        with self._lock:
            if self._done is None or self._done.is_set():
                self._done = threading.Event()
                self._since = time.monotonic()
                threading.Thread(target=self._probe, args=(self._done,),
                                 name="ckptfs-health", daemon=True).start()
            done, since = self._done, self._since
        if not done.wait(self.timeout_s):
            waited = time.monotonic() - since
            return False, f"{self.mountpoint}: the mount has not answered statvfs for {waited:.0f} s"
        return self._last

    def _probe(self, done: threading.Event) -> None:
        try:
            os.statvfs(self.mountpoint)
            # A mount point whose device is its parent's is no longer mounted: the daemon's
            # mount was taken away under it (umount -l by hand).
            if os.stat(self.mountpoint).st_dev == os.stat(self.mountpoint.parent).st_dev:
                self._last = (False, f"{self.mountpoint} is not mounted")
            else:
                self._last = (True, f"{self.mountpoint} serves")
        except OSError as exc:
            self._last = (False, f"{self.mountpoint}: {exc.strerror or exc}")
        finally:
            done.set()
