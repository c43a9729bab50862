"""Live statistics of a running daemon: per-tier read speed and health, integrity counters.

Worker threads update them (under one lock); the daemon writes a JSON snapshot to
``STATE_DIR/stats.json`` about once a second, which ``ckptfs status`` reads. The read path
orders tiers by the expected time of a read from these moving averages, so "fastest"
follows what the devices really do, not only their kind or config order.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .statedir import write_private

EWMA = 0.2  # weight of the newest observation
REMOTE_PENALTY = 3.0
BIG_READ = 1 << 20  # reads at least this large measure throughput; smaller ones, latency
# Starting guesses until a tier has been measured: a local device, an object store.
PRIOR = {"local": (0.0002, 1 / 2e9), "remote": (0.03, 1 / 3e8)}


@dataclass
class TierStats:
    name: str
    kind: str
    latency_s: float
    s_per_byte: float
    reads: int = 0
    read_bytes: int = 0
    writes: int = 0  # chunks stored on this tier (new chunks, heals, copy-backs, uploads)
    write_bytes: int = 0  # their payload bytes (before framing and compression)
    errors: int = 0
    degraded: str | None = None  # why the tier is avoided (an I/O error, a missing dir)
    degraded_since: float | None = None
    # The uploader's view of a remote tier: its last upload failed (and how), the retry.
    upload_error: str | None = None
    upload_error_state: str | None = None  # tiers/health.py state_of() the error
    upload_error_at: float | None = None
    upload_backoff_s: float | None = None
    upload_retry_at: float | None = None  # wall clock of that job's next attempt

    def expected_s(self, nbytes: int) -> float:
        return self.latency_s + nbytes * self.s_per_byte

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "kind": self.kind, "reads": self.reads,
            "read_bytes": self.read_bytes, "writes": self.writes,
            "write_bytes": self.write_bytes, "errors": self.errors,
            "latency_ms": round(self.latency_s * 1e3, 3),
            "read_mb_s": round(1 / self.s_per_byte / 1e6, 1) if self.s_per_byte > 0 else None,
            "state": "degraded" if self.degraded else "healthy",
            "degraded_reason": self.degraded,
            "upload_error": self.upload_error, "upload_error_state": self.upload_error_state,
            "upload_error_at": self.upload_error_at, "upload_backoff_s": self.upload_backoff_s,
            "upload_retry_at": self.upload_retry_at,
        }


# A service or task that failed unexpectedly (ckptfs/supervise.py) reads as degraded this
# long after its last error; its count stays.
SERVICE_DEGRADED_S = 300.0


@dataclass
class ServiceFaults:
    """The unexpected errors of one background service or task (ckptfs/supervise.py)."""

    name: str
    errors: int = 0
    last_error: str = ""
    last_error_at: float = 0.0  # wall clock

    def as_dict(self, now: float) -> dict[str, Any]:
        degraded = now - self.last_error_at < SERVICE_DEGRADED_S
        return {"name": self.name, "state": "degraded" if degraded else "recovered",
                "errors": self.errors, "last_error": self.last_error,
                "last_error_at": self.last_error_at}


@dataclass
class Stats:
    tiers: dict[str, TierStats] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    services: dict[str, ServiceFaults] = field(default_factory=dict)
    # Facts the daemon gathers once a second (Telemetry, ckptfs/metrics/telemetry.py):
    # merged into the snapshot, top level and per tier (capacity), for `ckptfs status`.
    extra: dict[str, Any] = field(default_factory=dict)
    tier_extra: dict[str, dict[str, Any]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_tier(self, name: str, kind: str) -> None:
        lat, spb = PRIOR["local" if kind == "local" else "remote"]
        self.tiers[name] = TierStats(name, kind, lat, spb)

    def service_failed(self, name: str, why: str) -> None:
        """Service or task ``name`` met an unexpected error (contained, retried)."""
        with self._lock:
            f = self.services.setdefault(name, ServiceFaults(name))
            f.errors += 1
            f.last_error = why[:300]
            f.last_error_at = time.time()

    def service_states(self, now: float | None = None) -> list[dict[str, Any]]:
        """Each service that met an unexpected error: degraded or recovered, its count."""
        at = time.time() if now is None else now
        with self._lock:
            return [f.as_dict(at) for _, f in sorted(self.services.items())]

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counters[name] = self.counters.get(name, 0) + n

    def get(self, name: str) -> int:
        return self.counters.get(name, 0)

    def record_read(self, tier: str, nbytes: int, seconds: float) -> None:
        t = self.tiers.get(tier)
        if t is None:
            return
        with self._lock:
            t.reads += 1
            t.read_bytes += nbytes
            if nbytes >= BIG_READ:
                spb = max(seconds - t.latency_s, seconds / 2) / nbytes
                t.s_per_byte += EWMA * (spb - t.s_per_byte)
            else:
                t.latency_s += EWMA * (seconds - t.latency_s)

    def record_write(self, tier: str, nbytes: int) -> None:
        t = self.tiers.get(tier)
        if t is None:
            return
        with self._lock:
            t.writes += 1
            t.write_bytes += nbytes

    def record_error(self, tier: str, why: str) -> None:
        t = self.tiers.get(tier)
        if t is None:
            return
        with self._lock:
            t.errors += 1
            if t.degraded is None:
                t.degraded_since = time.time()
            t.degraded = why[:300]

    def record_ok(self, tier: str) -> None:
        t = self.tiers.get(tier)
        if t is not None and t.degraded is not None:
            with self._lock:
                t.degraded = None
                t.degraded_since = None

    def record_upload_failure(self, tier: str, why: str, state: str, backoff_s: float) -> None:
        t = self.tiers.get(tier)
        if t is None:
            return
        now = time.time()
        with self._lock:
            t.upload_error, t.upload_error_state, t.upload_error_at = why[:500], state, now
            t.upload_backoff_s, t.upload_retry_at = backoff_s, now + backoff_s

    def record_upload_ok(self, tier: str) -> None:
        t = self.tiers.get(tier)
        if t is not None and t.upload_error is not None:
            with self._lock:
                t.upload_error = t.upload_error_state = None
                t.upload_backoff_s = t.upload_retry_at = None

    def is_degraded(self, tier: str) -> bool:
        t = self.tiers.get(tier)
        return t is not None and t.degraded is not None

    def read_order(self, names: list[str], nbytes: int) -> list[str]:
        """The tiers to try for a read of ``nbytes``: healthy before degraded, then by the
        expected time from their measured latency and throughput."""
        def key(n: str) -> tuple[bool, float]:
            t = self.tiers.get(n)
            if t is None:
                return (True, float("inf"))
            expected = t.expected_s(nbytes)
            if t.kind != "local":
                # A remote must be clearly faster to beat a healthy local copy: a local
                # device measured under load should not send reads over the network.
                expected *= REMOTE_PENALTY
            return (t.degraded is not None, expected)
        return sorted(names, key=key)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            tiers = [{**t.as_dict(), **self.tier_extra.get(t.name, {})}
                     for t in self.tiers.values()]
            counters = dict(sorted(self.counters.items()))
        now = time.time()
        services = self.service_states(now)
        order = self.read_order(list(self.tiers), 16 << 20)
        return {**self.extra, "time": now, "pid": os.getpid(), "tiers": tiers,
                "read_order_16mib": order, "counters": counters, "services": services}

    def write(self, path: Path) -> None:
        """Blocking: replace ``path`` with the current snapshot (atomically)."""
        write_private(path, json.dumps(self.snapshot(), indent=1) + "\n")


STATS_FILE = "stats.json"  # in the state dir


def read_stats(state_dir: Path) -> dict[str, Any] | None:
    """The last snapshot a daemon wrote for this state dir (None if there is none)."""
    try:
        return dict(json.loads((state_dir / STATS_FILE).read_text()))
    except (FileNotFoundError, ValueError):
        return None
