"""What the scrubber has done, for `ckptfs status` and /metrics: counters per tier since
the daemon started, the bytes checked over the last day, each tier's progress as the
catalog has it (copies, the oldest check, the last full pass), the state and the lease.
``snapshot`` is a dict replaced whole: the telemetry and the metrics scrape read it without
a lock."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from ..catalog.checks import TierProgress

DAY_S = 86400.0

IDLE, SCRUBBING, PAUSED, DISABLED = "idle", "scrubbing", "paused", "disabled"


@dataclass
class TierCounts:
    """One tier's counts since the daemon started."""

    copies: int = 0
    bytes: int = 0
    bad: int = 0
    healed: int = 0
    unhealed: int = 0
    # Bytes checked per minute over the last day: (minute start, bytes), at most 1440.
    day: deque[tuple[float, int]] = field(default_factory=deque)

    def checked(self, n: int, now: float) -> None:
        self.copies += 1
        self.bytes += n
        minute = now - now % 60
        if self.day and self.day[-1][0] == minute:
            self.day[-1] = (minute, self.day[-1][1] + n)
        else:
            self.day.append((minute, n))
        while self.day and now - self.day[0][0] > DAY_S:
            self.day.popleft()

    def bytes_per_day(self, now: float, started: float) -> int:
        """Bytes checked over the last day; over a shorter uptime, that rate per day."""
        span = min(DAY_S, max(now - started, 60.0))
        got = sum(n for t, n in self.day if now - t <= DAY_S)
        return int(got * DAY_S / span)


@dataclass
class PassReport:
    """One pass's account (``ckptfs scrub`` prints it)."""

    started: float
    finished: float | None = None
    copies: int = 0
    bytes: int = 0
    bad: int = 0
    healed: int = 0
    unhealed: int = 0
    tiers: list[str] = field(default_factory=list)
    skipped_tiers: list[str] = field(default_factory=list)  # failing: not checked
    remote: str = ""  # the node that scrubs the remotes ("": no remote)
    remote_here: bool = False  # this node (else the remotes were left to ``remote``)

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


class Progress:
    """The scrubber's counters and the snapshot built from them."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.started = time.time()
        self.state = IDLE
        self.lease_holder: str | None = None
        self.tiers: dict[str, TierCounts] = {}
        self.catalog: dict[str, TierProgress] = {}
        self.passes: dict[str, int] = {}
        self.current: PassReport | None = None
        self.last: PassReport | None = None
        self.snapshot: dict[str, Any] = {}
        self.publish()

    def of(self, tier: str) -> TierCounts:
        return self.tiers.setdefault(tier, TierCounts())

    def checked(self, tier: str, n: int) -> None:
        self.of(tier).checked(n, time.time())
        if self.current is not None:
            self.current.copies += 1
            self.current.bytes += n

    def found_bad(self, tier: str, healed: bool) -> None:
        c = self.of(tier)
        c.bad += 1
        if healed:
            c.healed += 1
        else:
            c.unhealed += 1
        if self.current is not None:
            self.current.bad += 1
            self.current.healed += healed
            self.current.unhealed += not healed

    def publish(self) -> None:
        """Rebuild the snapshot (replaced whole)."""
        now = time.time()
        names = sorted(set(self.tiers) | set(self.catalog))
        self.snapshot = {
            "state": self.state,
            "rate_bytes_s": self.rate,
            "remote_lease": self.lease_holder,
            "pass": None if self.current is None else self.current.as_dict(),
            "last_pass": None if self.last is None else self.last.as_dict(),
            "tiers": {name: self._tier(name, now) for name in names},
        }

    def _tier(self, name: str, now: float) -> dict[str, Any]:
        c = self.tiers.get(name, TierCounts())
        p = self.catalog.get(name)
        full = self.passes.get(name)
        return {
            "copies": None if p is None else p.copies,
            "bytes": None if p is None else p.bytes,
            "bad_now": None if p is None else p.bad,
            # Every copy was verified (read, or written) at or after this time.
            "verified_since": None if p is None or not p.oldest_checked_ns
            else p.oldest_checked_ns / 1e9,
            "last_full_pass": None if full is None else full / 1e9,
            "checked_copies": c.copies, "checked_bytes": c.bytes,
            "bytes_per_day": c.bytes_per_day(now, self.started),
            "bad_found": c.bad, "healed": c.healed, "unhealed": c.unhealed,
        }
