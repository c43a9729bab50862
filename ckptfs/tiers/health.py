"""What a remote tier's last calls said about it, for `ckptfs status` and the metrics.

``S3Tier`` records every call that reached botocore: an answer (success, a miss, a lost
conditional write, one unreadable object) resets the failure streak; a failure of the tier
(unreachable, access denied, 5xx, ...) extends it. The state names what the last failure
was while the streak lasts.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ..errors import AccessDenied, EndpointUnreachable, PermanentTierError, TierError

HEALTHY = "healthy"
UNREACHABLE = "unreachable"
ACCESS_DENIED = "access denied"
REFUSED = "refused"  # a permanent refusal other than access (no such bucket, ...)
FAILING = "failing"  # transient errors of an endpoint that answers (5xx, throttling)


def state_of(exc: TierError) -> str:
    if isinstance(exc, EndpointUnreachable):
        return UNREACHABLE
    if isinstance(exc, AccessDenied):
        return ACCESS_DENIED
    if isinstance(exc, PermanentTierError):
        return REFUSED
    return FAILING


class Health:
    """Thread-safe: worker threads record, the stats loop reads ``snapshot``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.failures = 0  # consecutive failed calls (since the last answer)
        self.state = HEALTHY
        self.last_error: str | None = None
        self.last_error_at: float | None = None  # wall clock
        self.last_ok_at: float | None = None

    def ok(self) -> None:
        with self._lock:
            self.failures = 0
            self.state = HEALTHY
            self.last_ok_at = time.time()

    def failed(self, exc: TierError) -> None:
        with self._lock:
            self.failures += 1
            self.state = state_of(exc)
            self.last_error = str(exc)[:500]
            self.last_error_at = time.time()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"state": self.state, "consecutive_failures": self.failures,
                    "last_error": self.last_error, "last_error_at": self.last_error_at,
                    "last_ok_at": self.last_ok_at}
