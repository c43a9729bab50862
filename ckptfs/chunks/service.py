"""The chunk service as its callers see it: what a front end (the VFS, or a data path that
is not FUSE) and the commit of a file call, typed as Protocols so that they depend on no
concrete store (chunks/store.py ``ChunkStore`` implements them all).

``ChunkService`` is the core: store and read chunks, release and collect them, fsync
them, commit a file's version, stage a file's chunks locally. A front end that reads
sequentially also gives the readahead hints (``ReadAhead``); the VFS's unlink collects
inside its own catalog call (``UnlinkCollect``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from ..catalog import ChunkRef
from ..codec import frame
from ..codec.staged import Staged
from ..errors import CkptfsError
from ..stats import Stats
from .commit import FileVersion
from .residency import Locations, Residency


class ChunkService(Protocol):
    @property
    def residency(self) -> Residency:
        """Where copies of each chunk may be (a writer asks for its path's locations)."""

    @property
    def stats(self) -> Stats:
        """The live counters (a front end counts its own failures there)."""

    async def write(
        self, data: Sequence[frame.Buffer] | Staged, allowed: Locations = None,
        namespace: str | None = None,
    ) -> ChunkRef:
        """Store one chunk; a verified, pinned reference to it (chunks/writer.py)."""

    async def read(
        self, ref: ChunkRef, copy_back: bool = False, log_missing: bool = True,
        abandon_on_cancel: bool = False, ahead: bool = False,
    ) -> frame.Buffer:
        """The verified plaintext of a chunk (chunks/reader.py)."""

    def release(self, refs: Iterable[ChunkRef]) -> list[ChunkRef]:
        """Unpin chunks not committed; them as they are now, for ``collect``."""

    async def collect(self, refs: Iterable[ChunkRef]) -> None:
        """Drop the chunks among ``refs`` that nothing references (chunks/gc.py)."""

    async def sync(self, refs: Iterable[ChunkRef]) -> None:
        """fsync these chunks' frames (those not known to be synced)."""

    async def sync_catalog(self) -> None:
        """fsync the catalog (after the chunk frames it names)."""

    async def commit(
        self, v: FileVersion, synced: bool,
        sync_failed: Callable[[CkptfsError], None] | None = None,
    ) -> dict[int, ChunkRef] | None:
        """Commit a file's version (chunks/commit.py)."""

    async def stage(self, ref: ChunkRef) -> bool:
        """A valid copy of this chunk on a local tier; False if none has room."""


class ReadAhead(Protocol):
    """Hints of a sequential reader to the read cache (chunks/cache.py)."""

    def cached(self, digest: bytes) -> bool: ...

    def reserve_ahead(self, ref: ChunkRef) -> bool: ...

    def forget_ahead(self, digests: Iterable[bytes]) -> None: ...

    def consumed(self, digest: bytes) -> None: ...


class UnlinkCollect(Protocol):
    """``collect`` split for a caller already in a catalog thread (the VFS's unlink)."""

    def collect_digests_blocking(self, digests: Iterable[bytes]) -> dict[bytes, list[str]]: ...

    def collected(self, gone: dict[bytes, list[str]]) -> None: ...


class FrontEndChunks(ChunkService, ReadAhead, UnlinkCollect, Protocol):
    """What the VFS is given of the chunk service."""
