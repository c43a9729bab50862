"""A checkpoint in numbers, from the catalog: its files and bytes, the tiers holding every
chunk, how long the save took. The daemon's metrics observe it for each commit; the
commands (ls, show, status, plan --from) print it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..catalog import CheckpointRow
from ..catalog.protocols import (
    CheckpointCatalog,
    ContentsCatalog,
    MetaCatalog,
    NamespaceCatalog,
    SessionCatalog,
)
from .reach import Reach
from .retention import run_of


@dataclass
class CheckpointSummary:
    path: str  # on this machine (mount point + root)
    root: str  # inside the mount
    framework: str
    step: int | None
    state: str
    tags: list[str]
    namespace: str  # first path component inside the mount
    run: str  # the directory holding the checkpoint, inside the mount
    files: int = 0
    logical_bytes: int = 0
    stored_bytes: int = 0
    # Tiers holding a valid copy of every chunk, local ones too (whether a new node would
    # recover it from the remote is catalog/durability.py).
    durable_on: list[str] = field(default_factory=list)
    # Chunks with no valid copy a live node can read (none anywhere, or, with a shared
    # catalog, only on local tiers of nodes whose session ended: reach.py).
    missing_chunks: int = 0
    open_writers: int = 0  # files under it open for writing on some node (shared catalog)
    write_s: float | None = None  # first write to commit
    completion_skew_s: float | None = None  # last minus first file mtime
    reason: str | None = None


class SummaryCatalog(NamespaceCatalog, ContentsCatalog, MetaCatalog, SessionCatalog, Protocol):
    """What a summary reads: the files under a checkpoint, their chunks, the recorded
    tiers, and (Reach) the nodes' sessions and writers."""

    shared: bool  # several nodes use the catalog


class RunsCatalog(SummaryCatalog, CheckpointCatalog, Protocol):
    """What the checkpoint commands read: the checkpoint rows and their summaries."""



def files_of(catalog: NamespaceCatalog, root: str) -> list[tuple[int, int, int]]:
    """(ino, size, mtime_ns) of the regular files at or under root."""
    return [(i.ino, i.size, i.mtime_ns) for i in catalog.files_under(root)]


def summarize(
    catalog: SummaryCatalog, mnt: Path, row: CheckpointRow, reach: Reach | None = None
) -> CheckpointSummary:
    """The summary of the checkpoint ``row`` mounted at ``mnt`` (``reach``: read once for
    several rows; None reads it)."""
    if reach is None:
        reach = Reach.of(catalog)
    root = row.root
    parts = [p for p in root.split("/") if p]
    info = CheckpointSummary(
        path=str(mnt) + root, root=root, framework=row.framework, step=row.step,
        state=row.state.value, tags=[t for t in row.tags.split(",") if t],
        namespace=parts[0] if len(parts) > 1 else "", run=run_of(root), reason=row.reason,
    )
    files = files_of(catalog, root)
    info.files = len(files)
    info.logical_bytes = sum(size for _, size, _ in files)
    chunks: dict[bytes, int] = {}
    tiers: dict[bytes, set[str]] = {}
    for ino, _, _ in files:
        for ref in catalog.extents(ino).values():
            chunks[ref.digest] = ref.length
            tiers[ref.digest] = set(ref.tiers)
    info.stored_bytes = sum(chunks.values())
    info.missing_chunks = sum(1 for d in chunks if not reach.readable(tiers[d]))
    info.open_writers = reach.writers_under(root)
    names = [t["name"] for t in catalog.recorded_tiers()]
    info.durable_on = [n for n in names if chunks and all(n in tiers[d] for d in chunks)]
    if row.begin_ns is not None and row.commit_ns is not None:
        info.write_s = (row.commit_ns - row.begin_ns) / 1e9
    if files:
        mtimes = [m for _, _, m in files]
        info.completion_skew_s = (max(mtimes) - min(mtimes)) / 1e9
    return info
