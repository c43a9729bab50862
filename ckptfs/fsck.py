"""Offline consistency check of the catalog against the tiers.

Finds: orphaned chunk frames (on a tier but referenced by no committed file, e.g. after a
crash mid-write), leftover temp files, replica rows whose frame is gone, chunks no tier
holds (damaged files, reported by path), frames that fail verification (``--verify``),
and inodes that lost their last name. ``--repair`` fixes what can be fixed without losing
data: it deletes orphans and unreferenced rows, forgets missing or corrupt replicas, and
never touches a chunk a committed file references while it is the only copy.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .catalog import Catalog
from .chunks import frame
from .config import Config, TierConfig
from .errors import CkptfsError, CorruptChunk
from .mount import state_lock
from .tiers.local import LocalTier

log = logging.getLogger("ckptfs.fsck")


@dataclass
class FsckReport:
    orphans: int = 0
    orphan_bytes: int = 0
    missing_replicas: int = 0
    corrupt_replicas: int = 0
    lost_chunks: int = 0
    damaged_files: set[str] = field(default_factory=set)
    unlinked_inodes: int = 0
    repaired: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.problems

    def unresolved(self, repaired: bool) -> bool:
        if not repaired:
            return bool(self.problems)
        return self.lost_chunks > 0


def _recorded_tiers(catalog: Catalog, cfg: Config) -> list[LocalTier]:
    configured = {t.name: t for t in cfg.tiers}
    tiers = []
    for rec in catalog.recorded_tiers():
        if rec.get("kind", "local") != "local":
            continue  # fsck checks the local tiers; remote copies are checked on read
        tc = configured.get(rec["name"]) or TierConfig(
            name=rec["name"], kind=rec.get("kind", "local"), path=Path(rec["path"]),
            location=rec.get("location", "local"),
        )
        tier = LocalTier(tc)
        tiers.append(tier)
    return tiers


def run_fsck(
    cfg: Config, *, repair: bool, verify: bool, say: Callable[[str], None] = print
) -> FsckReport:
    if not cfg.catalog_path.exists():
        raise CkptfsError(f"no catalog at {cfg.catalog_path}: nothing was ever mounted there")
    with state_lock(cfg.state_dir):
        catalog = Catalog(cfg.catalog_path)
        try:
            return _check(catalog, _recorded_tiers(catalog, cfg), repair, verify, say)
        finally:
            catalog.close()


def _check(
    catalog: Catalog, tiers: list[LocalTier], repair: bool, verify: bool, say: Callable[[str], None]
) -> FsckReport:
    rep = FsckReport()

    def problem(msg: str) -> None:
        rep.problems.append(msg)
        say(msg)

    # 1. Inodes with no name left hold chunks nobody can reach.
    for ino in catalog.unlinked_inodes():
        rep.unlinked_inodes += 1
        problem(f"unlinked inode {ino} still holds data")
        if repair:
            catalog.delete_inode(ino)
            rep.repaired += 1
    for parent, name, ino in catalog.dangling_dentries():
        problem(f"directory entry {name!r} in inode {parent} names missing inode {ino}")

    referenced = catalog.referenced_digests()
    valid_somewhere: dict[bytes, list[str]] = {}

    for tier in tiers:
        try:
            tier.check()
        except CkptfsError as exc:
            problem(f"tier {tier.name}: {exc}")
            continue
        known = catalog.replica_keys(tier.name)
        on_disk: set[bytes] = set()
        for key in tier.list_keys():
            try:
                digest = bytes.fromhex(key)
            except ValueError:
                problem(f"tier {tier.name}: stray file {key!r} in the chunk directory")
                continue
            on_disk.add(digest)
            if digest not in referenced:
                size = tier.delete(key) if repair else 0
                rep.orphans += 1
                rep.orphan_bytes += size
                if repair:
                    rep.repaired += 1
                if rep.orphans <= 20:
                    say(f"orphan chunk {key[:16]} on tier {tier.name}" + (" (reclaimed)" if repair else ""))
                rep.problems.append(f"orphan {key}")
                continue
            if verify:
                try:
                    raw = tier.get(key)
                    if raw is None:
                        raise CorruptChunk("vanished during the check")
                    frame.decode(raw, digest)
                except CkptfsError as exc:
                    rep.corrupt_replicas += 1
                    problem(f"corrupt chunk {key[:16]} on tier {tier.name}: {exc}")
                    if repair:
                        catalog.remove_replica(digest, tier.name)
                        tier.delete(key)
                        rep.repaired += 1
                    continue
            valid_somewhere.setdefault(digest, []).append(tier.name)
            if digest not in known:
                # A referenced frame the catalog did not list here: record the replica.
                if repair:
                    catalog.add_replica(digest, tier.name, -1)
                    rep.repaired += 1
                else:
                    problem(f"chunk {key[:16]} on tier {tier.name} is not recorded as a replica")
        for digest in known - on_disk:
            rep.missing_replicas += 1
            problem(f"chunk {digest.hex()[:16]} recorded on tier {tier.name} is missing there")
            if repair:
                catalog.remove_replica(digest, tier.name)
                rep.repaired += 1
    if rep.orphans > 20:
        say(f"... {rep.orphans} orphan chunks in all")

    for ino, idx, digest, _length in catalog.all_extents():
        if digest not in valid_somewhere:
            rep.lost_chunks += 1
            path = catalog.path_of(ino)
            rep.damaged_files.add(path)
            problem(f"file {path}: chunk {idx} ({digest.hex()[:16]}) has no valid copy; reads of it give EIO")
    if repair:
        catalog.drop_unreferenced(
            d for d in catalog.replica_keys_all() if d not in referenced
        )
        catalog.sync()
    return rep
