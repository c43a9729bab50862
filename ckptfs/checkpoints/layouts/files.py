"""Detectors of single-file checkpoints: torch.save, safetensors, Lightning ``*.ckpt``.

Each commits at the release of the file's last writer or at a rename onto its final name
(the call sequences: docs/frameworks.md).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from ..detector_base import (
    BEGIN,
    COMMIT,
    BaseDetector,
    _base,
    _join,
    _parent,
    _parts,
    _prefix,
    is_temp_name,
    step_from_name,
    zip_at_eof,
)
from ..events import (
    CHMOD,
    CREATE,
    RELEASE,
    RENAME,
    RMDIR,
    SYMLINK,
    UNLINK,
    WRITE,
    Detection,
    FsEvent,
    NamespaceView,
)
from .dirs import DCP_NAME_RE

# --------------------------------------------------------------------------- torch.save

# Begin at the first write only for names that are almost surely torch.save files: other
# names get their begin when they commit (a begin that never commits is a partial
# checkpoint, and a stray data.bin must not become one).
_TORCH_BEGIN_EXTS = (".pt", ".pth")
# Zip-based formats that are not torch.save checkpoints.
_NOT_TORCH_EXTS = (
    ".zip", ".npz", ".whl", ".jar", ".egg", ".apk", ".epub", ".xpi",
    ".docx", ".xlsx", ".pptx", ".odt", ".ods", ".odp",
)


class TorchSaveDetector(BaseDetector):
    """A single file written by torch.save: committed at the release of its last writer with
    a zip end-of-central-directory at EOF; or a complete zip written under a temp name and
    renamed onto its final name (``torch.save(x, p + ".tmp"); os.replace(...)``).

    The legacy (non-zip) format is not recognised.
    """

    name = "torch"
    priority = 10

    def __init__(self) -> None:
        self._complete_temps: set[str] = set()  # temp files released as a complete zip

    @staticmethod
    def _candidate(path: str) -> bool:
        name = _base(path)
        return not name.lower().endswith(_NOT_TORCH_EXTS) and not DCP_NAME_RE.match(name)

    def observe(self, ev: FsEvent, ns: NamespaceView) -> list[Detection]:
        k, p = ev.kind, ev.path
        if k in (CREATE, WRITE):
            self._complete_temps.discard(p)
            if p.endswith(_TORCH_BEGIN_EXTS) and not is_temp_name(_base(p)):
                return [self._d(BEGIN, p, ev.time_ns, f"{k} of {_base(p)}")]
        elif k == RELEASE and ev.last_writer:
            if not zip_at_eof(ev.tail) or not self._candidate(p):
                return []
            if is_temp_name(_base(p)):
                self._complete_temps.add(p)  # commits when renamed onto its final name
                return []
            return [self._d(COMMIT, p, ev.time_ns, "last writer closed; zip directory at EOF")]
        elif k == RENAME and not ev.is_dir and ev.src is not None:
            if ev.src in self._complete_temps:
                self._complete_temps.discard(ev.src)
                if is_temp_name(_base(p)):
                    self._complete_temps.add(p)
                elif self._candidate(p):
                    return [self._d(COMMIT, p, ev.time_ns,
                                    f"complete torch.save temp {_base(ev.src)} renamed in")]
        elif k == UNLINK:
            self._complete_temps.discard(p)
        return []


# --------------------------------------------------------------------------- safetensors


class SafetensorsDetector(BaseDetector):
    """``*.safetensors``. 0.8: ``.tmpXXXXXX`` renamed onto the name while its fd is still
    open: the rename is the commit (final, not held). <=0.7: O_TRUNC create then release of
    the last writer (the file is preallocated, so only the release counts)."""

    name = "safetensors"
    priority = 15
    hold_for_writers = False  # 0.8 renames with its fd open; the rename is final

    def __init__(self) -> None:
        self._written: set[str] = set()  # written under their own name since the last commit

    def observe(self, ev: FsEvent, ns: NamespaceView) -> list[Detection]:
        k, p = ev.kind, ev.path
        if k in (CREATE, WRITE) and p.endswith(".safetensors"):
            self._written.add(p)
            return [self._d(BEGIN, p, ev.time_ns, f"{k} of {_base(p)}")]
        if k == RELEASE and ev.last_writer and p in self._written:
            self._written.discard(p)
            if ev.size >= 8:  # at least the header length; an empty file is no checkpoint
                return [self._d(COMMIT, p, ev.time_ns, "last writer closed (safetensors <=0.7)")]
        elif k == RENAME and not ev.is_dir and p.endswith(".safetensors"):
            self._written.discard(p)
            if ev.src is not None:
                self._written.discard(ev.src)
            return [self._d(COMMIT, p, ev.time_ns,
                            f"rename {_base(ev.src or '?')} -> {_base(p)} (safetensors >=0.8)")]
        elif k == UNLINK:
            self._written.discard(p)
        return []

    def owns(self, path: str, ns: NamespaceView) -> str | None:
        return path if path.endswith(".safetensors") else None


# --------------------------------------------------------------------------- Lightning


@dataclass
class _CkptFile:
    complete: bool = False  # the last writer closed with a zip directory at EOF
    chmods: int = 0  # chmods since the last write
    last_ns: int = 0


class LightningDetector(BaseDetector):
    """Lightning ``*.ckpt`` files.

    * Same filesystem: the fsspec temp is renamed onto the ``.ckpt`` name: commit there.
    * Cross-device (``$TMPDIR`` elsewhere): ``shutil.move`` copies into the final name
      (create O_TRUNC, sendfile, release), then copystat (utimens, chmod 0600) and fsspec's
      chmod to the umask mode: commit at that second chmod, once the copy closed complete
      (in whichever order the release and the chmods arrive).
    * A complete ``.ckpt`` not followed by chmods within ``settle_s`` (a plain torch.save to
      a .ckpt name, or a copy interrupted between the chmods) commits at ``tick``.
    * ``save_last="link"``: ``last.ckpt`` symlink to a committed ``.ckpt``: a commit of the
      link path (step of the target; the reason names the target), after the target's.
    * A ``.ckpt`` that is a directory (DeepSpeed, sharded FSDP strategies) is not Lightning's
      to detect: the DeepSpeed (``x.ckpt/checkpoint``) or DCP (``x.ckpt``) detector reports it.
    """

    name = "lightning"
    priority = 20

    def __init__(self, settle_s: float = 5.0) -> None:
        self.settle_ns = int(settle_s * 1e9)
        self._files: dict[str, _CkptFile] = {}  # .ckpt files written since their commit
        self._committed: set[str] = set()
        self._waiting_links: dict[str, list[str]] = {}  # target -> links made before it committed

    def _commit(self, path: str, t: int, reason: str, framework: str | None = None) -> list[Detection]:
        self._files.pop(path, None)
        self._committed.add(path)
        out = [self._d(COMMIT, path, t, reason, framework=framework)]
        for link in self._waiting_links.pop(path, []):
            out.append(self._link_commit(link, path, t))
        return out

    def _link_commit(self, link: str, target: str, t: int, note: str = "") -> Detection:
        return self._d(COMMIT, link, t, f"symlink -> {target}{note}",
                       step=step_from_name(_base(target)))

    def observe(self, ev: FsEvent, ns: NamespaceView) -> list[Detection]:
        k, p, t = ev.kind, ev.path, ev.time_ns
        if k in (UNLINK, RMDIR) or (k == RENAME and ev.src is not None):
            self._forget(ev.src if k == RENAME and ev.src is not None else p)
        if not p.endswith(".ckpt"):
            return []
        if k in (CREATE, WRITE):
            self._files[p] = _CkptFile(last_ns=t)
            self._committed.discard(p)
            return [self._d(BEGIN, p, t, f"{k} of {_base(p)}")]
        f = self._files.get(p)
        if k == RELEASE and ev.last_writer and f is not None:
            f.complete, f.last_ns = zip_at_eof(ev.tail), t
            if f.complete and f.chmods >= 2:
                return self._commit(p, t, "copy closed after its final chmod")
        elif k == CHMOD and f is not None:
            f.chmods += 1
            f.last_ns = t
            if f.complete and f.chmods >= 2:
                return self._commit(p, t, f"final chmod {ev.mode & 0o7777:o} after cross-device copy")
        elif k == RENAME and not ev.is_dir:
            return self._commit(p, t, f"rename {_base(ev.src or '?')} -> {_base(p)}")
        elif k == SYMLINK and ev.target is not None:
            return self._symlink(p, ev.target, t, ns)
        return []

    def _forget(self, gone: str) -> None:
        """``gone`` was unlinked, removed or renamed away."""
        self._files.pop(gone, None)
        self._committed.discard(gone)
        self._waiting_links.pop(gone, None)
        for links in self._waiting_links.values():
            if gone in links:
                links.remove(gone)

    def _symlink(self, link: str, target: str, t: int, ns: NamespaceView) -> list[Detection]:
        if target.startswith("/"):
            # A host path: the mountpoint is unknown here; match a committed root by suffix.
            hits = [r for r in self._committed if target.endswith(r)]
            if not hits:
                return []
            target = max(hits, key=len)
        else:
            target = posixpath.normpath(_join(_parent(link), target))
        if target in self._committed:
            return [self._link_commit(link, target, t)]
        if target in self._files:
            self._waiting_links.setdefault(target, []).append(link)
            return []
        if ns.exists(target) and not ns.is_dir(target):
            return [self._link_commit(link, target, t, " (target not seen being written)")]
        return []

    def pending(self) -> bool:
        return any(f.complete for f in self._files.values())

    def tick(self, now_ns: int, ns: NamespaceView) -> list[Detection]:
        out: list[Detection] = []
        for p, f in list(self._files.items()):
            if f.complete and now_ns - f.last_ns >= self.settle_ns:
                if f.chmods == 0:
                    out += self._commit(p, now_ns, "complete zip, no Lightning chmod followed",
                                        framework="torch")
                else:
                    out += self._commit(p, now_ns, "complete copy, final chmod never came")
        return out

    def owns(self, path: str, ns: NamespaceView) -> str | None:
        parts = _parts(path)
        for i, name in enumerate(parts[:-1]):
            if name.endswith(".ckpt"):
                return _prefix(parts, i + 1)  # inside a directory checkpoint of a strategy
        return path if path.endswith(".ckpt") else None
