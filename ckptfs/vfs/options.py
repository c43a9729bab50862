"""What the composition root (mount.py ``build``) gives the Filesystem besides the catalog,
the chunk store and the memory: its options, the daemon's services it talks to, the
kernel's callbacks and the namespace rules, each a small frozen bundle."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ..checkpoints.events import FsEvent
from ..checkpoints.fence import SignalFence
from ..chunks.tierview import TierView
from ..config import DEFAULT_READAHEAD, DurabilityPolicy, GovernanceConfig
from .access import Access
from .control import DrillRunner, GcRunner, ScrubRunner
from .openrows import SessionId
from .pagepush import PagePush
from .quota import Quotas


class EventSink(Protocol):
    """Where filesystem events go (checkpoints/tracker.py); never blocks. ``fence``: the
    signals not yet queued; ``node``: whose records a restart replays (tracker.py)."""

    fence: SignalFence
    node: str

    def push(self, ev: FsEvent) -> None: ...


class DurableWaiter(Protocol):
    """The upload queue, for ``durability = "remote"`` (upload/uploader.py)."""

    async def wait_durable(self, digests: set[bytes], timeout_s: float) -> bool: ...


@dataclass(frozen=True)
class FsOptions:
    """``chunk_size``: the catalog's; ``policies``: the durability policies by path;
    ``readahead``, ``copy_back``: the read options (config ``[reads]``); ``shared``: the
    catalog is shared with other nodes (docs/multinode.md), whose changes no cache of this
    node sees: the caches that assume one writer are off, and an open drops the kernel's
    cached pages of a file another node changed."""

    chunk_size: int
    policies: tuple[DurabilityPolicy, ...] = ()
    readahead: int = DEFAULT_READAHEAD
    copy_back: str = "sequential"
    shared: bool = False


@dataclass(frozen=True)
class FsPeers:
    """The daemon's services the filesystem talks to: ``tiers`` (the local tiers' roots and
    usage, whether a remote exists: statfs, syncfs at shutdown), ``uploader`` (waits for
    remote durability), ``gc`` (retention now), ``tracker`` (checkpoint events; None: off),
    ``session``: this node's session in the shared catalog, under which the inodes it holds
    open are noted (an inode with no name left is dropped by the last closer on any node;
    None, and always with one node: none); ``scrub``: a scrub pass now (``ckptfs scrub``;
    None: none)."""

    tiers: TierView
    uploader: DurableWaiter
    gc: GcRunner
    tracker: EventSink | None = None
    session: SessionId | None = None
    scrub: ScrubRunner | None = None
    drill: DrillRunner | None = None  # restore drills (``user.ckptfs.drill``); None: none


@dataclass(frozen=True)
class FsKernel:
    """The kernel's callbacks (None without a kernel): ``invalidate`` drops the cached pages
    and attributes of an inode, ``invalidate_entry`` a name; ``page_push`` hands chunks
    fetched ahead of a reader to the kernel's page cache (vfs/pagepush.py; None, and always
    with a shared catalog: off)."""

    invalidate: Callable[[int], None] | None = None
    invalidate_entry: Callable[[int, bytes], None] | None = None
    page_push: PagePush | None = None


@dataclass(frozen=True)
class FsGovernance:
    """The namespace rules (docs/governance.md): ``access``, asked at each operation that
    reaches a name or an inode (vfs/access.py; the default: no namespace, no rule, as an
    unguarded mount); ``quotas``: the namespaces,
    whose files are charged to them (vfs/quota.py; None: no namespace);
    ``sealed_namespace``: the encrypted namespace of a path (None: none is encrypted)."""

    access: Access = field(default_factory=lambda: Access(GovernanceConfig()))
    quotas: Quotas | None = None
    sealed_namespace: Callable[[str], str | None] | None = None
