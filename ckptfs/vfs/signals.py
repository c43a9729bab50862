"""The checkpoint tracker's commit signals from the filesystem: the release event of a
writing handle, with the file as committed (size, mode, tail, a small file's content),
and at start the replay of the signals a crash may have kept from the tracker
(checkpoints/tracker.py, "Crashes")."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from ..catalog import ChunkRef, Inode
from ..catalog.protocols import AuditCatalog, ContentsCatalog, MetaCatalog, NamespaceCatalog
from ..checkpoints.events import SMALL_FILE, TAIL, FsEvent
from ..checkpoints.tracker import replay_key
from ..errors import CkptfsError
from .openfile import OpenFile
from .openrows import Db
from .options import EventSink

log = logging.getLogger("ckptfs.vfs")


class SignalsCatalog(NamespaceCatalog, ContentsCatalog, MetaCatalog, AuditCatalog, Protocol):
    """A file's path, row and extents; the replay point (meta) and the records replayed."""


class CommitSignals:
    """``tracker``: where the events go (None: off, nothing is sent); ``read_committed``
    reads bytes [lo, hi) of a file's committed chunks (Filesystem._read_committed)."""

    def __init__(
        self, catalog: SignalsCatalog, db: Db, tracker: EventSink | None, chunk_size: int,
        read_committed: Callable[[dict[int, ChunkRef], int, int], Awaitable[bytes]],
    ) -> None:
        self.catalog = catalog
        self.db = db
        self.tracker = tracker
        self.chunk_size = chunk_size
        self._read_committed = read_committed

    async def released(
        self, f: OpenFile, last: bool,
        known: tuple[str, Inode, dict[int, ChunkRef]] | None = None,
    ) -> None:
        """After a writing handle closed: the committed size, mode, tail (and content of a
        small file) as the catalog has them (``known``: taken from a clean open file before
        the release, see FileIO._committed_state), and the chunks; never from the open
        file's later state, which a concurrent request (the kernel sends RELEASE
        asynchronously) may change."""
        ev = await self.committed_event(f.ino, last, f, known)
        if ev is not None:
            assert self.tracker is not None
            self.tracker.push(ev)

    async def committed_event(
        self, ino: int, last: bool, f: OpenFile | None = None,
        known: tuple[str, Inode, dict[int, ChunkRef]] | None = None, *,
        time_ns: int | None = None, replayed: bool = False,
    ) -> FsEvent | None:
        """The release event of ``ino`` as committed (``released``; ``f``: the open
        file whose stored end may save a read). None: the file is gone."""

        def committed() -> tuple[str, Inode, dict[int, ChunkRef]]:
            return (self.catalog.path_of(ino), self.catalog.get_inode(ino),
                    self.catalog.extents(ino))

        if known is not None:
            path, inode, refs = known
        else:
            try:
                path, inode, refs = await self.db(committed)
            except CkptfsError:
                return None  # deleted meanwhile
        if inode.nlink <= 0 or not inode.is_reg:
            return None  # unlinked before its last close: no checkpoint to detect
        content = tail = None
        lo = 0 if inode.size <= SMALL_FILE else inode.size - TAIL
        data = None if f is None else self._known_end(f, refs, lo, inode.size)
        try:
            if data is None:  # not what this open file stored last: read it back
                data = await self._read_committed(refs, lo, inode.size)
            content = data if inode.size <= SMALL_FILE else None
            tail = data[-TAIL:]
        except CkptfsError:
            pass  # the read logged it; the event goes without the bytes
        return FsEvent(
            "release", path, time.time_ns() if time_ns is None else time_ns, size=inode.size,
            mode=inode.mode, last_writer=last, content=content, tail=tail, replayed=replayed,
        )

    async def replay(self) -> int:
        """At start, before serving: the commit signals a crash may have kept from the
        tracker, replayed from the catalog's records (checkpoints/tracker.py, "Crashes"):
        each close's commit and each rename of this node from its replay point on, in
        their order, as events marked ``replayed``. Returns how many were queued."""
        if self.tracker is None:
            return 0
        key = replay_key(self.tracker.node)
        raw = await self.db(self.catalog.get_meta, key)
        if raw is None:  # the first mount that replays: from here on
            await self.db(self.catalog.set_meta, key, str(time.time_ns()))
            return 0
        since = int(raw)
        node = self.tracker.node
        entries = [e for e in await self.db(self.catalog.audit_entries, 0, since)
                   if e.node == node and e.action in ("commit", "rename")]
        # A file's last commit stands for its earlier ones (the event reads it as it is now).
        last_commit: dict[int, int] = {}
        details = [json.loads(e.detail) for e in entries]
        for i, (e, d) in enumerate(zip(entries, details, strict=True)):
            if e.action == "commit" and isinstance(d.get("ino"), int):
                last_commit[d["ino"]] = i
        events: list[FsEvent] = []
        for i, (e, d) in enumerate(zip(entries, details, strict=True)):
            ino = d.get("ino")
            if not isinstance(ino, int):
                continue
            if e.action == "commit":
                if last_commit.get(ino) == i:
                    ev = await self.committed_event(
                        ino, True, time_ns=e.time_ns, replayed=True)
                    if ev is not None:
                        events.append(ev)
                continue
            src = d.get("src")
            # Paths of names that are not UTF-8 are stored escaped: not to be trusted here.
            if not isinstance(src, str) or "\\" in src or "\\" in e.path:
                continue
            try:
                moved = await self.db(self.catalog.get_inode, ino)
            except CkptfsError:
                continue  # gone since: nothing of it to detect
            events.append(FsEvent("rename", e.path, e.time_ns, src=src, is_dir=moved.is_dir,
                                  size=moved.size, mode=moved.mode, replayed=True))
        for ev in events:
            self.tracker.push(ev)
        if events:
            log.info("replaying %d commit and rename record(s) since the replay point",
                     len(events))
        return len(events)

    def _known_end(self, f: OpenFile, refs: dict[int, ChunkRef], lo: int, hi: int) -> bytes | None:
        """Bytes [lo, hi) of the committed file from what the open file stored last, if
        that chunk is the one the catalog names at the end and the range is in memory."""
        if f.chunk_end is None or hi == 0:
            return None
        idx, digest, end = f.chunk_end
        ref = refs.get(idx)
        base = idx * self.chunk_size
        if ref is None or ref.digest != digest or (hi - 1) // self.chunk_size != idx:
            return None
        start = base + ref.length - len(end)  # file offset of end[0]
        if base + ref.length != hi or lo < start:
            return None
        return end[lo - start:]
