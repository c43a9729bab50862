"""Retention across tiers, as pure logic: which checkpoints of a run stay local, which are
kept on the remote only, which expire, whose uploads may be skipped.

Per run (the directory holding the checkpoints), under the policy whose glob matches it:

* The newest ``keep_local`` committed checkpoints stay on the local tiers (rapid recovery);
  older ones may leave the local tiers once the remote holds them (``evict_local``).
* Milestones (tagged ``milestone``, or a step that is a multiple of ``milestone_every``) are
  kept on the remote; with ``keep_milestones`` > 0 only that many, newest first.
* Other committed checkpoints beyond the newest ``keep``, or older than ``max_age_s``,
  expire (deleted everywhere). The newest committed checkpoint never expires.
* Partial checkpoints expire; ones still being written are left alone.
* With ``skip_superseded_uploads``, a committed non-milestone checkpoint that a newer one
  superseded has its pending uploads dropped (the backlog cannot grow without bound).

The daemon applies a plan with the safety rules (retention_apply in the filesystem): never
delete the only valid copy of a kept checkpoint, never evict data not yet uploaded, never
delete a checkpoint that is open.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any

from ..catalog.rows import CheckpointRow, CheckpointState
from ..errors import ConfigError

MILESTONE_TAG = "milestone"


@dataclass(frozen=True)
class RetentionPolicy:
    glob: str  # run directories (inside the mount) this policy covers, fnmatch syntax
    keep_local: int = 2
    keep: int = 5
    milestone_every: int = 0
    keep_milestones: int = 0  # 0: every milestone
    max_age_s: float | None = None
    skip_superseded_uploads: bool = True

    def covers(self, run: str) -> bool:
        return fnmatch.fnmatchcase(run, self.glob)


@dataclass(frozen=True)
class Ckpt:
    root: str
    run: str
    step: int | None
    state: str  # a CheckpointState value (StrEnum: members compare equal to it)
    commit_ns: int
    tags: tuple[str, ...] = ()


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
                 tuple(sorted(r.tag_set))) for r in rows]


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
            out.expire.append(c.root)
            out.why[c.root] = "partial (never committed)"
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


_KEYS = {"path", "keep_local", "keep", "milestone_every", "keep_milestones", "max_age",
         "skip_superseded_uploads"}


def _int(table: dict[str, Any], key: str, where: str, default: int, lo: int) -> int:
    v = table.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise ConfigError(f"{where}.{key}: expected an integer >= {lo}, got {v!r}")
    return v


def policies_from_config(raw: object) -> tuple[RetentionPolicy, ...]:
    """Parse ``[[retention]]`` tables strictly (every error names its key)."""
    from ..config import array_of_tables

    out = []
    for where, table in array_of_tables(raw, "retention", _KEYS):
        path = table.get("path")
        if not isinstance(path, str) or not path.startswith("/"):
            raise ConfigError(f"{where}.path: expected a glob of run directories starting with "
                              f"'/', got {path!r}")
        age = table.get("max_age")
        if age is not None and (isinstance(age, bool) or not isinstance(age, int | float) or age <= 0):
            raise ConfigError(f"{where}.max_age: expected a number of seconds > 0, got {age!r}")
        skip = table.get("skip_superseded_uploads", True)
        if not isinstance(skip, bool):
            raise ConfigError(f"{where}.skip_superseded_uploads: expected true or false, got {skip!r}")
        out.append(RetentionPolicy(
            glob=path.rstrip("/") or "/",
            keep_local=_int(table, "keep_local", where, 2, 0),
            keep=_int(table, "keep", where, 5, 1),
            milestone_every=_int(table, "milestone_every", where, 0, 0),
            keep_milestones=_int(table, "keep_milestones", where, 0, 0),
            max_age_s=None if age is None else float(age),
            skip_superseded_uploads=skip,
        ))
    return tuple(out)
