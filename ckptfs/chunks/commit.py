"""The commit of a file version: the one call the VFS makes to turn what an open file
wrote into the file's content (vfs/openfile.py ``OpenFile.commit``).

The open file first hands its remaining partial chunks to the store and waits for every
chunk write; then ``commit_version``: with ``synced``, fsync every chunk frame the file
will name; commit size, times, extents and the upload jobs of new chunks in one catalog
transaction (an atomic replacement of the file's content: a crash before it leaves the
previous one); wake the uploader; release the pins of the chunks written; collect the
chunks nothing names any more.

``commit_small``: the same for a version whose last chunk is small and not stored yet (a
small file's close): the chunk's put and verification and the transaction run in one call
in the catalog thread, one thread hop instead of two.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import trio

from ..catalog import ChunkRef
from ..codec.frame import Buffer
from ..errors import CkptfsError
from .store import ChunkStore

SMALL_CHUNK = 64 * 1024  # a last chunk up to this size is stored and committed in one call


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


async def commit_version(
    store: ChunkStore, v: FileVersion, synced: bool,
    sync_failed: Callable[[CkptfsError], None] | None = None,
) -> dict[int, ChunkRef] | None:
    """Commit ``v``; returns the file's extents as committed (None: nothing to commit, the
    pins stay with the caller). A failed fsync calls ``sync_failed`` and raises: nothing
    is committed."""
    n_chunks = math.ceil(v.size / v.chunk_size)
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
    if not (v.changes or v.meta_only):
        if synced:
            await store.sync_catalog()
        return None
    uploads = {
        r.digest: store.remote_targets(r.digest, store.remote_copies)
        for r in v.changes.values()
        if r is not None
    } if store.remotes else None

    def commit() -> tuple[dict[int, ChunkRef | None], list[bytes]]:
        return _commit_blocking(store, v, dict(v.changes), synced, uploads)

    changes, dropped = await trio.to_thread.run_sync(commit, limiter=store.db_limiter)
    return await _after_commit(store, v, changes, dropped, bool(uploads), v.written)


def _commit_blocking(
    store: ChunkStore, v: FileVersion, pending: dict[int, ChunkRef | None], synced: bool,
    uploads: dict[bytes, list[str]] | None,
) -> tuple[dict[int, ChunkRef | None], list[bytes]]:
    """In the catalog thread: the one transaction. The store's tiers of each chunk are read
    here, under the catalog limiter: a chunk a full local tier moved to a remote (under the
    same limiter) is recorded there, and gets no upload job."""
    changes = {i: None if r is None else store.current(r) for i, r in pending.items()}
    return changes, store.catalog.commit_file(
        v.ino, v.size, v.mtime_ns, v.ctime_ns, v.chunk_size, changes, synced, uploads,
    )


async def _after_commit(
    store: ChunkStore, v: FileVersion, changes: dict[int, ChunkRef | None],
    dropped: list[bytes], new_uploads: bool, written: list[ChunkRef],
) -> dict[int, ChunkRef]:
    """Wake the uploader, release the pins of ``written``, collect what lost its last
    reference; the file's extents as committed."""
    n_chunks = math.ceil(v.size / v.chunk_size)
    if new_uploads and store.on_requeue is not None:
        store.on_requeue()  # new upload jobs
    committed = dict(v.committed)
    for idx, ref in changes.items():
        if ref is None or idx >= n_chunks:
            committed.pop(idx, None)
        else:
            committed[idx] = ref
    for idx in [i for i in committed if i >= n_chunks]:
        del committed[idx]
    released = store.release(written)
    dropped_set = set(dropped)
    garbage = [r for r in v.committed.values() if r.digest in dropped_set]
    kept = {r.digest for r in committed.values()}
    garbage += [r for r in released if r.digest not in kept]
    await store.collect(garbage)
    return committed


@dataclass
class SmallCommit:
    """What ``commit_small`` did: the stored chunk (pinned until committed; None: it could
    not be stored, nothing happened) and, if the chunk was stored, the committed extents
    or the error of the catalog transaction."""

    ref: ChunkRef | None
    committed: dict[int, ChunkRef] | None = None
    error: Exception | None = None


async def commit_small(
    store: ChunkStore, v: FileVersion, idx: int, parts: Sequence[Buffer]
) -> SmallCommit:
    """``commit_version`` (not synced) of a version whose chunk ``idx``, at most
    ``SMALL_CHUNK`` bytes, is not stored yet: the chunk is stored and verified, then the
    version committed, in ONE call in the catalog thread (one thread hop instead of two:
    most of a small file's close). The put is bounded by the catalog thread, one at a
    time. If the chunk cannot be stored (no room, a tier failing), nothing is committed
    and ``ref`` is None: the caller stores it the usual way, which makes room or reports."""

    def work() -> tuple[ChunkRef | None, dict[int, ChunkRef | None], list[bytes], bool,
                        Exception | None]:
        try:
            ref = store.put_blocking(parts)
        except CkptfsError:
            return None, {}, [], False, None
        pending = {**v.changes, idx: ref}
        uploads = {
            r.digest: store.remote_targets(r.digest, store.remote_copies)
            for r in pending.values() if r is not None
        } if store.remotes else None
        try:
            changes, dropped = _commit_blocking(store, v, pending, False, uploads)
        except Exception as exc:  # noqa: BLE001 - re-raised by the caller, which keeps the pin
            return ref, {}, [], False, exc
        return ref, changes, dropped, bool(uploads), None

    ref, changes, dropped, new_uploads, error = await trio.to_thread.run_sync(
        work, limiter=store.db_limiter
    )
    if ref is None or error is not None:
        return SmallCommit(ref, error=error)
    committed = await _after_commit(store, v, changes, dropped, new_uploads, [*v.written, ref])
    return SmallCommit(ref, committed)
