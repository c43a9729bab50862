"""The catalog's roles over chunk copies (protocols.py says what holds for all of them):
replica rows, the upload queue, the deletion queue, moves of uncommitted chunks, and the
wants of readers on other nodes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from .audit import AuditRecord
from .deletion_events import Listener
from .roles_nodes import ExclusiveLock
from .rows import (
    Backlog,
    Deletion,
    DeletionBacklog,
    UploadJob,
)
from .wants import WantListener


class ReplicaCatalog(Protocol):
    """Where chunk copies are (replica rows: valid or bad), and local eviction."""

    def replica_tiers(self, digest: bytes) -> tuple[str, ...]:
        ...

    def stored_by_tier(self) -> dict[str, tuple[int, int]]:
        """Per tier, the valid copies the catalog records there: (chunks, plaintext bytes).
        One scan of the replicas: for `ckptfs status`, beside the daemon, not in it."""
        ...

    def stored_on_tier(self, tier: str) -> tuple[int, int]:
        """The valid copies the catalog records on one tier: (chunks, plaintext bytes)."""
        ...

    def mark_replica_bad(self, digest: bytes, tier: str) -> None:
        """A read, ``ckptfs verify`` or fsck found this copy missing or corrupt: readers
        skip it (tried last, when no valid copy is left) and it counts as no copy
        (checkpoints/reach.py) until it is healed or found valid again."""
        ...

    def bad_replica_tiers(self, digest: bytes) -> tuple[str, ...]:
        """The tiers whose copy of this chunk is recorded bad."""
        ...

    def bad_replica_keys(self, tier: str) -> set[bytes]:
        """The chunks whose copy on ``tier`` is recorded bad (fsck)."""
        ...

    def add_replica_if_known(self, digest: bytes, tier: str) -> bool:
        """Record a (healed or copied back) valid copy of a chunk the catalog still knows.
        False if the chunk was dropped meanwhile: the copy is queued for deletion."""
        ...

    def add_replica(self, digest: bytes, tier: str, length: int) -> None:
        ...

    def remove_replica(self, digest: bytes, tier: str) -> None:
        ...

    def replica_keys(self, tier: str) -> set[bytes]:
        ...

    def replica_keys_all(self) -> set[bytes]:
        ...

    def eviction_candidates(
        self, local_tiers: Sequence[str], remote_tiers: Sequence[str], limit: int
    ) -> list[tuple[bytes, str, int]]:
        """Local replicas that may go: a remote tier holds the chunk and no upload still
        needs the local copy. Chunks of the least recently modified files first (a restart
        reads the newest checkpoint). Returns (digest, local tier, frame body length)."""
        ...

    def forget_local_replica(self, digest: bytes, tier: str, remote_tiers: Sequence[str], *,
                             audit: AuditRecord | None = None) -> bool:
        """Turn a local replica row into a deletion row if a remote copy still backs it and
        no upload needs it (checked again in the transaction)."""
        ...


class UploadQueue(Protocol):
    """The upload jobs that copy chunks to remote tiers (upload/uploader.py runs them)."""

    def requeue_upload(self, digest: bytes, tier: str) -> bool:
        """Copy a chunk to a remote tier again (its copy there is missing or corrupt)."""
        ...

    def queue_upload(self, digest: bytes, tier: str) -> bool:
        """Queue the copy of a known chunk to a remote tier (the row commit_file writes),
        leaving its replica rows alone. False if a job is queued already or the chunk is
        not known."""
        ...

    def upload_job_pairs(self) -> set[tuple[bytes, str]]:
        """Every (digest, tier) with an upload job (``ckptfs fsck --remote``)."""
        ...

    def due_uploads(
        self, now_ns: int, limit: int, skip: set[tuple[bytes, str]],
        sources: Sequence[str] | None = None,
    ) -> list[UploadJob]:
        """Jobs ready to run, oldest commit first. ``sources``: only jobs of chunks with a
        valid replica on one of these tiers (a node of a shared catalog uploads what its
        own local tiers hold; None: every job)."""
        ...

    def due_uploads_of(
        self, digests: Iterable[bytes], now_ns: int, limit: int, skip: set[tuple[bytes, str]],
        sources: Sequence[str] | None = None,
    ) -> list[UploadJob]:
        """Ready jobs for the given chunks only (someone waits for them: expedite)."""
        ...

    def pending_digests(self, digests: Iterable[bytes]) -> int:
        """How many of these chunks still have an upload job."""
        ...

    def pending_uploads_for(self, inos: Iterable[int]) -> int:
        """Upload jobs still open for chunks the given files name."""
        ...

    def not_durable_files(self) -> dict[str, set[int]]:
        """Files naming a chunk with an upload still open (not on every remote yet), by
        the local tier holding that chunk: what a node's loss would take with it
        (docs/multinode.md)."""
        ...

    def next_upload_due_ns(
        self, skip: set[tuple[bytes, str]], sources: Sequence[str] | None = None
    ) -> int | None:
        """Earliest retry time among jobs not running now (of ``sources`` as above); a job
        held by a claimed deletion of its pair counts at the claim's lease end, and not at
        all once that has passed (the deleter that takes the row over ends the claim: an
        event, not a deadline)."""
        ...

    def finish_upload(self, digest: bytes, tier: str) -> bool:
        """Record a finished copy. False if the job was cancelled meanwhile (the chunk was
        deleted): the caller then removes the copy it made. Touches the catalog: the next
        remote snapshot must know the chunk is there."""
        ...

    def finish_uploads(
        self, done: Sequence[tuple[bytes, str]], jobs: Mapping[tuple[bytes, str], int] | None = None
    ) -> dict[tuple[bytes, str], bool]:
        """``finish_upload`` of each (digest, tier) in one transaction: which were kept.
        One whose deletion is claimed (its DELETE may land after this PUT) is not recorded:
        False, and its job stays, to run again once the deletion is done. ``jobs``: the
        ``enqueued_ns`` of the job each upload ran for; a pair whose job is another one now
        (queued again after its chunk was dropped and deleted) is not recorded either."""
        ...

    def postpone_upload(
        self, digest: bytes, tier: str, next_try_ns: int, error: str, blocked: bool
    ) -> None:
        ...

    def retry_uploads_now(self, tier: str) -> int:
        """Make the postponed uploads to ``tier`` due at once (not those blocked by a
        permanent refusal): the tier works again. Returns how many."""
        ...

    def backlog(self) -> Backlog:
        ...

    def drop_upload_jobs(self, digests: Iterable[bytes], tier: str | None = None) -> int:
        """Forget pending uploads of these chunks (a superseded checkpoint's; ``tier``:
        only those to that tier, which residency does not allow)."""
        ...


class DeletionQueue(Protocol):
    """Chunk frames to delete from tiers (chunks/deleter.py)."""

    def queue_deletions(self, pairs: Iterable[tuple[bytes, str]]) -> int:
        """Queue frames to delete (frames found left over, e.g. of an expired checkpoint).
        Safe for any pair: the deleter cancels a row whose chunk is wanted on its tier."""
        ...

    def due_deletions(
        self, now_ns: int, limit: int, skip: set[tuple[bytes, str]], tiers: Sequence[str]
    ) -> list[Deletion]:
        """Rows of these tiers ready to run, oldest first."""
        ...

    def next_deletion_due_ns(self, skip: set[tuple[bytes, str]], tiers: Sequence[str]) -> int | None:
        """Earliest retry time among rows of these tiers not running now."""
        ...

    def claim_deletions(
        self, pairs: Sequence[tuple[bytes, str]], lease_until_ns: int | None = None,
        owner: tuple[str, str] | None = None,
    ) -> list[tuple[bytes, str]]:
        """The pairs whose frame may be deleted now. A row whose chunk is wanted again on
        its tier (a valid replica row, an upload job, or a node's move of its uncommitted
        chunk there, for the same pair) is cancelled (if its claim's lease had run out,
        the jobs that claim held may run: they are told);
        a row that is gone (done by someone else) or leased by another deleter is skipped.
        ``lease_until_ns`` (wall clock): mark the rows returned as claimed until then
        (remote tiers: another node could upload the same object meanwhile), or until
        finished, postponed or released with that value; no upload of a claimed pair is
        due or recorded. The value names the claim: a caller that could not learn whether
        its claim committed (the database went away) releases exactly that claim.
        ``owner`` (node, session): recorded with each claim, so that a restart of that
        node takes back the claims its dead daemon left (catalog/claims.py)."""
        ...

    def adopt_deletion_claims(
        self, node: str, sid: str, until_by_tier: Mapping[str, int], every: bool = False,
    ) -> list[tuple[bytes, str, int]]:
        """At a daemon's start: claim again, as (``node``, ``sid``)'s and until its tier's
        value in ``until_by_tier``, the claimed rows of those tiers that a dead daemon of
        ``node`` left (an owner row naming ``node`` and a session that is not alive;
        ``every``: every claimed row, for a catalog only one daemon uses at a time).
        Returns (digest, tier, lease value) of each (catalog/claims.py)."""
        ...

    def finish_deletions(
        self, pairs: Iterable[tuple[bytes, str]], lease_until_ns: int | None = None
    ) -> None:
        """The frames of these pairs are deleted: drop their rows (with ``lease_until_ns``,
        only rows still claimed with that value)."""
        ...

    def release_deletion_claims(
        self, pairs: Iterable[tuple[bytes, str]], lease_until_ns: int
    ) -> int:
        """End the claims made with ``lease_until_ns`` without deleting (nothing was sent
        to the tier, or what was sent can no longer land): those rows are due again, and
        the upload jobs they held may run. Rows claimed otherwise are left. Returns
        how many were released."""
        ...

    def postpone_deletion(
        self, digest: bytes, tier: str, next_try_ns: int, error: str,
        lease_until_ns: int | None = None, *, keep_claim: bool = False,
    ) -> None:
        """The deletion failed: count the attempt, keep ``error``, retry at ``next_try_ns``
        (with ``lease_until_ns``, only if the row is still claimed with that value).
        ``keep_claim``: the DELETE may still land (it failed in doubt), so the row stays
        claimed until ``next_try_ns``, its new lease value: no upload of the pair is due
        or recorded before; it is then due again, as any lease that ran out is."""
        ...

    def retry_deletions_now(self, tier: str | None = None) -> int:
        """Make postponed rows due at once (a tier works again; ``ckptfs gc``)."""
        ...

    def deletions_pending(self, digests: Iterable[bytes], due_before_ns: int | None = None) -> set[bytes]:
        """Which of these chunks still have deletion rows (only rows due by then, if given)."""
        ...

    def deletion_keys(self, tier: str) -> set[bytes]:
        ...

    def deletion_backlog(self) -> list[DeletionBacklog]:
        """The deletion queue per tier (empty for a read-only catalog that predates it)."""
        ...

    def listen_deletions(self) -> Listener | None:
        """Where this node hears that another node queued, made due or ended deletion rows
        (its own connection; catalog/deletion_events.py); None when no other node can
        (SQLite)."""
        ...

    def listen_held_uploads(self) -> Listener | None:
        """Where this node hears that another node's claim ended while an upload job of
        its pair waited; None when no other node can claim (SQLite)."""
        ...


class WantCatalog(Protocol):
    """Chunks a node's reader waits for that only other nodes' local tiers hold
    (catalog/wants.py; docs/multinode.md): the holders upload them first. Times are the
    database's clock."""

    def want_chunks(self, digests: Iterable[bytes], waiter: str, ttl_s: float) -> None:
        """``waiter`` waits for these chunks for at most ``ttl_s`` more seconds (renews its
        earlier want); the other nodes are told at the commit (listen_wants)."""
        ...

    def unwant_chunks(self, digests: Iterable[bytes], waiter: str) -> None:
        ...

    def wanted_uploads(self, sources: Sequence[str] | None, limit: int = 1000) -> list[bytes]:
        """Chunks a live want names with an upload job of ``sources`` (as due_uploads),
        the longest wanted first."""
        ...

    def chunk_wants(self) -> list[tuple[bytes, str, int]]:
        """Every live want: (digest, waiter, ns until it expires)."""
        ...

    def listen_wants(self) -> WantListener | None:
        """Where this node hears of other nodes' new wants (its own connection); None
        when no other node can want anything (SQLite)."""
        ...

    def try_exclusive(self, name: str) -> ExclusiveLock | None:
        """Take the cluster-wide lock ``name`` (the retention pass: one node at a time), or
        None if another caller, on any node, holds it. It is held until ``release``, or
        until the holder's node dies (its connection ends). One node's engine (SQLite)
        grants it always."""
        ...


class MoveCatalog(Protocol):
    """Uncommitted chunks a node moved to a remote tier because its local tiers were full
    (catalog/moves.py; docs/multinode.md "One chunk, two nodes"): while a move is
    recorded, no node claims a deletion of its (digest, tier)."""

    def begin_move(self, digest: bytes, length: int, tiers: Sequence[str], node: str) -> bool:
        """Before the PUT: False (nothing written) if a deletion of one of the pairs is
        claimed; else cancel their unclaimed deletion rows, record the moves, True."""
        ...

    def end_moves(self, pairs: Iterable[tuple[bytes, str]], node: str) -> int:
        """The chunks are no longer uncommitted on ``node``: end its moves; queue the
        deletion of each object nothing else wants. Returns the deletions queued."""
        ...

    def release_moves(self, node: str | None = None) -> int:
        """End every move of ``node`` (None: of all) left by a run that did not end them."""
        ...

    def chunk_moves(self) -> list[tuple[bytes, str, str]]:
        """Every recorded move: (digest, tier, node)."""
        ...
