"""scripts/dcpstats.py, the arithmetic of scripts/bench_dcp.py's table: the targets' order per
pass, median and range, rates, CPU per GB and the ceiling a thread's CPU per GB implies."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from tests.support.scripts import load_script

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def dcpstats() -> ModuleType:
    return load_script("dcpstats")


def test_every_target_takes_every_place_once_over_as_many_passes() -> None:
    m = dcpstats()
    targets = ["plain", "ckptfs", "nullfs"]
    orders = [m.rotated(targets, n) for n in range(1, 4)]
    assert orders == [["ckptfs", "nullfs", "plain"], ["nullfs", "plain", "ckptfs"],
                      ["plain", "ckptfs", "nullfs"]]
    for place in range(3):  # each position held by each target exactly once
        assert sorted(o[place] for o in orders) == sorted(targets)
    assert m.rotated([], 5) == []


def test_median_range_and_cells() -> None:
    m = dcpstats()
    assert m.spread([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0)
    assert m.spread([]) is None
    assert m.fmt_seconds([3.0, 1.0, 2.0]) == "2.00 s (1.00-3.00)"
    assert m.fmt_seconds([1.5]) == "1.50 s"
    assert m.fmt_seconds([]) == "-"


def test_per_gb_ceiling_and_ratio() -> None:
    m = dcpstats()
    two_gb = 2_000_000_000
    assert m.per_gb([1.0, 1.6, 2.0], two_gb) == 0.8  # the median, per 10^9 bytes
    assert m.per_gb([], two_gb) is None
    assert m.ceiling_gbps(0.8) == 1.25
    assert m.ceiling_gbps(0.0) is None and m.ceiling_gbps(None) is None
    # ratio = base time / other time: the other twice as fast is 2.0x
    assert m.ratio([4.0, 5.0, 6.0], [2.0, 2.5, 3.0]) == 2.0
    assert m.ratio([], [1.0]) is None
