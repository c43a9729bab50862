"""The scrubber's metrics (scrub/service.py; docs/operations.md "The scrubber"), from its
progress snapshot at scrape time: per tier, the copies and bytes checked, the bad copies
found, healed and left unhealed since the daemon started, the bytes checked per day, the
last full pass and the time since which every copy is verified; the scrubber's state and
whether this node holds the remote's lease."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

_COUNTERS = (
    ("checked_copies", "ckptfs_scrub_checked_copies", "Chunk copies the scrubber read and verified"),
    ("checked_bytes", "ckptfs_scrub_checked_bytes", "Bytes of chunk copies the scrubber verified"),
    ("bad_found", "ckptfs_scrub_bad_copies", "Bad or missing chunk copies the scrubber found"),
    ("healed", "ckptfs_scrub_healed_copies", "Bad copies the scrubber found and healed"),
    ("unhealed", "ckptfs_scrub_unhealed_copies",
     "Bad copies the scrubber found and could not heal (no valid copy, no room)"),
)
_GAUGES = (
    ("bytes_per_day", "ckptfs_scrub_bytes_per_day", "Bytes the scrubber checks per day (last day)"),
    ("last_full_pass", "ckptfs_scrub_last_full_pass_timestamp_seconds",
     "End of the last full scrub pass of the tier (NaN: none yet)"),
    ("verified_since", "ckptfs_scrub_verified_since_timestamp_seconds",
     "Every copy on the tier was verified (read or written) at or after this time (NaN: one never)"),
    ("bad_now", "ckptfs_scrub_bad_recorded_copies", "Copies on the tier recorded bad now"),
)
STATES = ("idle", "scrubbing", "paused", "disabled")


def scrub_metrics(snap: dict[str, Any]) -> Iterator[Metric]:
    if not snap:
        return
    tiers: dict[str, dict[str, Any]] = snap.get("tiers") or {}
    for key, name, doc in _COUNTERS:
        m = CounterMetricFamily(name, doc, labels=["tier"])
        for tier, t in sorted(tiers.items()):
            m.add_metric([tier], float(t.get(key) or 0))
        yield m
    for key, name, doc in _GAUGES:
        g = GaugeMetricFamily(name, doc, labels=["tier"])
        for tier, t in sorted(tiers.items()):
            v = t.get(key)
            g.add_metric([tier], math.nan if v is None else float(v))
        yield g
    state = GaugeMetricFamily("ckptfs_scrub_state", "The scrubber's state (1: the current one)",
                              labels=["state"])
    for s in STATES:
        state.add_metric([s], 1.0 if snap.get("state") == s else 0.0)
    yield state
    yield GaugeMetricFamily("ckptfs_scrub_rate_bytes_per_second", "The scrubber's rate limit",
                            value=float(snap.get("rate_bytes_s") or 0))
