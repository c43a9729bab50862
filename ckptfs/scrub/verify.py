"""One copy of a chunk read and verified (blocking: a worker thread's call)."""

from __future__ import annotations

from ..catalog.checks import ReplicaCheck
from ..codec import frame
from ..codec.seal import KeyUnavailable
from ..errors import CorruptChunk, ObjectUnreadable, TierError
from ..tiers.base import Tier

OK = "ok"
MISSING = "missing"
CORRUPT = "corrupt"
UNREADABLE = "unreadable"
ERROR = "error"  # the tier failed, not this copy: checked again later
SKIPPED = "skipped"  # cannot be judged here (its namespace key is not loaded)
DAMAGE = (MISSING, CORRUPT, UNREADABLE)


def check_copy(tier: Tier, row: ReplicaCheck) -> tuple[str, str]:
    """Read the copy of ``row`` on ``tier`` and verify it against its digest and length:
    the verdict (OK, MISSING, CORRUPT, UNREADABLE, ERROR, SKIPPED) and why."""
    key = row.digest.hex()
    try:
        raw = tier.get(key)
    except ObjectUnreadable as exc:
        return UNREADABLE, str(exc)
    except TierError as exc:
        return ERROR, str(exc)
    if raw is None:
        return MISSING, "missing"
    try:
        data = frame.decode_view(raw, row.digest)
    except KeyUnavailable as exc:
        return SKIPPED, str(exc)
    except CorruptChunk as exc:
        return CORRUPT, str(exc)
    if len(data) != row.length:
        return CORRUPT, f"length {len(data)} != {row.length}"
    return OK, ""
