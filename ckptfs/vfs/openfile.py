"""The state of one open regular file, shared by every handle open on its inode.

Writes land in per-chunk buffers (``dirty``). A buffer that fills up is handed to the
ChunkStore at once (``inflight``), so hashing and device writes run in worker threads while
the writer goes on. Close/fsync (``commit``) writes the remaining partial buffers, waits for
every chunk, and hands the version to the layer below (chunks/commit.py), which commits
size, times and extents in one catalog transaction: each commit is an atomic replacement of
the file's content, and a crash before it leaves the previous one.

Concurrency: mutations (write, truncate, commit) hold ``lock``; reads do not, and pick
their source (dirty buffer, in-flight buffer, stored chunk) without awaiting in between.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import trio

from ..catalog import ChunkRef, Inode
from ..catalog.audit import AuditRecord
from ..chunks.commit import FileVersion
from ..chunks.residency import Locations
from ..codec.staged import Staged
from ..errors import CkptfsError, FileTooLarge, QuotaExceeded
from ..supervise import failed, inject
from .chunkbuffer import STAGE_MIN, Buffer, ChunkBuffer
from .fileservices import Services
from .quota import FileAccount, refused
from .readstreams import ReadStream, ReadStreams

log = logging.getLogger("ckptfs.vfs")

END_BYTES = 4096  # kept of each file's last stored chunk (checkpoints/events.SMALL_FILE)
# The largest file ckptfs keeps: 1 EiB. The kernel accepts offsets up to 2**63 - 1 (the
# catalog's signed 64-bit sizes); the bound leaves room for sums over sizes (a namespace's
# usage, itself bounded: catalog/quotas.USAGE_MAX). A write past it is cut short there,
# one starting at it fails with EFBIG, as Linux does at a filesystem's maximum; so does a
# truncate past it.
MAX_FILE_SIZE = 1 << 60


class OpenFiles(dict[int, "OpenFile"]):
    """The open regular files by inode. Built by the composition root before the memory
    budget, whose spill (``spill_all``) writes out their partial chunks."""

    def spill_all(self) -> None:
        """The memory budget is held only by partial chunks that nobody is completing:
        store them now (short chunks), so their memory comes back instead of deadlocking."""
        for f in self.values():
            f.spill()


@dataclass(eq=False)
class _Pending:
    data: ChunkBuffer
    done: trio.Event = field(default_factory=trio.Event)


class OpenFile:
    def __init__(self, inode: Inode, committed: dict[int, ChunkRef], svc: Services) -> None:
        self.inode = inode  # attributes as committed (mode, uid, ...); size/times live below
        self.size = inode.size
        self.mtime_ns = inode.mtime_ns
        self.ctime_ns = inode.ctime_ns
        self._committed_attrs = (inode.size, inode.mtime_ns, inode.ctime_ns)
        self.svc = svc
        self.cs = svc.chunk_size
        self.committed = committed  # the extents as the catalog has them
        self.changes: dict[int, ChunkRef | None] = {}  # extents written since the last commit
        self.dirty: dict[int, ChunkBuffer] = {}
        self.inflight: dict[int, _Pending] = {}  # the newest in-flight write of each chunk
        self._running: set[_Pending] = set()  # every chunk write not finished yet
        self.written: list[ChunkRef] = []  # pinned refs produced since the last commit
        self.meta_dirty = False  # size or times changed without data (truncate, utime)
        # Writes through direct-I/O handles bypass the kernel page cache, which may still
        # hold older pages of this file: drop them once those writes are committed.
        self.bypassed_cache = False
        self.failed: CkptfsError | None = None
        self.lock = trio.Lock()
        # Writes waiting for memory budget under ``lock`` (``_buffer``): a whole-chunk
        # write does not wait for the lock with its share while one does (write_whole).
        self._budget_waits = 0
        self.handles = 0
        self._init_reads()
        # The last bytes (at most END_BYTES) of the highest chunk stored: (idx, digest, bytes).
        # A close reports a file's tail (and a small file's content) to the checkpoint
        # detectors from here, instead of reading the chunk back from its tier.
        self.chunk_end: tuple[int, bytes, bytes] | None = None
        # The filesystem's namespace generation when this open state was read from the
        # catalog (-1: unknown). Unchanged at the last close: no rename, unlink or link
        # touched the inode since, so attrs() is exactly its row (vfs/dirattrs.py).
        self.ns_gen = -1
        # Its namespace's quota (vfs/quota.py), set by the filesystem before anything may
        # write: None outside every namespace; ``account_known`` once decided.
        self.account: FileAccount | None = None
        self.account_known = False
        # Where this file's chunks may be (its namespace's allowed_locations), looked up
        # at its first chunk write; "?" until then.
        self._allowed: Locations | str = "?"
        # The encrypted namespace its chunks are sealed for, looked up at its first chunk
        # write (False: not yet). A file keeps it while open (a rename does not re-seal).
        self._sealed_ns: str | None | bool = False
        # Who wrote to it last (uid, pid of the handle; the filesystem sets it): the audit
        # record of a quota refusal names them.
        self.writer: tuple[int, int] = (0, 0)

    def _init_reads(self) -> None:
        """The state of its reads: readahead, and what the kernel's page cache holds."""
        # Each reader's (handle's) requests: sequential or not, warm or not, where its
        # pushes stop (vfs/readstreams.py).
        self._streams = ReadStreams()
        # Readahead in flight, by chunk index: owned by this file, cancelled and waited for
        # when its last handle closes (``stop_readahead``), so none outlives the file.
        self._ahead: dict[int, trio.CancelScope] = {}
        self._ahead_digests: set[bytes] = set()  # chunks this file had fetched ahead
        # The chunks this file pushed pages of: a stream's request that jumps over them
        # is not warm (ReadStream.note).
        self._pushed_idx: set[int] = set()
        self._ahead_ended = trio.Event()  # set (and replaced) whenever one ends
        # Page-cache pushes (vfs/pagepush.py): none starts while ``_no_push`` (handles open
        # for writing, a truncate) is above 0; ``hold_pushes`` waits for those in flight.
        self._no_push = 0
        self._pushing = 0
        self._pushes_ended = trio.Event()

    @property
    def ino(self) -> int:
        return self.inode.ino

    def attrs(self) -> Inode:
        return Inode(
            self.inode.ino, self.inode.mode, self.inode.uid, self.inode.gid, self.size,
            self.inode.nlink, self.inode.atime_ns, self.mtime_ns, self.ctime_ns, None,
        )

    @property
    def committed_size(self) -> int:
        return self._committed_attrs[0]

    def is_dirty(self) -> bool:
        return bool(self.dirty or self.inflight or self.changes or self.meta_dirty)

    def _ref(self, idx: int) -> ChunkRef | None:
        if idx in self.changes:
            return self.changes[idx]
        return self.committed.get(idx)

    def _touch(self) -> None:
        now = time.time_ns()
        self.mtime_ns = max(now, self.mtime_ns)
        self.ctime_ns = max(now, self.ctime_ns)

    # -- write -------------------------------------------------------------------------------

    async def _buffer(self, idx: int, stage: bool = False) -> ChunkBuffer:
        """The dirty buffer of chunk ``idx``, made if needed; a new, empty chunk is staged
        if ``stage`` (its first write is large: a save)."""
        buf = self.dirty.get(idx)
        if buf is not None:
            return buf
        self._budget_waits += 1
        try:
            await self.svc.budget.acquire(self.cs)
        finally:
            self._budget_waits -= 1
        try:
            pending = self.inflight.get(idx)
            if pending is not None:
                buf = pending.data.copy()
            else:
                ref = self._ref(idx)
                # Read-modify-write: only when the chunk holds data (overwrite, append
                # after a close, truncate), never on the sequential first write.
                if ref is not None:
                    buf = ChunkBuffer([await self.svc.store.read(ref)])
                elif stage and self.svc.stages is not None:
                    buf = ChunkBuffer(staged=self.svc.stages.take())
                else:
                    buf = ChunkBuffer()
        except BaseException:
            self.svc.budget.release(self.cs)
            raise
        self.dirty[idx] = buf
        return buf

    async def write(self, off: int, data: bytes) -> int:
        n = len(data)
        if off + n > MAX_FILE_SIZE:
            if off >= MAX_FILE_SIZE:
                raise FileTooLarge(f"write at {off}: past the largest file size, {MAX_FILE_SIZE}")
            n = MAX_FILE_SIZE - off
            data = data[:n]
        idx, within = divmod(off, self.cs)
        buf = self.dirty.get(idx)
        if (buf is not None and within + n <= self.cs and self.failed is None
                and not self.lock.locked()
                and (self.account is None or self.account.reserve(off + n))):
            # The hot path of a save: one request into a chunk being assembled. Nothing
            # here awaits, so no other task can run in between, which is all the lock
            # would ensure; skipping it saves its scheduling round trip per request.
            self._put(buf, idx, within, data)
            self._touch()
            return n
        async with self.lock:
            if self.failed is not None:
                raise self.failed
            await self._grow(off + n, f"write at {off} (+{n})")
            pos, end = off, off + n
            while pos < end:
                idx, within = divmod(pos, self.cs)
                piece = min(end - pos, self.cs - within)
                buf = await self._buffer(idx, stage=n >= min(STAGE_MIN, self.cs))
                # The common case (one request inside one chunk) keeps the bytes object.
                self._put(buf, idx, within, data if piece == n else data[pos - off : pos - off + piece])
                pos += piece
            self._touch()
            return n

    async def _grow(self, end: int, what: str) -> None:
        """The namespace's quota takes a file that reaches ``end`` (under ``lock``)."""
        if self.account is None:
            return
        try:
            await self.account.grow(end)
        except QuotaExceeded as exc:
            # The version cannot be complete: none of it may be committed, and the room
            # it held is free for other writers at once.
            self.failed = exc
            self.account.release()
            await self._refused(what, exc)
            raise

    async def write_whole(self, idx: int, fill: Callable[[Staged], Awaitable[None]]) -> bool:
        """Chunk ``idx`` becomes one whole chunk of bytes that ``fill`` puts into an empty
        staged buffer (the direct path: a kernel copy out of its client's memory, in a
        worker thread), as if they were written there; it goes to the store at once. The
        same chunk write, quota and commit as the FUSE path's, none of its per-byte work
        on the trio thread. False: this filesystem stages nothing (nothing was done)."""
        if self.svc.stages is None:
            return False
        off = idx * self.cs
        if off + self.cs > MAX_FILE_SIZE:
            raise FileTooLarge(f"write at {off}: past the largest file size, {MAX_FILE_SIZE}")
        await self.svc.budget.acquire(self.cs)
        held, taken = True, False
        staged = self.svc.stages.take()
        try:
            await fill(staged)
            if self.lock.locked() and self._budget_waits:
                # Its holder waits for budget: waiting for the lock with our share could
                # leave it none for ever (whole chunks of this file may hold it all).
                # Wait without it; take it back under the lock.
                self.svc.budget.release(self.cs)
                held = False
            async with self.lock:
                if not held:
                    await self.svc.budget.acquire(self.cs)
                    held = True
                if self.failed is not None:
                    raise self.failed
                await self._grow(off + staged.length, f"write at {off} (+{staged.length})")
                old = self.dirty.pop(idx, None)
                if old is not None:  # an earlier partial write of it: replaced whole
                    self._drop(old)
                    self.svc.budget.release(self.cs)
                self.dirty[idx] = ChunkBuffer(staged=staged)
                taken = True
                self.size = max(self.size, off + staged.length)
                self._dispatch(idx)
                self._touch()
        finally:
            if not taken:
                self.svc.stages.give(staged)
                if held:
                    self.svc.budget.release(self.cs)
        return True

    def _put(self, buf: ChunkBuffer, idx: int, within: int, data: Buffer) -> None:
        """``data`` into chunk ``idx`` at ``within``; a chunk written to its end is full and
        goes to the store."""
        try:
            buf.write(within, data)
        except CkptfsError as exc:  # a staged copy that differs: this version is lost
            self.failed = exc
            raise
        end = within + len(data)
        if idx * self.cs + end > self.size:
            self.size = idx * self.cs + end
        if buf.length == self.cs and end == self.cs:
            self._dispatch(idx)

    def _dispatch(self, idx: int) -> None:
        data = self.dirty.pop(idx)
        pending = _Pending(data)
        self.inflight[idx] = pending
        self._running.add(pending)
        self.svc.budget.in_flight += 1
        self.svc.nursery.start_soon(self._store_chunk, idx, pending)

    def placed_in(self, path: str) -> None:
        """The file's path as it was created (its namespace, for residency)."""
        self._allowed = self.svc.store.residency.for_path(path)

    async def _residency(self) -> Locations:
        """The locations this file's namespace allows (None: anywhere)."""
        residency = self.svc.store.residency
        if not residency.enabled:
            return None
        allowed = self._allowed
        if isinstance(allowed, str):
            allowed = residency.for_path(await self.svc.path_of(self.ino))
            self._allowed = allowed
        return allowed

    async def _namespace(self) -> str | None:
        if self.svc.namespace_of is None:
            return None
        if self._sealed_ns is False:
            self._sealed_ns = await self.svc.namespace_of(self.ino)
        assert not isinstance(self._sealed_ns, bool)
        return self._sealed_ns

    async def _store_chunk(self, idx: int, pending: _Pending) -> None:
        try:
            inject("chunk-write")  # tests only (supervise.py)
            allowed = await self._residency()
            ref = await self.svc.store.write(pending.data.content(), allowed,
                                             await self._namespace())
        except CkptfsError as exc:
            log.error("inode %d: storing chunk %d failed: %s", self.ino, idx, exc)
            if self.failed is None:
                self.failed = exc
        except Exception as exc:
            # A bug: this version of the file fails (EIO at its close or fsync, nothing
            # committed); the mount's nursery, and so the daemon, goes on.
            failed(self.svc.store.stats, "chunk-write", exc)
            if self.failed is None:
                self.failed = CkptfsError(f"storing chunk {idx} failed unexpectedly: {exc!r}")
        else:
            self.written.append(ref)
            if self.inflight.get(idx) is pending:
                self.changes[idx] = ref
            if self.chunk_end is None or idx >= self.chunk_end[0]:
                n = pending.data.length
                self.chunk_end = (idx, ref.digest, pending.data.slice(max(0, n - END_BYTES), n))
        finally:
            if self.inflight.get(idx) is pending:
                del self.inflight[idx]
            self._running.discard(pending)
            self.svc.budget.in_flight -= 1
            self.svc.budget.release(self.cs)
            self._drop(pending.data)
            pending.done.set()

    def _drop(self, buf: ChunkBuffer) -> None:
        """``buf`` is done with (stored or discarded): a staged chunk's buffer is reused."""
        if buf.staged is not None and self.svc.stages is not None:
            self.svc.stages.give(buf.staged)
            buf.staged = None

    def spill(self) -> None:
        """Dispatch every dirty chunk now (memory pressure); later writes to them RMW."""
        for idx in list(self.dirty):
            self._dispatch(idx)

    async def truncate(self, size: int) -> None:
        if size > MAX_FILE_SIZE:
            raise FileTooLarge(f"truncate to {size}: past the largest file size, {MAX_FILE_SIZE}")
        async with self.lock:
            if self.failed is not None and size == 0:
                await self._discard()  # truncating to nothing forgets a failed write
            if self.failed is not None:
                raise self.failed
            if self.account is not None and size > self.size:
                try:
                    await self.account.grow(size)
                except QuotaExceeded as exc:  # nothing changed: the version stays usable
                    await self._refused(f"truncate to {size}", exc)
                    raise
            if size < self.size:
                keep = -(-size // self.cs)  # integer ceil (a float is wrong past 2**53)
                for idx in [i for i in self.dirty if i >= keep]:
                    self._drop(self.dirty.pop(idx))
                    self.svc.budget.release(self.cs)
                for idx in [i for i in self.inflight if i >= keep]:
                    del self.inflight[idx]  # its result is ignored; commit collects it
                for idx in set(self.committed) | set(self.changes):
                    if idx >= keep:
                        self.changes[idx] = None
                within = size % self.cs
                if within and self._has_data(size // self.cs):
                    buf = await self._buffer(size // self.cs)
                    buf.truncate(within)
            self.size = size
            if self.account is not None:
                self.account.resize(size)
            self.meta_dirty = True
            self._touch()

    def _has_data(self, idx: int) -> bool:
        return idx in self.dirty or idx in self.inflight or self._ref(idx) is not None

    async def _discard(self) -> None:
        """Forget everything since the last commit (after a failed write)."""
        for buf in self.dirty.values():
            self.svc.budget.release(self.cs)
            self._drop(buf)
        self.dirty.clear()
        await self._wait_inflight()
        written, self.written = self.written, []
        self.changes.clear()
        self.failed = None
        self.meta_dirty = False
        self.size, self.mtime_ns, self.ctime_ns = self._committed_attrs
        if self.account is not None:
            self.account.release()
        # Unpinned with the tiers holding them as the pins go: a chunk moved to a remote
        # meanwhile gets its remote copy queued for deletion.
        dropped = self.svc.store.release(written)
        try:
            if self.svc.invalidate is not None:
                # The kernel cached the discarded bytes and size: make it ask again, also
                # when the collection below fails (a commit failed because the catalog is
                # unreachable: the kernel's pages must not outlive the version). In a
                # thread, because the kernel may need this loop to answer meanwhile.
                await trio.to_thread.run_sync(self.svc.invalidate, self.ino)
        finally:
            try:
                await self.svc.store.collect(dropped)
            except CkptfsError as exc:
                # Uncommitted chunks have no catalog rows: their frames stay behind (fsck
                # reports them) rather than fail the close of every handle after it.
                log.warning("inode %d: the %d chunk(s) of a discarded write were not "
                            "collected: %s", self.ino, len(dropped), exc)

    async def _wait_inflight(self) -> None:
        while self._running:
            await next(iter(self._running)).done.wait()

    # -- commit ------------------------------------------------------------------------------

    async def commit(self, synced: bool = False, audit: AuditRecord | None = None) -> None:
        """Make every write so far part of the file: the remaining partial chunks are
        stored, then the layer below commits the version in one call (chunks/commit.py).
        With ``synced`` (fsync), the chunk frames and the catalog are fsynced first.
        ``audit``: who commits (the closer; None: the daemon's own commit, recorded as
        uid 0)."""
        async with self.lock:
            if self.failed is not None:
                raise self.failed
            for idx in list(self.dirty):
                self._dispatch(idx)
            await self._wait_inflight()
            if self.failed is not None:
                raise self.failed
            account = self.account
            charge = None if account is None else account.charge()
            version = FileVersion(
                self.ino, self.size, self.mtime_ns, self.ctime_ns, self.cs, dict(self.committed),
                dict(self.changes), list(self.written), self.meta_dirty, charge,
                audit or AuditRecord("commit", ino=self.ino),
            )
            if account is not None:
                account.tally.begin_commit()
            try:
                committed = await self.svc.store.commit(
                    version, synced, sync_failed=self._sync_failed
                )
            except QuotaExceeded as exc:
                # The catalog's check (other nodes' commits took the room): the version is
                # lost like a failed write; the committed one stays.
                self.failed = exc
                if account is not None:
                    account.release()
                await self._refused("commit", exc)
                raise
            finally:
                if account is not None:
                    account.tally.end_commit(None if charge is None else charge.used)
            if committed is None:
                return
            if account is not None and charge is not None:
                account.committed(self.size, charge)
            self.committed.clear()
            self.committed.update(committed)
            self.changes.clear()
            self.meta_dirty = False
            self._committed_attrs = (self.size, self.mtime_ns, self.ctime_ns)
            self.written = []
            if self.bypassed_cache and self.svc.invalidate is not None:
                self.bypassed_cache = False
                await trio.to_thread.run_sync(self.svc.invalidate, self.ino)

    async def _refused(self, what: str, exc: QuotaExceeded) -> None:
        try:
            path = await self.svc.path_of(self.ino)
        except CkptfsError:
            path = f"inode {self.ino}"
        refused(path, what, exc)
        # The refusal changes nothing, so its audit record is noted (no transaction to
        # join) and written with the next batch; who: the handle that wrote last.
        uid, pid = self.writer
        if self.svc.audit is None:
            return
        self.svc.audit.audit_note(AuditRecord(
            "quota_refused", path, uid, pid, time_ns=time.time_ns(),
            detail={"call": what, "error": str(exc)}))

    def _sync_failed(self, exc: CkptfsError) -> None:
        # Reported by this fsync; the handles keep failing until they close and commit
        # nothing of this version (docs/semantics.md).
        self.failed = exc

    async def sync_committed(self) -> None:
        """fsync the content as last committed (its chunk frames, then the catalog),
        leaving any version being written alone."""
        async with self.lock:
            n_chunks = -(-self._committed_attrs[0] // self.cs)
            await self.svc.store.sync(r for i, r in self.committed.items() if i < n_chunks)
            await self.svc.store.sync_catalog()

    async def release_all(self) -> None:
        """The last handle closed: end the readahead and the page-cache pushes, drop
        uncommitted state (a failed write stays uncommitted). Pushes stay held (a push of
        a file nobody holds open could land after a new OpenFile of it was written);
        a reopen while this ran allows them again (Opens.drop_handle_ref)."""
        await self.hold_pushes()
        await self.stop_readahead()
        # What it fetched ahead and nobody read no longer holds back other files' readahead.
        self.svc.store.forget_ahead(self._ahead_digests)
        self._ahead_digests.clear()
        async with self.lock:
            if self.dirty or self.inflight or self.written:
                await self._discard()
            if self.account is not None:
                self.account.release()  # what no commit will take any more

    # -- read --------------------------------------------------------------------------------

    async def read(self, off: int, size: int, cached: bool = True,
                   stream: int | None = None) -> Buffer:
        """Bytes [off, off + size) as the handles see them. A piece of one stored chunk
        comes back as a view into the verified chunk (pyfuse3 replies from any buffer),
        so the trio thread makes no copy of it. ``cached``: the reading handle goes
        through the kernel's page cache (not direct I/O), so the chunks its readahead
        fetches may be pushed there. ``stream``: the reading handle (vfs/readstreams.py)."""
        end = min(off + size, self.size)
        if off >= end:
            return b""
        first, last = off // self.cs, (end - 1) // self.cs
        st = self._streams.of(stream)
        st.begin(off, end)
        if cached:
            st.note(off, end, self.cs, self._pushed_idx)
        warm = cached and st.warm  # a warm page-cache reader: no readahead, no pushes
        out: list[Buffer] = []
        for idx in range(first, last + 1):
            base = idx * self.cs
            lo, hi = max(off, base) - base, min(end, base + self.cs) - base
            piece: Buffer
            if idx in self.dirty:
                piece = self.dirty[idx].slice(lo, hi)
            elif idx in self.inflight:
                piece = self.inflight[idx].data.slice(lo, hi)
            else:
                ref = self._ref(idx)
                if ref is None:
                    piece = b""
                else:
                    sequential = self._readahead(st, idx, cached, fetch=not warm)
                    if idx == first and last > first and not warm:
                        # A request over several chunks: its later ones at once, not one
                        # by one (after the readahead, which pushes them for a sequential
                        # reader; this skips chunks already on their way).
                        self._fetch_ahead(range(first + 1, last + 1), st,
                                          push=cached and sequential)
                    try:
                        data = await self.svc.store.read(ref, self._copy_back(sequential))
                    except CkptfsError as exc:
                        await self._log_read_error(base + lo, idx, exc)
                        raise
                    piece = memoryview(data)[lo:hi]  # stored chunks are never changed in place
                    if (sequential and cached and not warm and self.svc.page_push is not None
                            and (lo == 0 or idx not in self._pushed_idx)
                            and ref.digest not in self._ahead_digests):
                        # A chunk the reader entered before any readahead fetched it (the
                        # first of a file, or where a reader of items came back to): the
                        # push fills its back while requests take the front. Counted in
                        # _pushing once it starts (_push).
                        self.svc.nursery.start_soon(self._push, idx, ref, data, st)
                    if sequential and hi >= len(data):
                        self.svc.store.consumed(ref.digest)
            if len(piece) < hi - lo:
                piece = bytes(piece) + bytes(hi - lo - len(piece))  # past the data: a hole
            out.append(piece)
        return out[0] if len(out) == 1 else b"".join(out)

    def _copy_back(self, sequential: bool) -> bool:
        mode = self.svc.copy_back
        return mode == "always" or (mode == "sequential" and sequential)

    async def _log_read_error(self, offset: int, idx: int, exc: CkptfsError) -> None:
        path = await self.svc.path_of(self.ino)
        log.error("read of %s at offset %d (chunk %d) failed: %s", path, offset, idx, exc)

    def _readahead(self, st: ReadStream, idx: int, push: bool = False,
                   fetch: bool = True) -> bool:
        """On a sequential pattern of the stream (the first chunk counts), fetch the next
        chunks in parallel into the cache (and with ``push`` into the kernel's page cache)
        unless not ``fetch``. Returns whether the read is sequential."""
        sequential = st.sequential(idx)
        if not sequential or not fetch or self.svc.readahead <= 0:
            return sequential
        self._fetch_ahead(range(idx + 1, idx + 1 + max(1, self.svc.readahead // self.cs)),
                          st, push)
        return sequential

    def _fetch_ahead(self, indexes: range, st: ReadStream, push: bool) -> None:
        """Fetch these chunks in the background (those not cached or on their way), as
        far as the cache has room for readahead."""
        store = self.svc.store
        for nxt in indexes:
            ref = self._ref(nxt)
            if (ref is None or nxt in self.dirty or nxt in self.inflight or nxt in self._ahead
                    or store.cached(ref.digest)):
                continue
            if not store.reserve_ahead(ref):
                break  # readahead fills half the cache: the next reads start more
            self._ahead_digests.add(ref.digest)
            scope = trio.CancelScope()
            self._ahead[nxt] = scope
            # In the mount's nursery (a read request must not wait for it), in this
            # file's scope: ``stop_readahead`` ends it.
            self.svc.nursery.start_soon(self._prefetch, nxt, ref, scope, st if push else None)

    async def _prefetch(
        self, idx: int, ref: ChunkRef, scope: trio.CancelScope, push: ReadStream | None
    ) -> None:
        try:
            with scope:
                # The reader that needs this chunk will see (and log) any error itself.
                # Cancelled, it leaves a hung remote GET behind rather than wait for it.
                data = await self.svc.store.read(
                    ref, self._copy_back(True), abandon_on_cancel=True, ahead=True
                )
                if push is not None:
                    await self._push(idx, ref, data, push)
        except CkptfsError:
            pass
        except Exception:
            # A bug (or a library that changed under us): in the mount's nursery it would
            # end the daemon. The reader that needs the chunk meets it again (as EIO).
            log.exception("readahead of chunk %d of inode %d failed unexpectedly", idx, self.ino)
        finally:
            if self._ahead.get(idx) is scope:
                del self._ahead[idx]
            self._ahead_ended.set()
            self._ahead_ended = trio.Event()

    async def _push(self, idx: int, ref: ChunkRef, data: Buffer, st: ReadStream) -> None:
        """Hand the verified chunk to the kernel's page cache (vfs/pagepush.py), if the
        file is exactly its committed version and nobody may change it meanwhile; its
        pieces skip what the requests of ``st`` (the reader it is for) asked for."""
        pp = self.svc.page_push
        if pp is None or self._no_push or self.is_dirty() or self._ref(idx) != ref:
            return
        base = idx * self.cs
        n = pp.span(base, len(data), self.size)
        if n <= 0:
            return
        self._pushed_idx.add(idx)  # the kernel may skip these pages from now on (note)
        self._pushing += 1
        try:
            await pp.push(self.ino, base, memoryview(data)[:n], st.asked)
        except Exception:
            # Only an optimization: a bug here must not end the daemon (the mount's
            # nursery). The pages not pushed are requested by the kernel as usual.
            self._pushed_idx.discard(idx)
            log.exception("page-cache push of chunk %d of inode %d failed", idx, self.ino)
        finally:
            self._pushing -= 1
            if not self._pushing:
                self._pushes_ended.set()
                self._pushes_ended = trio.Event()

    async def hold_pushes(self) -> None:
        """Before the file may change (an open for writing, a truncate): no page-cache
        push starts until ``allow_pushes``, and those in flight have ended on return (a
        push of the old bytes landing after a write would leave them in the cache).
        Cancelled while it waits, it holds nothing."""
        self._no_push += 1
        try:
            while self._pushing:
                await self._pushes_ended.wait()
        except BaseException:
            self._no_push -= 1
            raise

    def allow_pushes(self) -> None:
        """The change ``hold_pushes`` was for is over (its handle closed)."""
        self._no_push -= 1

    @contextlib.asynccontextmanager
    async def pushes_held(self) -> AsyncIterator[None]:
        """``hold_pushes`` for the length of a block (a truncate without a writer)."""
        await self.hold_pushes()
        try:
            yield
        finally:
            self.allow_pushes()

    @property
    def readahead_running(self) -> int:
        """Readahead tasks of this file not ended yet."""
        return len(self._ahead)

    async def stop_readahead(self) -> None:
        """Cancel this file's readahead and wait until every one of its tasks ended."""
        while self._ahead:
            for scope in self._ahead.values():
                scope.cancel()  # again each time: a reopen may have started more
            await self._ahead_ended.wait()
