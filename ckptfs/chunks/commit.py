"""The commit of a file version: the one call the VFS makes to turn what an open file
wrote into the file's content (vfs/openfile.py ``OpenFile.commit``).

The open file first hands its remaining partial chunks to the store and waits for every
chunk write; then ``commit_version``: with ``synced``, fsync every chunk frame the file
will name; commit size, times, extents and the upload jobs of new chunks in one catalog
transaction (an atomic replacement of the file's content: a crash before it leaves the
previous one); wake the uploader; release the pins of the chunks written; collect the
chunks nothing names any more.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from .. import threads
from ..catalog import ChunkRef
from ..catalog.audit import AuditRecord
from ..catalog.quotas import Charge
from ..errors import CkptfsError
from .store import ChunkStore

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


async def commit_version(
    store: ChunkStore, v: FileVersion, synced: bool,
    sync_failed: Callable[[CkptfsError], None] | None = None,
) -> dict[int, ChunkRef] | None:
    """Commit ``v``; returns the file's extents as committed (None: nothing to commit, the
    pins stay with the caller). A failed fsync calls ``sync_failed`` and raises: nothing
    is committed."""
    cs = v.chunk_size
    n_chunks = -(-v.size // cs)  # integer ceil: a float loses the last chunk past 2**53
    if synced:
        # Every chunk the file will name, including ones committed by earlier closes; the
        # store skips those it already knows to be synced.
        final = {**v.committed, **v.changes}
        try:
            await store.sync(r for i, r in final.items() if r is not None and i < n_chunks)
        except CkptfsError as exc:
            if sync_failed is not None:
                sync_failed(exc)
            raise
    store.note_commit(synced, any(r is not None for r in v.changes.values()))
    if not (v.changes or v.meta_only):
        if synced:
            await store.sync_catalog()
        return None
    uploads = {
        r.digest: store.remote_targets(r.digest, store.remote_copies)
        for r in v.changes.values()
        if r is not None
    } if store.remotes else None
    pending = dict(v.changes)

    def commit() -> tuple[dict[int, ChunkRef | None], list[bytes]]:
        # The store's tiers of each chunk, read under the catalog limiter: a chunk a full
        # local tier moved to a remote (under the same limiter) is recorded there, and gets
        # no upload job.
        changes = {i: None if r is None else store.current(r) for i, r in pending.items()}
        return changes, store.catalog.commit_file(
            v.ino, v.size, v.mtime_ns, v.ctime_ns, cs, changes, synced, uploads, v.charge,
            audit=v.audit,
        )

    changes, dropped = await threads.run_sync(commit, limiter=store.db_limiter)
    if uploads and store.on_requeue is not None:
        store.on_requeue()  # new upload jobs
    committed = dict(v.committed)
    for idx, ref in changes.items():
        if ref is None or idx >= n_chunks:
            committed.pop(idx, None)
        else:
            committed[idx] = ref
    for idx in [i for i in committed if i >= n_chunks]:
        del committed[idx]
    written = store.release(v.written)
    dropped_set = set(dropped)
    garbage = [r for r in v.committed.values() if r.digest in dropped_set]
    kept = {r.digest for r in committed.values()}
    garbage += [r for r in written if r.digest not in kept]
    try:
        await store.collect(garbage)
    except CkptfsError as exc:
        # The version is committed and its pins are gone: failing the close now would
        # report a saved file as lost, and the caller would release the pins again.
        log.warning("inode %d: committed, but %d chunk(s) it no longer names were not "
                    "collected (%s); `ckptfs fsck --repair` reclaims them", v.ino,
                    len(garbage), exc)
    return committed
