"""The catalog made ready for a mount: restored from a remote tier's snapshot on a new node
(``restore_catalog``), reconciled with the configured tiers and chunk size
(``reconcile_catalog``), the namespaces' usage counted and the mount recorded in the audit
log. Blocking: before the trio loop runs."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, Protocol

from .. import __version__
from ..catalog import SqliteCatalog
from ..catalog.audit import AuditRecord
from ..catalog.protocols import (
    AuditCatalog,
    ContentsCatalog,
    MetaCatalog,
    QuotaCatalog,
    ReplicaCatalog,
)
from ..chunks.residency import Residency
from ..codec import frame
from ..config import Config, S3TierConfig, TierConfig
from ..config.model import GovernanceConfig, NamespaceConfig
from ..config.recorded_access import access_record
from ..errors import CkptfsError, TierError
from ..tiers.base import Tier
from ..upload.uploader import SNAPSHOT_NAME

log = logging.getLogger("ckptfs.mount")


class RestoreError(CkptfsError):
    """The catalog could not be restored (no remote tier could be read)."""


class RestoredCatalog(ContentsCatalog, ReplicaCatalog, Protocol):
    """What narrowing a restored catalog's remote rows reads and removes."""


class MountRecordCatalog(MetaCatalog, AuditCatalog, Protocol):
    """Where a mount is recorded: the audit log, and the last policy's digest."""


class SnapshotDamaged(CkptfsError):
    """The remote's catalog snapshot does not decode or verify."""


def fetch_snapshot(remote: Tier) -> bytes | None:
    """The catalog snapshot ``remote`` holds, verified and decoded (a SQLite file's
    bytes); None if it holds none. Raises TierError when the remote cannot be read,
    SnapshotDamaged when the snapshot does not decode or verify. Blocking. What a new
    node restores (``restore_catalog``) and what a restore drill opens (drill/service.py)."""
    raw = remote.get_meta(SNAPSHOT_NAME)  # type: ignore[attr-defined]
    if raw is None:
        return None
    try:
        return frame.decode(raw)
    except CkptfsError as exc:
        raise SnapshotDamaged(f"catalog snapshot damaged: {exc}") from exc


def restore_catalog(
    path: Path, remotes: list[Tier], governance: GovernanceConfig | None = None,
    down: Collection[str] = (),
) -> None:
    """A new node (empty state dir) with remote tiers: restore the catalog snapshot the
    remote holds, verified, so every file durable there is visible again. If a remote
    cannot be read (``down``: it did not answer at mount), refuse to start empty: an
    empty catalog would later be snapshotted over the remote's."""
    problems = []
    answered = False
    for remote in remotes:
        if remote.name in down:
            problems.append(f"{remote.name}: not reachable")
            continue
        try:
            data = fetch_snapshot(remote)
        except SnapshotDamaged as exc:
            answered = True
            problems.append(f"{remote.name}: {exc}")
            continue
        except TierError as exc:
            problems.append(f"{remote.name}: {exc}")
            continue
        answered = True
        if data is None:
            continue
        tmp = path.with_name(path.name + ".restore")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        restored = SqliteCatalog(path)
        try:
            files, removed = restored.adopt_snapshot([r.name for r in remotes])
            # The snapshot's local tiers were the lost node's (or, from a shared catalog,
            # other nodes'): their replicas are forgotten, and so are they.
            kept = [t for t in restored.recorded_tiers() if t.get("kind", "local") != "local"]
            restored.set_meta("tiers", json.dumps(kept))
            if governance is not None:
                forget_disallowed_remote_rows(restored, remotes, governance)
            restored.audit_append(AuditRecord(
                "restore", "/", 0, os.getpid(),
                detail={"tier": remote.name, "files": files, "not_restored": len(removed)}))
        finally:
            restored.close()
        log.info("restored the catalog (%d files) from remote tier %s", files, remote.name)
        for p in removed:
            log.warning("not restored (its upload had not finished when the remote "
                        "snapshot was taken): %s", p)
        return
    if problems and not answered:
        raise RestoreError(
            "the state dir is empty and no remote tier could be read ("
            + "; ".join(problems) + "); refusing to start with an empty catalog"
        )


def forget_disallowed_remote_rows(
    catalog: RestoredCatalog, remotes: list[Tier], governance: GovernanceConfig
) -> None:
    """A restored catalog records every chunk on every remote tier (a guess: reads fall
    back); residency narrows the guess: a bound chunk is not looked for, nor counted as a
    copy, on a remote its namespace does not allow."""
    residency = Residency(governance, {r.name: r.location for r in remotes})
    if not residency.enabled:
        return
    residency.load({ns.path: catalog.digests_under([ns.path]) for ns in residency.bound})
    for r in remotes:
        for digest in catalog.replica_keys(r.name):
            if not residency.permits(digest, r.name):
                catalog.remove_replica(digest, r.name)


