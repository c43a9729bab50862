"""Checkpoint detectors: pure logic turning filesystem events into "begin" and "commit".

One small detector per framework (layouts/files.py, layouts/dirs.py: the call sequences
and commit signals they implement are the contract in docs/frameworks.md), user-configured
``PatternDetector``s (patterns.py), and here the ``DetectorSet`` that runs them all over
every event.

The rules the ``DetectorSet`` enforces (docs/checkpoints.md):

* **Attribution.** A checkpoint root claimed by another detector is not reported: a detector
  of higher ``priority`` wins, and on equal priority the outer root wins. So the files of an
  HF ``checkpoint-N`` are not torch.save checkpoints of their own, a DCP directory inside
  Megatron's ``iter_N`` or HF's FSDP subdir is Megatron's or HF's, and a user pattern beats
  everything. Name-based claims are unconditional: a plain torch.save file inside a dir
  named ``checkpoint-5`` belongs to HF and commits only with HF's signal.
* **One begin, one commit.** Detectors may repeat "begin" (on every write under a root
  they recognise); a root gets one until its "commit". A second commit
  signal for a root counts only after something under it was written again (created,
  written, renamed in, unlinked); torch.save overwriting the same file later is a new
  commit. A commit with no begin seen first (the temp file of safetensors 0.8, a DeepSpeed
  custom tag) is preceded by a synthesized begin carrying the first-write time under the
  root, so every commit has a begin before it.
* **Held commits.** Most commit signals are one rank's (HF's ``trainer_state.json``,
  DeepSpeed's ``latest``): other ranks may still be writing, and FUSE releases arrive
  asynchronously. Unless the detector says the signal is final (safetensors renames its
  file while the fd is still open; a user pattern's signal is trusted), a commit waits
  until no writer is open under the root and fires at the release of the last one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ..config.model import PatternConfig
from .detector_base import _WRITE_KINDS, BEGIN, COMMIT, BaseDetector, _ancestors_or_self, _under
from .events import RELEASE, RENAME, RMDIR, UNLINK, Detection, FsEvent, NamespaceView
from .layouts.dirs import (
    DCPDetector,
    DeepSpeedDetector,
    HFTrainerDetector,
    MegatronDetector,
    OrbaxDetector,
)
from .layouts.files import LightningDetector, SafetensorsDetector, TorchSaveDetector
from .patterns import PatternDetector

# --------------------------------------------------------------------------- the set


@dataclass
class _Root:
    open: bool  # a begin was emitted and no commit since
    dirty: bool = False  # committed, then written again


_FIRST_WRITE_CAP = 65536  # remembered first-write times (oldest dropped first)


def default_detectors(
    patterns: Sequence[PatternConfig] = (), lightning_settle_s: float = 5.0
) -> list[BaseDetector]:
    return [
        *(PatternDetector.from_config(p) for p in patterns),
        HFTrainerDetector(),
        DeepSpeedDetector(),
        MegatronDetector(),
        OrbaxDetector(),
        DCPDetector(),
        LightningDetector(lightning_settle_s),
        SafetensorsDetector(),
        TorchSaveDetector(),
    ]


class DetectorSet:
    """Runs every detector over each event; attributes, de-duplicates and holds (module
    docstring). Implements the ``Detector`` protocol itself."""

    name = "all"

    def __init__(self, detectors: Sequence[BaseDetector] | None = None) -> None:
        dets = list(detectors) if detectors is not None else default_detectors()
        # Highest priority first: the ownership check stops at the first claim.
        self.detectors = sorted(dets, key=lambda d: -d.priority)
        self._roots: dict[str, _Root] = {}
        self._held: dict[str, tuple[BaseDetector, Detection]] = {}
        self._first_write: dict[str, int] = {}  # path -> first write since its root's commit

    @classmethod
    def default(cls, patterns: Sequence[PatternConfig] = (), lightning_settle_s: float = 5.0
                ) -> DetectorSet:
        return cls(default_detectors(patterns, lightning_settle_s))

    # ---- protocol

    def observe(self, ev: FsEvent, ns: NamespaceView) -> list[Detection]:
        self._bookkeep(ev)
        out: list[Detection] = []
        for det in self.detectors:
            for d in det.observe(ev, ns):
                out += self._admit(det, d, ns)
        if ev.kind == RELEASE and self._held:
            out += self._release_held(ev.time_ns, ns)
        return out

    def tick(self, now_ns: int, ns: NamespaceView) -> list[Detection]:
        out: list[Detection] = []
        for det in self.detectors:
            for d in det.tick(now_ns, ns):
                out += self._admit(det, d, ns)
        if self._held:
            out += self._release_held(now_ns, ns)
        return out

    # ---- views for the tracker and tests

    def open_roots(self) -> list[str]:
        """Roots begun and not committed (held commits included)."""
        return sorted(r for r, st in self._roots.items() if st.open)

    def held_roots(self) -> list[str]:
        return sorted(self._held)

    def pending(self) -> bool:
        """A commit waits in memory: held for writers, or a detector's own (a Lightning
        file settling, a quiescence pattern's root). A crash would lose it."""
        return bool(self._held) or any(d.pending() for d in self.detectors)

    def committed_elsewhere(self, root: str) -> None:
        """Another node committed ``root`` (shared catalog), which this set saw begin: it is
        closed here as after a commit of its own (a commit it holds still fires)."""
        st = self._roots.get(root)
        if st is None or not st.open or root in self._held:
            return
        self._emit_commit(Detection(COMMIT, root, "", None, 0, "committed by another node"))

    # ---- admission

    def _owned_elsewhere(self, det: BaseDetector, root: str, ns: NamespaceView) -> bool:
        for other in self.detectors:
            if other.priority < det.priority:
                break
            if other is det:
                continue
            claim = other.owns(root, ns)
            if claim is not None and (other.priority > det.priority or claim != root):
                return True
        return False

    def _admit(self, det: BaseDetector, d: Detection, ns: NamespaceView) -> list[Detection]:
        st = self._roots.get(d.root)
        if d.kind == BEGIN:
            # A committed root reopens only once something under it was written again.
            if (st is not None and (st.open or not st.dirty)) or \
                    self._owned_elsewhere(det, d.root, ns):
                return []
            first = self._first_write_under(d.root)
            self._roots[d.root] = _Root(open=True)
            return [replace(d, time_ns=min(d.time_ns, first)) if first is not None else d]
        if st is not None and not st.open and not st.dirty:
            return []  # the same commit signalled again, nothing written since
        if self._owned_elsewhere(det, d.root, ns):
            return []
        out: list[Detection] = []
        if st is None or not st.open:
            out.append(self._synth_begin(d))
        if det.hold_for_writers and ns.open_writers_under(d.root) > 0:
            self._held[d.root] = (det, d)  # a later signal replaces an earlier one
            return out
        self._held.pop(d.root, None)
        return out + self._emit_commit(d)

    def _synth_begin(self, d: Detection) -> Detection:
        self._roots[d.root] = _Root(open=True)
        first = self._first_write_under(d.root)
        return Detection(BEGIN, d.root, d.framework, d.step,
                         d.time_ns if first is None else min(first, d.time_ns),
                         "no begin signal; first write under the root")

    def _emit_commit(self, d: Detection) -> list[Detection]:
        self._roots[d.root] = _Root(open=False)
        for p in [p for p in self._first_write if _under(p, d.root)]:
            del self._first_write[p]
        return [d]

    def _release_held(self, now_ns: int, ns: NamespaceView) -> list[Detection]:
        out: list[Detection] = []
        for root, (_det, d) in list(self._held.items()):
            if not ns.exists(root):
                del self._held[root]
            elif ns.open_writers_under(root) == 0:
                del self._held[root]
                out += self._emit_commit(replace(
                    d, time_ns=now_ns, reason=f"{d.reason}; held until the last writer closed"))
        return out

    def _first_write_under(self, root: str) -> int | None:
        times = [t for p, t in self._first_write.items() if _under(p, root)]
        return min(times) if times else None

    # ---- namespace bookkeeping: dirtiness, first writes, renames, deletions

    def _mark_dirty(self, path: str, include_self: bool = True) -> None:
        for a in _ancestors_or_self(path):
            if a == path and not include_self:
                continue
            st = self._roots.get(a)
            if st is not None and not st.open:
                st.dirty = True

    def _drop_roots_under(self, path: str, is_dir: bool) -> None:
        if not is_dir:
            self._roots.pop(path, None)
            self._held.pop(path, None)
            return
        for r in [r for r in self._roots if _under(r, path)]:
            del self._roots[r]
        for r in [r for r in self._held if _under(r, path)]:
            del self._held[r]

    def _bookkeep(self, ev: FsEvent) -> None:
        k, p = ev.kind, ev.path
        if k in _WRITE_KINDS:
            if p not in self._first_write:
                if len(self._first_write) >= _FIRST_WRITE_CAP:
                    del self._first_write[next(iter(self._first_write))]
                self._first_write[p] = ev.time_ns
            self._mark_dirty(p)
        elif k == RENAME and ev.src is not None:
            # A root renamed away is forgotten like a deleted one (the tracker sees the
            # rename itself); the new name is new content for whatever holds it.
            src = ev.src
            self._drop_roots_under(src, ev.is_dir)
            self._mark_dirty(p)
            self._mark_dirty(src, include_self=False)
            if ev.is_dir:
                for q in [q for q in self._first_write if _under(q, src)]:
                    self._first_write[p + q[len(src):]] = self._first_write.pop(q)
            elif src in self._first_write:
                self._first_write[p] = self._first_write.pop(src)
            self._first_write.setdefault(p, ev.time_ns)
        elif k in (UNLINK, RMDIR):
            # rmtree unlinks file by file: only a directory costs a scan.
            self._drop_roots_under(p, k == RMDIR)
            self._mark_dirty(p, include_self=False)
            if k == RMDIR:
                for q in [q for q in self._first_write if _under(q, p)]:
                    del self._first_write[q]
            else:
                self._first_write.pop(p, None)


def run(detectors: DetectorSet, events: Iterable[FsEvent], ns: NamespaceView) -> list[Detection]:
    """Feed a sequence of events (tests, replays); the detections in order."""
    out: list[Detection] = []
    for ev in events:
        out += detectors.observe(ev, ns)
    return out
