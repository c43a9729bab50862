"""The namespace generation: paths cached for checkpoint events (on a Handle, by the
open-file lifecycle) stay valid while no rename, unlink, rmdir or link ran or runs: every
one bumps the generation when it finishes. One object, shared by the Filesystem (which
changes paths) and the open files (which cache them), so the counter and its checks live
in one place; all of it runs on the trio thread."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .handles import Handle


class PathGeneration:
    def __init__(self) -> None:
        self.gen = 0
        self.busy = 0

    @contextlib.contextmanager
    def changing(self) -> Iterator[None]:
        """Around a catalog change that may change the path of existing inodes."""
        self.busy += 1
        try:
            yield
        finally:
            self.busy -= 1
            self.gen += 1

    def token(self) -> int | None:
        """Taken before a catalog call resolves a path: the generation the path may be
        cached at (None: a path change is under way, do not cache)."""
        return self.gen if self.busy == 0 else None

    def current(self, gen: int) -> bool:
        """Is something resolved at generation ``gen`` still valid (no change since, and
        none under way)?"""
        return self.busy == 0 and gen == self.gen

    def cache(self, h: Handle, path: str, token: int | None) -> None:
        if token is not None and not path.startswith("<unlinked>"):
            h.path, h.path_gen = path, token

    def cached(self, h: Handle) -> str | None:
        """A handle's cached path, if still valid."""
        if h.path is not None and self.busy == 0 and h.path_gen == self.gen:
            return h.path
        return None
