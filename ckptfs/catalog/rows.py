"""The rows a catalog engine returns: plain frozen dataclasses, the same for every engine."""

from __future__ import annotations

import stat
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

ROOT_INODE = 1


class CheckpointState(StrEnum):
    """The life of a checkpoint row. The values are what the catalog stores (and what
    ``ckptfs ls --json`` and the ``user.ckptfs.state`` attribute show); the schema's CHECK
    allows exactly these."""

    WRITING = "writing"  # a detector saw it begin; no commit marker yet
    COMMITTED = "committed"  # the framework's commit marker appeared
    PARTIAL = "partial"  # began, never committed, no writer left: never the latest
    EXPIRED = "expired"  # retention deletes it (leftover frames may still be queued)
    DELETED = "deleted"  # gone (by retention or by the application)


# Once a checkpoint is in one of these, a removal of its root by the application is not news.
FINISHED_STATES = frozenset({CheckpointState.EXPIRED, CheckpointState.DELETED})


@dataclass(frozen=True)
class CheckpointRow:
    """One checkpoint the detectors found: a directory or a file, by path inside the mount."""

    id: int
    root: str
    framework: str
    step: int | None
    state: CheckpointState
    begin_ns: int | None
    commit_ns: int | None
    reason: str | None
    tags: str  # comma-separated, sorted

    @property
    def tag_set(self) -> frozenset[str]:
        return frozenset(t for t in self.tags.split(",") if t)

    def as_dict(self) -> dict[str, Any]:
        """The row as a mapping with the state as its stored string: the JSON record of the
        ``user.ckptfs.checkpoint`` attribute (keys and values as before rows were typed)."""
        return {"id": self.id, "root": self.root, "framework": self.framework, "step": self.step,
                "state": self.state.value, "begin_ns": self.begin_ns, "commit_ns": self.commit_ns,
                "reason": self.reason, "tags": self.tags}


@dataclass(frozen=True)
class Inode:
    ino: int
    mode: int
    uid: int
    gid: int
    size: int
    nlink: int
    atime_ns: int
    mtime_ns: int
    ctime_ns: int
    target: bytes | None = None
    rdev: int = 0

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)

    @property
    def is_reg(self) -> bool:
        return stat.S_ISREG(self.mode)


@dataclass
class Around:
    """What a namespace change (create, unlink, rename) tells its caller besides its
    result, read in the change's own transaction instead of further catalog calls: the
    attributes of each directory it changed as they are after it (``dirs``), the renamed
    inode after a rename (``moved``), and with ``paths`` the path of every directory the
    change named (``dir_paths``). Filled by the change's transaction (again by each rerun
    of it): what it holds means something only once the call returned."""

    paths: bool = False
    dirs: dict[int, Inode] = field(default_factory=dict)
    dir_paths: dict[int, str] = field(default_factory=dict)
    moved: Inode | None = None


@dataclass(frozen=True)
class ChunkRef:
    """Where one chunk of plaintext lives: its digest, plaintext length and tiers."""

    digest: bytes
    length: int
    tiers: tuple[str, ...]

    @property
    def key(self) -> str:
        return self.digest.hex()


@dataclass(frozen=True)
class UploadJob:
    digest: bytes
    tier: str
    length: int
    enqueued_ns: int
    attempts: int
    sources: tuple[str, ...]  # tiers holding a valid copy to upload from


@dataclass(frozen=True)
class Backlog:
    chunks: int
    bytes: int
    oldest_enqueued_ns: int | None
    blocked: int
    last_error: str | None


@dataclass(frozen=True)
class Deletion:
    digest: bytes
    tier: str
    length: int
    attempts: int


@dataclass(frozen=True)
class DeletionBacklog:
    """The deletion queue of one tier."""

    tier: str
    chunks: int
    bytes: int
    oldest_enqueued_ns: int | None
    failing: int  # rows whose last attempt failed
    last_error: str | None


@dataclass(frozen=True)
class ExtentReplicas:
    """One extent of a file and whether a valid copy of its chunk is on the asked tiers
    (``ckptfs prefetch``'s question)."""

    ino: int
    digest: bytes
    length: int
    on_tiers: bool


@dataclass(frozen=True)
class SessionRow:
    """A node's session in a shared catalog (times: the database's clock, ns)."""

    sid: str
    node: str
    started_ns: int
    beat_ns: int
    expires_ns: int
    info: str
    live: bool  # not expired by the database's clock when read


@dataclass(frozen=True)
class SessionEnd:
    """What ending a session (a clean close, or the cleanup of an expired one) did: the
    open-handle rows it removed, the inodes with no name left that it dropped (their
    chunks' references, ``digests``, are for the caller to collect), and the checkpoints it
    marked partial."""

    sid: str
    node: str
    handles: int = 0
    dropped: tuple[int, ...] = ()
    digests: tuple[bytes, ...] = ()
    partial: tuple[str, ...] = ()


@dataclass(frozen=True)
class Registered:
    """A new session; ``previous``: this node's own earlier session (expired, or the
    caller's ``earlier`` one, live), ended on the way."""

    sid: str
    previous: SessionEnd | None = None
