"""What an open file is given (vfs/openfile.py): the memory budget its chunk buffers draw
from (backpressure on writers), and the services of the filesystem around it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from ..catalog.protocols import AuditCatalog
from ..chunks.service import FrontEndChunks
from ..codec.staged import StagePool
from ..config.model import DEFAULT_READAHEAD
from .pagepush import PagePush


class MemoryBudget:
    """Bytes of chunk buffers in memory; writers wait (backpressure) when it is spent."""

    def __init__(self, limit: int, spill: Callable[[], None] | None = None) -> None:
        self.limit = limit
        self.used = 0
        self.in_flight = 0  # chunk writes running; each will release its share
        self._spill = spill
        self._released = trio.Event()  # set (and replaced) by every release

    async def acquire(self, n: int) -> None:
        # Everything runs on the trio thread: no lock, just wait for the next release.
        while self.used + n > self.limit and self.used > 0:
            if self.in_flight == 0 and self._spill is not None:
                self._spill()  # nothing would ever release: write partial chunks out
            await self._released.wait()
        self.used += n

    def release(self, n: int) -> None:
        self.used -= n
        self._released.set()
        self._released = trio.Event()

    async def wait_empty(self) -> None:
        """Until no chunk buffer is in memory (no save runs): the uploader's deferral."""
        while self.used > 0:
            await self._released.wait()


@dataclass
class Services:
    """What an OpenFile needs from the filesystem around it."""

    store: FrontEndChunks  # chunk writes and reads, and the commit of a version (chunks/commit.py)
    budget: MemoryBudget
    nursery: trio.Nursery  # where chunk writes and readahead run
    chunk_size: int
    path_of: Callable[[int], Awaitable[str]]  # an inode's path, for error messages
    # Tells the kernel to drop its cached pages and attributes of an inode whose content
    # changed behind its back (a failed write was discarded). None without a kernel.
    invalidate: Callable[[int], None] | None = None
    # Reads: bytes fetched ahead of a sequential reader; when a chunk read from a remote
    # tier only is copied to a local one ("sequential", "always", "never").
    readahead: int = DEFAULT_READAHEAD
    copy_back: str = "sequential"
    # Reused buffers that a save's chunks are assembled in (codec/staged.py); None: the
    # chunks keep pyfuse3's bytes as parts.
    stages: StagePool | None = None
    # The encrypted namespace of an inode, whose key seals its chunks (None: plain); None
    # when no namespace is encrypted: a write asks nothing.
    namespace_of: Callable[[int], Awaitable[str | None]] | None = None
    # Hands chunks fetched ahead to the kernel's page cache (vfs/pagepush.py); None: off.
    page_push: PagePush | None = None
    # Where a refusal's audit record is noted (None: not recorded).
    audit: AuditCatalog | None = None
