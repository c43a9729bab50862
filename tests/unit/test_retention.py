"""Retention planning (pure logic)."""

from typing import Any

import pytest

from ckptfs.checkpoints.retention import (
    Ckpt,
    RetentionPolicy,
    plan_all,
    plan_run,
)
from ckptfs.config import policies_from_config
from ckptfs.errors import ConfigError

S = 10**9


def run(steps: list[int], state: str = "committed", tags: dict[int, tuple[str, ...]] | None = None) -> list[Ckpt]:
    return [Ckpt(f"/r/step-{s}", "/r", s, state, s * S, (tags or {}).get(s, ())) for s in steps]


def test_twelve_steps_milestone_every_four() -> None:
    policy = RetentionPolicy("/r", keep_local=2, keep=3, milestone_every=4)
    p = plan_run(run(list(range(1, 13))), policy, now_ns=13 * S)
    assert p.keep_local == ["/r/step-12", "/r/step-11"]
    assert sorted(p.evict_local) == ["/r/step-10", "/r/step-4", "/r/step-8", "/r/step-9"]
    assert sorted(p.expire) == sorted(f"/r/step-{s}" for s in (1, 2, 3, 5, 6, 7))
    assert sorted(p.skip_upload) == ["/r/step-10", "/r/step-11", "/r/step-9"]
    # Nothing is both kept and expired; milestones and the newest never expire.
    assert not set(p.expire) & (set(p.keep_local) | set(p.evict_local))


def test_the_newest_never_expires_and_superseded_partials_do() -> None:
    policy = RetentionPolicy("/r", keep_local=0, keep=1, max_age_s=1)
    ckpts = [Ckpt("/r/step-0", "/r", 0, "partial", 0)] + run([1, 2]) + [
        Ckpt("/r/step-3", "/r", 3, "partial", 0)] + [Ckpt("/r/step-4", "/r", 4, "writing", 0)]
    p = plan_run(ckpts, policy, now_ns=10**6 * S)
    assert "/r/step-2" not in p.expire  # the newest committed one, however old
    # step-0 is partial and older than a committed one; step-3 is partial with no newer
    # committed checkpoint: it may be all the run has (a crash at its commit), so it stays.
    assert set(p.expire) == {"/r/step-0", "/r/step-1"}
    assert "superseded by /r/step-2" in p.why["/r/step-0"]  # the newest
    assert "kept" in p.why["/r/step-3"]
    assert "/r/step-4" not in p.expire  # still being written


def test_a_partial_checkpoint_without_steps_expires_only_after_a_later_commit() -> None:
    policy = RetentionPolicy("/r", keep_local=0, keep=5)
    part = Ckpt("/r/a", "/r", None, "partial", 0, begin_ns=100)
    assert plan_run([part, Ckpt("/r/b", "/r", None, "committed", 50)], policy, 10**9).expire == []
    assert plan_run([part, Ckpt("/r/b", "/r", None, "committed", 150)], policy,
                    10**9).expire == ["/r/a"]


def test_tagged_milestone_is_kept_and_keep_milestones_bounds_them() -> None:
    policy = RetentionPolicy("/r", keep_local=1, keep=1, milestone_every=2, keep_milestones=2)
    p = plan_run(run([1, 2, 3, 4, 5, 6, 7], tags={3: ("milestone",)}), policy, now_ns=0)
    # milestones: 6, 4, 3 (tagged), 2 -> the newest two (6, 4) are kept
    assert "/r/step-6" in p.evict_local and "/r/step-4" in p.evict_local
    assert "/r/step-3" in p.expire and "/r/step-2" in p.expire


def test_policies_apply_per_run_by_glob() -> None:
    pols = policies_from_config([{"path": "/runs/*", "keep": 1, "keep_local": 1}])
    ckpts = [Ckpt(f"/runs/a/s{i}", "/runs/a", i, "committed", i) for i in range(3)] + [
        Ckpt(f"/other/s{i}", "/other", i, "committed", i) for i in range(3)]
    plans = plan_all(ckpts, pols, 0)
    assert set(plans) == {"/runs/a"}
    assert plans["/runs/a"].expire == ["/runs/a/s1", "/runs/a/s0"]


@pytest.mark.parametrize(("table", "key"), [
    ({"path": "runs"}, "retention[0].path"),
    ({"path": "/r", "keep": 0}, "retention[0].keep"),
    ({"path": "/r", "max_age": -1}, "retention[0].max_age"),
    ({"path": "/r", "bogus": 1}, "retention[0].bogus"),
    ({"path": "/r", "skip_superseded_uploads": "yes"}, "retention[0].skip_superseded_uploads"),
])
def test_bad_retention_config_names_the_key(table: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        policies_from_config([table])