def tier_record(t: TierConfig | S3TierConfig) -> dict[str, Any]:
    """What the catalog remembers of a tier (a remount with only --state-dir uses it)."""
    if isinstance(t, S3TierConfig):
        rec = {"name": t.name, "kind": "s3", "bucket": t.bucket, "prefix": t.prefix,
               "region": t.region, "addressing_style": t.addressing_style,
               "location": t.location, "url": f"s3://{t.bucket}/{t.prefix}"}
        if t.endpoint_url:
            rec["endpoint_url"] = t.endpoint_url
        return rec
    local: dict[str, Any] = {"name": t.name, "kind": t.kind, "path": str(t.path),
                             "location": t.location}
    if t.allow_shared_device:  # a remount with only --state-dir keeps the decision
        local["allow_shared_device"] = True
    if not t.direct_io:  # likewise the I/O choices that differ from the default
        local["direct_io"] = False
    if t.verify_writes != "memory":
        local["verify_writes"] = t.verify_writes
    return local


def is_ours(name: str, record: dict[str, Any], cfg: Config) -> bool:
    """A tier record of this node: a remote tier, or one of this node's local tiers."""
    if record.get("kind", "local") != "local" or not cfg.catalog.shared:
        return True
    return name.startswith(f"{cfg.catalog.node}:")


def reconcile_catalog(catalog: MetaCatalog, cfg: Config) -> int:
    """Record the tier set and chunk size; return the chunk size to use.

    The extent grid depends on the chunk size, so an existing catalog keeps its own.
    """
    recorded = catalog.get_meta("chunk_size")
    chunk_size = cfg.store.chunk_size
    if recorded is None:
        catalog.set_meta("chunk_size", str(chunk_size))
    elif int(recorded) != chunk_size:
        if cfg.store.chunk_size_set:
            log.warning(
                "chunk_size %d in the config differs from %s in the catalog; keeping %s "
                "(files already stored use that grid)", chunk_size, recorded, recorded,
            )
        chunk_size = int(recorded)
    old = {t["name"]: t for t in catalog.recorded_tiers()}
    configured: list[TierConfig | S3TierConfig] = [*cfg.tiers, *cfg.remote_tiers]
    now = {t.name: tier_record(t) for t in configured}
    for name, t in old.items():
        where = t.get("path") or t.get("url")
        if not is_ours(name, t, cfg):
            continue  # another node's local tier (a shared catalog records every node's)
        if name not in now:
            log.warning("tier %s (%s) is no longer configured: chunks stored only there "
                        "will read as EIO", name, where)
        elif where != (now[name].get("path") or now[name].get("url")):
            log.warning("tier %s moved from %s to %s", name, where,
                        now[name].get("path") or now[name].get("url"))
        if name in now and t.get("location") not in (None, now[name].get("location")):
            log.warning("tier %s relabelled: location %s, was %s (residency applies to the "
                        "copies already there)", name, now[name].get("location"), t["location"])
    merged = {**old, **now}
    catalog.set_meta("tiers", json.dumps(list(merged.values())))
    # For `ckptfs gc --dry-run`, which plans beside the daemon from the catalog alone.
    catalog.set_meta("retention", json.dumps([dataclasses.asdict(p) for p in cfg.retention.policies]))
    # For the commands, which show a caller only the namespaces it may reach.
    catalog.set_meta("access", json.dumps(access_record(cfg.governance)))
    return chunk_size


def count_namespaces(catalog: QuotaCatalog, namespaces: Sequence[NamespaceConfig]) -> None:
    """Record the namespaces' quotas; count the usage of one declared for the first time
    (an existing state dir, or a namespace added to the config) from its files."""
    if not namespaces:
        return
    for path in catalog.count_namespaces([(ns.path, ns.quota) for ns in namespaces]):
        log.info("namespace %s: usage counted from its files (first mount declaring it)", path)


def record_mount(catalog: MountRecordCatalog, cfg: Config, mountpoint: Path) -> None:
    """The audit record of this mount, with the digest of its governance policy (the
    namespaces, access, keys and audit settings); a policy that differs from the last
    mount's is recorded as a policy change."""
    policy = hashlib.sha256(repr(cfg.governance).encode()).hexdigest()
    before = catalog.get_meta("audit_policy")
    records = [AuditRecord("mount", str(mountpoint), 0, os.getpid(),
                           detail={"version": __version__, "policy": policy})]
    if before is not None and before != policy:
        records.append(AuditRecord("policy_change", "/", 0, os.getpid(),
                                   detail={"before": before, "after": policy}))
    catalog.audit_append(records)
    if before != policy:
        catalog.set_meta("audit_policy", policy)
