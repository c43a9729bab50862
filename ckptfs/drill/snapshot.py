"""What a new node of a single-node mount would restore from: the bucket's catalog
snapshot (daemon/restore.py ``restore_catalog``). A drill fetches it from the remote tiers,
verified and decoded as a restore does, writes it into the drill's scratch directory and
opens it read-only; the checkpoint it drills, and that checkpoint's files and extents, are
read from it (never from the live catalog, which a new node does not have). Blocking:
worker threads."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..catalog import ChunkRef, SqliteCatalog
from ..errors import CkptfsError, TierError
from ..tiers.base import Tier

# The daemon's fetch (daemon/restore.py fetch_snapshot, given by the daemon: the drill sits
# below it): the snapshot's bytes verified and decoded, or None where the remote holds none;
# raises TierError (unreadable) or another CkptfsError (does not decode or verify).
SnapshotFetch = Callable[[Tier], "bytes | None"]

FILE_NAME = "catalog.sqlite"  # in the drill's scratch directory


@dataclass
class SnapshotView:
    """The snapshot a drill reads (None where no remote held a good one) and what was
    wrong with the remotes' copies (each a drill failure)."""

    catalog: SqliteCatalog | None = None
    tier: str = ""  # the remote it came from
    remote_names: frozenset[str] = frozenset()  # the remote tiers the snapshot records
    configured: tuple[str, ...] = ()  # the remote tiers a new node would read from
    nbytes: int = 0  # read from the remotes (the drill's bandwidth cap counts them)
    problems: list[str] = field(default_factory=list)

    def as_restored(self, ref: ChunkRef) -> ChunkRef:
        """``ref`` as a new node records it (catalog adopt_snapshot): on every configured
        remote if the snapshot records it on any remote, else on none (a new node drops
        its file: the upload had not finished when the snapshot was taken)."""
        held = any(t in self.remote_names for t in ref.tiers)
        return replace(ref, tiers=self.configured if held else ())

    def close(self) -> None:
        if self.catalog is not None:
            self.catalog.close()
            self.catalog = None


def open_snapshot(remotes: Sequence[Tier], fetch: SnapshotFetch, where: Path) -> SnapshotView:
    """The first good catalog snapshot of ``remotes`` (in order, as restore_catalog takes
    it), opened read-only from ``where``. An unreadable or damaged copy on any remote is a
    problem even when another remote's is good; a remote holding none is one only when no
    remote holds one (residency may keep snapshots off a remote on purpose)."""
    view = SnapshotView(configured=tuple(r.name for r in remotes))
    for remote in remotes:
        try:
            data = fetch(remote)
        except TierError as exc:
            view.problems.append(f"catalog snapshot on {remote.name} unreadable: {exc}")
            continue
        except CkptfsError as exc:
            view.problems.append(f"catalog snapshot on {remote.name} does not verify "
                                 f"(a new node could not restore from it): {exc}")
            continue
        if data is None:
            continue
        view.nbytes += len(data)
        if view.catalog is not None:
            continue  # checked only: the first good one is read
        path = where / FILE_NAME
        path.write_bytes(data)
        try:
            cat = SqliteCatalog(path, readonly=True)
        except Exception as exc:  # sqlite3's own errors: only the catalog may name sqlite3
            view.problems.append(f"catalog snapshot on {remote.name} is not a catalog: {exc}")
            continue
        try:
            view.remote_names = frozenset(
                t["name"] for t in cat.recorded_tiers() if t.get("kind", "local") != "local")
        except Exception as exc:  # likewise: a file SQLite opens lazily, read only here
            cat.close()
            view.problems.append(f"catalog snapshot on {remote.name} is not a catalog: {exc}")
            continue
        view.catalog, view.tier = cat, remote.name
    if view.catalog is None and not view.problems:
        view.problems.append("no catalog snapshot in the bucket (remote tier(s) "
                             f"{', '.join(view.configured)}): a new node of this mount "
                             "would start with an empty catalog")
    return view
