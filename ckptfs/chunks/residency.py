"""Residency (docs/governance.md, "Residency"): where copies of a chunk may be.

Every tier has a ``location`` label; a namespace's ``allowed_locations`` bounds every copy
of its chunks. A chunk that files of several namespaces share (dedup) may be only where
all of them allow: the intersection. The store, the uploader, eviction and fsck ask this
module before they make (or read, or count on) a copy.

Which chunks are bound is kept in memory, digest -> allowed locations: loaded from the
catalog at mount (the digests of the files under each bound namespace) and noted by each
chunk write of a file in a bound namespace (before its commit, so a copy made by another
file of the same bytes, committed or not, obeys it too). An entry is never removed while
the daemon runs: a chunk deleted or renamed away stays bound until the next mount, which
only refuses copies, never makes one where it should not be. Nothing here costs anything
when no namespace has ``allowed_locations``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence

from ..config.model import GovernanceConfig, NamespaceConfig
from ..stats import Stats

log = logging.getLogger("ckptfs.residency")

Locations = frozenset[str] | None  # None: anywhere


class Residency:
    def __init__(self, gov: GovernanceConfig, locations: Mapping[str, str],
                 stats: Stats | None = None) -> None:
        """``locations``: tier name -> location label, for every tier of this mount."""
        self.bound = tuple(ns for ns in gov.namespaces if ns.allowed_locations is not None)
        self.gov = gov
        self.locations = dict(locations)
        self.stats = stats
        self._chunks: dict[bytes, frozenset[str]] = {}
        self._lock = threading.Lock()  # writes note from worker threads
        self._warned: set[str] = set()
        # What the mount found on the tiers: copies outside their chunk's allowed locations,
        # per tier (the mount's count; fsck --repair deletes them). And the remote tiers
        # catalog snapshots go to (None: every remote, no namespace is bound).
        self.out_counts: dict[str, int] = {}
        self.snapshot_tiers: list[str] | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.bound)

    # -- what is allowed --------------------------------------------------------------------

    def for_path(self, path: str) -> Locations:
        """The locations the namespace of ``path`` (inside the mount) allows."""
        if not self.bound:
            return None
        if not path.startswith("/"):
            # A file unlinked while open has no path: only where every bound namespace
            # allows (it may have been any namespace's).
            common = frozenset(self.bound[0].allowed_locations or ())
            for ns in self.bound[1:]:
                common &= frozenset(ns.allowed_locations or ())
            return common
        return _allowed(self.gov.namespace_for(path))

    def note(self, digests: Iterable[bytes], allowed: Locations) -> None:
        """These chunks belong to a file whose namespace allows ``allowed``."""
        if allowed is None:
            return
        with self._lock:
            for d in digests:
                old = self._chunks.get(d)
                self._chunks[d] = allowed if old is None else old & allowed

    def allowed(self, digest: bytes, also: Locations = None) -> Locations:
        """Where copies of this chunk may be (``also``: the writer's own bound, not noted)."""
        if not self.bound:
            return None
        got = self._chunks.get(digest)
        if also is None:
            return got
        return also if got is None else got & also

    def permits(self, digest: bytes, tier: str, also: Locations = None) -> bool:
        allowed = self.allowed(digest, also)
        return allowed is None or self.locations.get(tier) in allowed

    def tiers_for(self, digest: bytes, tiers: Sequence[str], also: Locations = None) -> list[str]:
        """``tiers`` (names, in order) that may hold this chunk."""
        allowed = self.allowed(digest, also)
        if allowed is None:
            return list(tiers)
        return [t for t in tiers if self.locations.get(t) in allowed]

    def snapshot_targets(self, remotes: Sequence[str]) -> list[str]:
        """The remote tiers a catalog snapshot may go to: the catalog holds every
        namespace's metadata, so only where every bound namespace allows."""
        return [t for t in remotes
                if all(ns.allows_location(self.locations.get(t, "")) for ns in self.bound)]

    # -- the mount's view of what is already there -------------------------------------------

    def load(self, digests_under: Mapping[str, Iterable[bytes]]) -> None:
        """The chunks each bound namespace's files name now (namespace path -> digests)."""
        for ns in self.bound:
            self.note(digests_under.get(ns.path, ()), _allowed(ns))

    def out_of_residency(self, replicas: Mapping[str, Iterable[bytes]]) -> dict[str, int]:
        """Per tier, how many of the copies it holds (tier -> digests) are outside their
        chunk's allowed locations (a tier relabelled, a bound widened or narrowed)."""
        out: dict[str, int] = {}
        for tier, digests in replicas.items():
            n = sum(1 for d in digests if not self.permits(d, tier))
            if n:
                out[tier] = n
        return out

    # -- refusals -------------------------------------------------------------------------

    def status(self) -> dict[str, object] | None:
        """For `ckptfs status` and /metrics (None: no namespace is bound)."""
        if not self.bound:
            return None
        return {
            "namespaces": {ns.path: sorted(ns.allowed_locations or ()) for ns in self.bound},
            "locations": dict(sorted(self.locations.items())),
            "copies_out_of_residency": dict(self.out_counts),
            "snapshot_tiers": self.snapshot_tiers,
        }

    def refuse(self, what: str, tier: str | None, digest: bytes, why: str = "") -> None:
        """A copy (or a read of one) that residency does not allow was not made: counted
        (``residency_refused_<what>``) and logged at WARNING once per kind and tier."""
        if self.stats is not None:
            self.stats.count(f"residency_refused_{what}")
        key = f"{what}:{tier}"
        if key in self._warned:
            return
        self._warned.add(key)
        where = "" if tier is None else f" on tier {tier} (location {self.locations.get(tier)})"
        allowed = self.allowed(digest)
        log.warning("residency: %s of chunk %s%s not done: its namespace allows only %s%s "
                    "(further refusals of this kind are counted, not logged)",
                    _WHAT.get(what, what), digest.hex()[:16], where,
                    sorted(allowed) if allowed is not None else "anywhere",
                    f"; {why}" if why else "")


_WHAT = {"write": "a write", "upload": "an upload", "heal": "a heal", "copy_back": "a copy-back",
         "read": "a read", "evict": "an eviction", "move": "a move to a remote tier"}


def _allowed(ns: NamespaceConfig) -> Locations:
    return None if ns.allowed_locations is None else frozenset(ns.allowed_locations)


def no_residency() -> Residency:
    """A Residency that allows everything (tests and tools without governance)."""
    return Residency(GovernanceConfig(), {})
