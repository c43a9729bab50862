"""Retention across tiers, as pure logic: which checkpoints of a run stay local, which are
kept on the remote only, which expire, whose uploads may be skipped.

Per run (the directory holding the checkpoints), under the policy whose glob matches it:

* The newest ``keep_local`` committed checkpoints stay on the local tiers (rapid recovery);
  older ones may leave the local tiers once the remote holds them (``evict_local``).
* Milestones (tagged ``milestone``, or a step that is a multiple of ``milestone_every``) are
  kept on the remote; with ``keep_milestones`` > 0 only that many, newest first.
* Other committed checkpoints beyond the newest ``keep``, or older than ``max_age_s``,
  expire (deleted everywhere). The newest committed checkpoint never expires.
* Partial checkpoints expire once a newer checkpoint of the run is committed; ones still
  being written are left alone. A partial checkpoint with no newer committed one stays:
  it may be all a run has (docs/semantics.md, "The commit protocol").
* With ``skip_superseded_uploads``, a committed non-milestone checkpoint that a newer one
  superseded has its pending uploads dropped (the backlog cannot grow without bound).

The daemon applies a plan with the safety rules (retention_apply in the filesystem): never
delete the only valid copy of a kept checkpoint, never evict data not yet uploaded, never
delete a checkpoint that is open.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..catalog.rows import CheckpointRow, CheckpointState
from ..config.model import RetentionPolicy

MILESTONE_TAG = "milestone"


@dataclass(frozen=True)
class Ckpt:
    root: str
    run: str
    step: int | None
    state: str  # a CheckpointState value (StrEnum: members compare equal to it)
    commit_ns: int
    tags: tuple[str, ...] = ()
    begin_ns: int = 0


@dataclass
class Plan:
    keep_local: list[str] = field(default_factory=list)
    evict_local: list[str] = field(default_factory=list)
    expire: list[str] = field(default_factory=list)
    skip_upload: list[str] = field(default_factory=list)
    why: dict[str, str] = field(default_factory=dict)


def is_milestone(c: Ckpt, policy: RetentionPolicy) -> bool:
    if MILESTONE_TAG in c.tags:
        return True
    return bool(policy.milestone_every and c.step is not None and c.step % policy.milestone_every == 0)


def run_of(root: str) -> str:
    parent = root.rstrip("/").rsplit("/", 1)[0]
    return parent or "/"


def to_ckpts(rows: list[CheckpointRow]) -> list[Ckpt]:
    """Catalog checkpoint rows as retention plans them."""
    return [Ckpt(r.root, run_of(r.root), r.step, r.state, r.commit_ns or 0,
                 tuple(sorted(r.tag_set)), r.begin_ns or 0) for r in rows]


def newer(c: Ckpt, than: Ckpt) -> bool:
    """``c`` is a later checkpoint of the run than ``than``: a higher step where both have
    one, else committed after ``than`` began."""
    if c.step is not None and than.step is not None:
        return c.step > than.step
    return c.commit_ns > than.begin_ns


def under(path: str, scope: str) -> bool:
    """True if ``path`` is ``scope`` or inside it (paths inside the mount)."""
    return scope == "/" or path == scope or path.startswith(scope.rstrip("/") + "/")


def policy_for_run(policies: tuple[RetentionPolicy, ...], run: str) -> RetentionPolicy | None:
    """The first policy (in config order) whose glob matches the run directory."""
    for p in policies:
        if p.covers(run):
            return p
    return None


def plan_run(ckpts: list[Ckpt], policy: RetentionPolicy, now_ns: int) -> Plan:
    """The plan for the checkpoints of one run."""
    out = Plan()
    committed = sorted(
        (c for c in ckpts if c.state == CheckpointState.COMMITTED),
        key=lambda c: (-1 if c.step is None else c.step, c.commit_ns),
        reverse=True,
    )
    for c in ckpts:
        if c.state == CheckpointState.PARTIAL:
            later = next((d for d in committed if newer(d, c)), None)
            if later is None:  # perhaps all the run has: never deleted for being partial
                out.why[c.root] = "partial, kept: no newer committed checkpoint"
                continue
            out.expire.append(c.root)
            out.why[c.root] = f"partial (never committed), superseded by {later.root}"
    milestones = [c for c in committed if is_milestone(c, policy)]
    kept_milestones = milestones if policy.keep_milestones <= 0 else milestones[: policy.keep_milestones]
    others = 0
    for i, c in enumerate(committed):
        newest = i == 0
        milestone = c in kept_milestones
        if i < policy.keep_local:
            out.keep_local.append(c.root)
            out.why[c.root] = f"one of the newest {policy.keep_local}: kept local"
        if not newest and not milestone and policy.skip_superseded_uploads:
            out.skip_upload.append(c.root)
        if milestone:
            if i >= policy.keep_local:
                out.evict_local.append(c.root)
                out.why[c.root] = "milestone: kept on the remote"
            continue
        others += 1  # (a milestone beyond keep_milestones counts as an ordinary checkpoint)
        too_old = (
            policy.max_age_s is not None and not newest
            and (now_ns - c.commit_ns) / 1e9 > policy.max_age_s
        )
        if not newest and (others > policy.keep or too_old):
            out.expire.append(c.root)
            out.why[c.root] = (f"older than {policy.max_age_s:.0f} s" if too_old
                               else f"beyond the newest {policy.keep}")
            if c.root in out.keep_local:
                out.keep_local.remove(c.root)
            continue
        if i >= policy.keep_local:
            out.evict_local.append(c.root)
            out.why.setdefault(c.root, f"kept, not among the newest {policy.keep_local}: remote only")
    # A checkpoint that expires needs no upload either; skip_upload keeps only the living.
    out.skip_upload = [r for r in out.skip_upload if r not in out.expire]
    return out


def plan_all(
    ckpts: list[Ckpt], policies: tuple[RetentionPolicy, ...], now_ns: int
) -> dict[str, Plan]:
    """Plans per run directory, for the runs a policy covers."""
    runs: dict[str, list[Ckpt]] = {}
    for c in ckpts:
        runs.setdefault(c.run, []).append(c)
    plans = {}
    for run, items in runs.items():
        policy = policy_for_run(policies, run)
        if policy is not None:
            plans[run] = plan_run(items, policy, now_ns)
    return plans
