"""``PatternDetector``: checkpoint roots the user configured (``[[patterns]]``), for the
frameworks no built-in detector knows."""

from __future__ import annotations

import fnmatch

from ..config.model import DEFAULT_QUIET_S, PATTERN_COMMITS, PatternConfig
from .detector_base import (
    _BEGIN_KINDS,
    BEGIN,
    COMMIT,
    BaseDetector,
    _base,
    _join,
    _parent,
    _parts,
    _prefix,
    _under,
    is_temp_name,
)
from .events import RELEASE, RENAME, RMDIR, SYMLINK, UNLINK, Detection, FsEvent, NamespaceView

# --------------------------------------------------------------------------- patterns


class PatternDetector(BaseDetector):
    """User-configured checkpoint roots. The root of a path is its shortest prefix (at a
    ``/``) that matches the glob and is not a temp name. Commit:

    * ``file:NAME``: the release of the last writer of ``root/NAME``, or a rename onto it.
    * ``rename``: a rename onto a name matching the glob (the root itself).
    * ``quiescence``: at ``tick``, ``quiet_s`` after the last event under the root, if no
      writer is open under it.

    Patterns outrank every built-in detector. Their file and rename commits are not held
    for open writers (the user chose the signal; a broad root may keep a log file open).
    """

    priority = 100
    # The user chose the signal: trust it (a broad root may hold a log file open forever).
    hold_for_writers = False

    def __init__(self, glob: str, commit: str, quiet_s: float = DEFAULT_QUIET_S,
                 framework: str = "pattern") -> None:
        if not glob.startswith("/") or not (commit in PATTERN_COMMITS or commit.startswith("file:")):
            raise ValueError(f"bad pattern {glob!r} / {commit!r}")
        self.glob = glob.rstrip("/") or "/"
        self.commit = commit
        self.file = commit[5:] if commit.startswith("file:") else None
        self.quiet_ns = int(quiet_s * 1e9)
        self.name = framework
        self._last: dict[str, int] = {}  # quiescence: root -> time of the last event under it

    @classmethod
    def from_config(cls, cfg: PatternConfig) -> PatternDetector:
        return cls(cfg.glob, cfg.commit, cfg.quiet_s, cfg.framework)

    def root_of(self, path: str) -> str | None:
        parts = _parts(path)
        for n in range(1, len(parts) + 1):
            if fnmatch.fnmatchcase(_prefix(parts, n), self.glob):
                return None if is_temp_name(parts[n - 1]) else _prefix(parts, n)
        return None

    def observe(self, ev: FsEvent, ns: NamespaceView) -> list[Detection]:
        k, p, t = ev.kind, ev.path, ev.time_ns
        out: list[Detection] = []
        if k in (UNLINK, RMDIR) or (k == RENAME and ev.src is not None):
            gone = ev.src if k == RENAME and ev.src is not None else p
            for r in [r for r in self._last if _under(r, gone)]:
                del self._last[r]
        root = self.root_of(p)
        if root is None or (k in (UNLINK, RMDIR) and p == root):
            return out
        if self.file is None and self.commit == "quiescence":
            self._last[root] = t
        if k in _BEGIN_KINDS or k in (RENAME, SYMLINK):
            out.append(self._d(BEGIN, root, t, f"{k} of {p[len(_parent(root)) + 1:] or p}"))
        if self.file is not None:
            target = _join(root, self.file)
            if p == target and ((k == RELEASE and ev.last_writer) or (k == RENAME and not ev.is_dir)):
                out.append(self._d(COMMIT, root, t, f"{self.file} {'closed' if k == RELEASE else 'renamed in'}"))
        elif self.commit == "rename" and k == RENAME and p == root:
            out.append(self._d(COMMIT, root, t, f"rename {_base(ev.src or '?')} -> {_base(p)}"))
        return out

    def pending(self) -> bool:
        return bool(self._last)

    def tick(self, now_ns: int, ns: NamespaceView) -> list[Detection]:
        out: list[Detection] = []
        for root, last in list(self._last.items()):
            if now_ns - last < self.quiet_ns:
                continue
            if not ns.exists(root):
                del self._last[root]
            elif ns.open_writers_under(root) == 0:
                del self._last[root]
                out.append(self._d(COMMIT, root, now_ns,
                                   f"quiet for {(now_ns - last) / 1e9:.1f}s, no open writer"))
        return out

    def owns(self, path: str, ns: NamespaceView) -> str | None:
        return self.root_of(path)
