"""Pure helpers of scripts/bench_dcp.py (no torch, no mounts), so a unit test can load them:
the order of the targets in a pass, the median and range of a step's passes, and the rate,
CPU per GB and ceiling cells of its table."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def rotated(items: Sequence[T], n: int) -> list[T]:
    """``items`` started at position ``n`` (mod len): pass n's order, so every target goes
    first, in the middle and last equally often over len(items) passes."""
    if not items:
        return []
    k = n % len(items)
    return list(items[k:]) + list(items[:k])


def spread(values: Sequence[float]) -> tuple[float, float, float] | None:
    """(median, min, max) of a step's passes; None if it never ran."""
    if not values:
        return None
    return statistics.median(values), min(values), max(values)


def fmt_seconds(values: Sequence[float]) -> str:
    """``median s (min-max)``, or ``-``."""
    s = spread(values)
    if s is None:
        return "-"
    if len(values) == 1:
        return f"{s[0]:.2f} s"
    return f"{s[0]:.2f} s ({s[1]:.2f}-{s[2]:.2f})"


def per_gb(seconds: Sequence[float], nbytes: int) -> float | None:
    """Median CPU (or wall) seconds per GB (10^9 bytes) over the passes."""
    s = spread(seconds)
    return None if s is None or nbytes <= 0 else s[0] / (nbytes / 1e9)


def ceiling_gbps(s_per_gb: float | None) -> float | None:
    """The rate one thread that spends ``s_per_gb`` CPU seconds per GB allows, GB/s."""
    if s_per_gb is None or s_per_gb <= 0:
        return None
    return 1.0 / s_per_gb


def ratio(base_s: Sequence[float], other_s: Sequence[float]) -> float | None:
    """Throughput of ``other`` relative to ``base`` (median times): >1 means other is faster."""
    a, b = spread(base_s), spread(other_s)
    if a is None or b is None or b[0] <= 0:
        return None
    return a[0] / b[0]
