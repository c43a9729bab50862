""""Durable on the remote", the one definition: what a new node mounting the bucket would
recover. Two halves, both needed:

* the chunks: no upload of them is pending (``uploaded``), and for a checkpoint also a valid
  copy of every chunk on a remote tier (``on_remote``: retention may have dropped the uploads
  of a superseded checkpoint, which then has nothing pending and still is not there);
* the names: a catalog snapshot on the remote that was taken at or after the moment the
  chunks were there (``snapshot_covers``), since the catalog says which chunks make a file.

The daemon's telemetry asks it of each checkpoint (``checkpoint_durable``: the newest
durable one per run, in ``ckptfs status`` and ``/metrics``). ``ckptfs sync`` waits for the
files under a path: no upload of their chunks pending, then ``snapshot_covers`` the moment
that was first seen (it asks no remote copy: a path may hold superseded checkpoints whose
uploads retention dropped on purpose). A close under a ``durability = "remote"`` policy
(upload/uploader.py ``wait_durable``) waits for the same two halves of its file's chunks.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Protocol


class DurabilityFacts(Protocol):
    """What the definition reads of the catalog (any engine)."""

    def digests_under(self, roots: Iterable[str]) -> dict[bytes, int]: ...

    def pending_digests(self, digests: Iterable[bytes]) -> int: ...

    def replica_tiers(self, digest: bytes) -> tuple[str, ...]: ...

    def snapshot_of_ns(self) -> int | None: ...

    def snapshot_is_current(self) -> bool: ...


def snapshot_covers(catalog: DurabilityFacts, since_ns: int) -> bool:
    """The catalog snapshot on the remote includes the state at ``since_ns``: taken at or
    after it, or nothing changed since it was taken."""
    if catalog.snapshot_is_current():
        return True
    snap = catalog.snapshot_of_ns()
    return snap is not None and snap >= since_ns


def uploaded(catalog: DurabilityFacts, digests: Iterable[bytes]) -> bool:
    """No upload of these chunks is pending."""
    return not catalog.pending_digests(digests)


def on_remote(catalog: DurabilityFacts, digests: Iterable[bytes], remotes: Collection[str]) -> bool:
    """Every one of these chunks has a valid copy on one of the ``remotes``."""
    wanted = set(remotes)
    return all(wanted.intersection(catalog.replica_tiers(d)) for d in digests)


def checkpoint_durable(
    catalog: DurabilityFacts, root: str, commit_ns: int, remotes: Collection[str]
) -> bool:
    """The checkpoint at ``root`` (committed at ``commit_ns``) is durable on the remote:
    a snapshot covers its commit, it has chunks, none is waiting for an upload and each
    has a remote copy. Blocking (catalog reads): in the catalog's thread."""
    if not snapshot_covers(catalog, commit_ns):
        return False
    digests = list(catalog.digests_under([root]))
    return bool(digests) and uploaded(catalog, digests) and on_remote(catalog, digests, remotes)
