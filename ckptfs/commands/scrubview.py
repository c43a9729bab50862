"""The scrubber's lines of `ckptfs status` (from the daemon's live statistics; docs/
operations.md "The scrubber")."""

from __future__ import annotations

import time
from typing import Any


def _when(ts: float | None, now: float) -> str:
    if ts is None:
        return "never"
    age = max(0.0, now - ts)
    for unit, secs in (("d", 86400), ("h", 3600), ("min", 60)):
        if age >= secs:
            return f"{age / secs:.1f} {unit} ago"
    return f"{age:.0f} s ago"


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def scrub_lines(s: dict[str, Any] | None, now: float | None = None) -> list[str]:
    """``scrub: STATE, rate``, the lease, then a line per tier: the last full pass, every
    copy verified since, bytes checked per day, bad copies found and healed."""
    if not s:
        return []
    at = time.time() if now is None else now
    head = f"scrub: {s.get('state')}, at most {_size(float(s.get('rate_bytes_s') or 0))}/s"
    if s.get("remote_lease"):
        head += f"; remote scrubbed by node {s['remote_lease']} (lease)"
    cur = s.get("pass")
    if cur:
        head += f"; pass running: {cur.get('copies', 0)} copies checked"
    lines = [head]
    for name, t in sorted((s.get("tiers") or {}).items()):
        lines.append(
            f"  scrub {name}: last full pass {_when(t.get('last_full_pass'), at)}, "
            f"all copies verified since {_when(t.get('verified_since'), at)}, "
            f"{_size(float(t.get('bytes_per_day') or 0))}/day, "
            f"bad found {t.get('bad_found', 0)}, healed {t.get('healed', 0)}, "
            f"not healed {t.get('unhealed', 0)}, recorded bad now {t.get('bad_now') or 0}")
    return lines
