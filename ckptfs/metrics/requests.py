"""What the FUSE adapter records per request: the time it took (``ckptfs_fuse_op_seconds{op}``,
what the application waits for in write, flush (close), fsync, release, read, ...), the
errors it answered, and the bytes applications wrote and read. Registered in the exporter's
registry; the telemetry reads ``APP`` for its rates."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import Counter, Histogram

from .exporter import REGISTRY

# From 50 µs (a cached read) to 2 minutes (a close that waits for room or the remote).
LATENCY_BUCKETS = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)

FUSE_OP_SECONDS = Histogram(
    "ckptfs_fuse_op_seconds",
    "Time the daemon took to answer a FUSE request: the pause the application sees in "
    "write, flush (every close), fsync, release, read, ...",
    ["op"], buckets=LATENCY_BUCKETS, registry=REGISTRY,
)
FUSE_OP_ERRORS = Counter(
    "ckptfs_fuse_op_errors", "FUSE requests answered with an error, by errno name",
    ["op", "errno"], registry=REGISTRY,
)


class AppBytes:
    """Bytes applications wrote and read through the mount (read: replies, and pages
    pushed into the page cache for readers, vfs/pagepush.py). Only the trio thread adds
    to them, so plain ints do; the scrape thread reads them."""

    written = 0
    read = 0


APP = AppBytes()


def op_observer(op: str) -> Callable[[float], None]:
    """The latency recorder of one FUSE operation (bound once, cheap per call)."""
    return FUSE_OP_SECONDS.labels(op=op).observe


_error_children: dict[tuple[str, str], Any] = {}


def count_op_error(op: str, errno_name: str) -> None:
    child = _error_children.get((op, errno_name))
    if child is None:
        child = _error_children[(op, errno_name)] = FUSE_OP_ERRORS.labels(op=op, errno=errno_name)
    child.inc()
