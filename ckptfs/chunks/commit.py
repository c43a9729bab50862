"""The commit of a file version: the one call the VFS makes to turn what an open file
wrote into the file's content (vfs/openfile.py ``OpenFile.commit``).

The open file first hands its remaining partial chunks to the store and waits for every
chunk write; then ``Committer.commit`` (the chunk service's ``commit``): with ``synced``, fsync every chunk frame the file
will name; commit size, times, extents and the upload jobs of new chunks in one catalog
transaction (an atomic replacement of the file's content: a crash before it leaves the
previous one); wake the uploader; release the pins of the chunks written; collect the
chunks nothing names any more.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import trio

from .. import threads
from ..catalog import ChunkRef
from ..catalog.audit import AuditRecord
from ..catalog.protocols import ContentsCatalog, MetaCatalog
from ..catalog.quotas import Charge
from ..errors import CkptfsError

log = logging.getLogger("ckptfs.store")


@dataclass(frozen=True)
class FileVersion:
    """What an open file commits."""

    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int
    chunk_size: int
    committed: dict[int, ChunkRef]  # the extents as the catalog has them now
    changes: dict[int, ChunkRef | None]  # extents written since (None: cut off)
    written: list[ChunkRef]  # pinned refs stored since the last commit
    meta_only: bool = False  # size or times changed, no extent (truncate, utime)
    # The namespace the new size counts against, checked in the commit's transaction
    # (QuotaExceeded: nothing committed); None: outside every namespace.
    charge: Charge | None = None
    audit: AuditRecord | None = None  # recorded in the commit's transaction (who closed it)


class CommitCatalog(ContentsCatalog, MetaCatalog, Protocol):
    """What a commit asks of the catalog: the file's new content, and its fsync."""


class CommitWriter(Protocol):
    """What a commit asks of the chunk writer (chunks/writer.py)."""

    async def sync(self, refs: Iterable[ChunkRef]) -> None: ...

    def note_commit(self, synced: bool, new_chunks: bool) -> None: ...

    def upload_targets(self, digests: Iterable[bytes]) -> dict[bytes, list[str]] | None: ...


class CommitPins(Protocol):
    """What a commit asks of the pins (chunks/parts.py ``Pins``)."""

    def current(self, ref: ChunkRef) -> ChunkRef: ...

    def release(self, refs: Iterable[ChunkRef]) -> list[ChunkRef]: ...


class Committer:
    def __init__(
        self, catalog: CommitCatalog, db_limiter: trio.CapacityLimiter, writer: CommitWriter,
        pins: CommitPins, collect: Callable[[Iterable[ChunkRef]], Awaitable[None]],
        on_requeue: Callable[[], None] | None = None,
    ) -> None:
        """``collect`` drops the chunks a commit left unreferenced (chunks/gc.py);
        ``on_requeue`` tells the uploader of new upload jobs."""
        self.catalog = catalog
        self.db_limiter = db_limiter
        self.writer = writer
        self.pins = pins
        self.collect = collect
        self.on_requeue = on_requeue

    async def sync_catalog(self) -> None:
        """fsync the catalog (after the chunk frames it names)."""
        await trio.to_thread.run_sync(self.catalog.sync, limiter=self.db_limiter)

    async def commit(
        self, v: FileVersion, synced: bool,
        sync_failed: Callable[[CkptfsError], None] | None = None,
    ) -> dict[int, ChunkRef] | None:
        """Commit ``v``; returns the file's extents as committed (None: nothing to commit,
        the pins stay with the caller). A failed fsync calls ``sync_failed`` and raises:
        nothing is committed."""
        n_chunks = -(-v.size // v.chunk_size)  # integer ceil: a float loses the last chunk past 2**53
        if synced:
            await self._sync_frames(v, n_chunks, sync_failed)
        self.writer.note_commit(synced, any(r is not None for r in v.changes.values()))
        if not (v.changes or v.meta_only):
            if synced:
                await self.sync_catalog()
            return None
        uploads = self.writer.upload_targets(r.digest for r in v.changes.values() if r is not None)
        pending = dict(v.changes)

        def commit() -> tuple[dict[int, ChunkRef | None], list[bytes]]:
            # The store's tiers of each chunk, read under the catalog limiter: a chunk a full
            # local tier moved to a remote (under the same limiter) is recorded there, and gets
            # no upload job.
            changes = {i: None if r is None else self.pins.current(r) for i, r in pending.items()}
            return changes, self.catalog.commit_file(
                v.ino, v.size, v.mtime_ns, v.ctime_ns, v.chunk_size, changes, synced, uploads,
                v.charge, audit=v.audit,
            )

        changes, dropped = await threads.run_sync(commit, limiter=self.db_limiter)
        if uploads and self.on_requeue is not None:
            self.on_requeue()  # new upload jobs
        committed = dict(v.committed)
        for idx, ref in changes.items():
            if ref is None or idx >= n_chunks:
                committed.pop(idx, None)
            else:
                committed[idx] = ref
        for idx in [i for i in committed if i >= n_chunks]:
            del committed[idx]
        await self._collect_garbage(v, committed, set(dropped))
        return committed

    async def _sync_frames(
        self, v: FileVersion, n_chunks: int, sync_failed: Callable[[CkptfsError], None] | None,
    ) -> None:
        # Every chunk the file will name, including ones committed by earlier closes; the
        # store skips those it already knows to be synced.
        final = {**v.committed, **v.changes}
        try:
            await self.writer.sync(r for i, r in final.items() if r is not None and i < n_chunks)
        except CkptfsError as exc:
            if sync_failed is not None:
                sync_failed(exc)
            raise

    async def _collect_garbage(
        self, v: FileVersion, committed: dict[int, ChunkRef], dropped: set[bytes]
    ) -> None:
        """Release the pins of the chunks written; collect the ones nothing names now."""
        written = self.pins.release(v.written)
        garbage = [r for r in v.committed.values() if r.digest in dropped]
        kept = {r.digest for r in committed.values()}
        garbage += [r for r in written if r.digest not in kept]
        try:
            await self.collect(garbage)
        except CkptfsError as exc:
            # The version is committed and its pins are gone: failing the close now would
            # report a saved file as lost, and the caller would release the pins again.
            log.warning("inode %d: committed, but %d chunk(s) it no longer names were not "
                        "collected (%s); `ckptfs fsck --repair` reclaims them", v.ino,
                        len(garbage), exc)
