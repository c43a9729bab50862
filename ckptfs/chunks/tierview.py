"""What a front end and the janitor may know of the tiers, without the tiers themselves:
the local tiers' roots (a syncfs of their filesystems at shutdown), their usage (statfs,
the janitor's watermark), and whether any remote tier is configured."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import trio

from ..errors import CkptfsError
from ..tiers.base import Tier, TierUsage

log = logging.getLogger("ckptfs.chunks")


class TierView:
    def __init__(self, tiers: Sequence[Tier], io: trio.CapacityLimiter) -> None:
        """``io``: the limiter of local tier I/O (the chunk service's)."""
        self._local = [t for t in tiers if t.kind == "local"]
        self.has_remotes = any(t.kind != "local" for t in tiers)
        self._io = io

    def roots(self) -> list[Path | None]:
        """The local tiers' directories (None: a tier without one)."""
        return [getattr(t, "root", None) for t in self._local]

    async def usage(self) -> list[TierUsage]:
        """Each local tier's usage (one that cannot say is left out, with a warning)."""

        def gather() -> list[TierUsage]:
            out = []
            for t in self._local:
                try:
                    out.append(t.usage())
                except CkptfsError as exc:
                    log.warning("statfs: %s", exc)
            return out

        return await trio.to_thread.run_sync(gather, limiter=self._io)

    def fill(self) -> tuple[int, int]:
        """Blocking: (bytes in use, bytes in all) over the local tiers: a capped tier counts
        its cap, an uncapped one its device (once per device, whoever fills it)."""
        used = total = 0
        seen: set[int] = set()
        for t in self._local:
            try:
                u = t.usage()
            except CkptfsError:
                continue
            if u.capped or u.device not in seen:
                used += u.total - u.free
                total += u.total
                seen.add(u.device)
        return used, total
