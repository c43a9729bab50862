"""Restore drills in ``/metrics`` (ckptfs/drill/; docs/operations.md "Restore drills"):
per run, the time of the last drill that passed, the last drill's duration, rate and the
restore time it implies for the whole checkpoint, whether it failed (the gauge an alert
fires on: ``ckptfs_drill_last_failed == 1``), and the drills by result. Registered in the
exporter's registry; the daemon's DrillService reports each drill (``observe``), and the
newest of each run in the catalog at mount (``seed``)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, Gauge

from ..catalog.drills import DrillRow
from ..names import readable
from .exporter import REGISTRY

DRILL_LAST_SUCCESS = Gauge(
    "ckptfs_drill_last_success_timestamp_seconds",
    "End of the last restore drill of the run that passed (Unix time)", ["run"],
    registry=REGISTRY,
)
DRILL_LAST_DURATION = Gauge(
    "ckptfs_drill_last_duration_seconds",
    "Duration of the last restore drill of the run (waits for saves left out)", ["run"],
    registry=REGISTRY,
)
DRILL_LAST_RATE = Gauge(
    "ckptfs_drill_last_bytes_per_second",
    "Rate of the last restore drill of the run, from the remote tier", ["run"],
    registry=REGISTRY,
)
DRILL_IMPLIED_RESTORE = Gauge(
    "ckptfs_drill_implied_restore_seconds",
    "Restore time of the whole checkpoint at the last drill's rate", ["run"],
    registry=REGISTRY,
)
DRILL_LAST_FAILED = Gauge(
    "ckptfs_drill_last_failed",
    "1 if the last restore drill of the run failed (alert on it), else 0", ["run"],
    registry=REGISTRY,
)
DRILLS = Counter(
    "ckptfs_drills", "Restore drills run by this daemon, by result", ["run", "result"],
    registry=REGISTRY,
)
DRILL_FAILURES = Counter(
    "ckptfs_drill_failures", "Restore drills of the run that failed (this daemon)", ["run"],
    registry=REGISTRY,
)


def _gauges(row: DrillRow) -> None:
    run = readable(row.run)
    end_s = (row.started_ns + row.duration_ns) / 1e9
    if row.passed:
        DRILL_LAST_SUCCESS.labels(run).set(end_s)
    DRILL_LAST_DURATION.labels(run).set(row.duration_ns / 1e9)
    DRILL_LAST_RATE.labels(run).set(row.mb_per_s * 1e6)
    if row.implied_s is not None:
        DRILL_IMPLIED_RESTORE.labels(run).set(row.implied_s)
    DRILL_LAST_FAILED.labels(run).set(0 if row.passed else 1)


class DrillMetrics:
    """The DrillService's sink (drill/service.py DrillSink): these metrics."""

    @staticmethod
    def observe(row: DrillRow) -> None:
        """A drill just ran (the trio thread; prometheus_client's metrics are thread-safe)."""
        _gauges(row)
        run = readable(row.run)
        DRILLS.labels(run, row.result).inc()
        # The failures' series exists from the first drill on (an alert's rate needs it).
        DRILL_FAILURES.labels(run).inc(0 if row.passed else 1)

    @staticmethod
    def seed(last: Iterable[DrillRow], last_passed: Iterable[DrillRow]) -> None:
        """At mount: each run's newest drill, and its newest that passed, from the catalog."""
        for row in last:
            _gauges(row)
            DRILL_FAILURES.labels(readable(row.run)).inc(0)
        for row in last_passed:
            DRILL_LAST_SUCCESS.labels(readable(row.run)).set(
                (row.started_ns + row.duration_ns) / 1e9)
