"""What every node can still read, and what some node still writes: the facts that decide
whether a committed checkpoint is complete (``ckptfs latest``, ``ls``, ``show``), read from
the catalog alone so that every node gives the same answer.

* A chunk is **readable** if it has a valid copy on a tier any live node can reach: a
  remote tier, or a local tier of a node whose session is live (a shared catalog names
  local tiers ``NODE:NAME``, catalog/binding.py). A node whose session expired or ended
  counts as lost: what only its local tiers hold cannot be read anywhere until it returns.
  With the embedded catalog every recorded copy counts (one node: its own tiers). A copy
  recorded bad (a read, ``verify`` or fsck found it missing or corrupt) is no copy: the
  catalog's extents list valid copies only.
* A checkpoint with a file open for writing on **any** node (the sessions' open-handle
  rows; with the embedded catalog the daemon's tracker alone knows, and its row says)
  is still being written, whatever its row says.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from ..catalog.rows import SessionRow


class ReachFacts(Protocol):
    """What the definition reads of the catalog (any engine)."""

    shared: bool

    def sessions(self) -> list[SessionRow]: ...

    def open_writer_paths(self) -> list[str]: ...


def _under(path: str, root: str) -> bool:
    return path == root or root == "/" or path.startswith(root.rstrip("/") + "/")


@dataclass(frozen=True)
class Reach:
    shared: bool
    live_nodes: frozenset[str]
    writers: tuple[str, ...]  # paths open for writing on some node

    @classmethod
    def of(cls, catalog: ReachFacts) -> Reach:
        """Read once per command (blocking: catalog reads)."""
        if not catalog.shared:  # one node, which notes no open handles in its catalog
            return cls(False, frozenset(), ())
        live = frozenset(s.node for s in catalog.sessions() if s.live)
        return cls(True, live, tuple(catalog.open_writer_paths()))

    def readable_on(self, tier: str) -> bool:
        """A copy on ``tier`` can be read by some live node."""
        if not self.shared or ":" not in tier:
            return True  # a remote tier (or the one node's own)
        return tier.split(":", 1)[0] in self.live_nodes

    def readable(self, tiers: Iterable[str]) -> bool:
        return any(self.readable_on(t) for t in tiers)

    def writers_under(self, root: str) -> int:
        """Files at or under ``root`` open for writing on some node."""
        return sum(1 for p in self.writers if _under(p, root))
