"""Detectors of directory checkpoints: torch DCP, HF Trainer, DeepSpeed, Megatron, Orbax.

A directory is the checkpoint; it commits at a rename (DCP's ``.metadata``, Orbax's temp
dir) or when a tracker file written last closes (``trainer_state.json``, ``latest``,
Megatron's iteration file), held while other ranks write (docs/frameworks.md).
"""

from __future__ import annotations

import re

from ..detector_base import (
    _BEGIN_KINDS,
    BEGIN,
    COMMIT,
    BaseDetector,
    _ancestors_or_self,
    _base,
    _container,
    _join,
    _parent,
    _parts,
    _prefix,
    _small_text,
    _under,
)
from ..events import CREATE, MKDIR, RELEASE, RENAME, RMDIR, WRITE, Detection, FsEvent, NamespaceView

# --------------------------------------------------------------------------- torch DCP

# Every name DCP writes in its directory (torch.save's detector leaves them to DCP's).
DCP_NAME_RE = re.compile(r"^(?:__\d+_\d+\.distcp|(?:__\d+)?\.metadata(?:\.tmp)?)$")

_DCP_DATA_RE = re.compile(r"^__\d+_\d+\.distcp$")
_DCP_META_TMP_RE = re.compile(r"^(__\d+)?\.metadata\.tmp$")
_DCP_META_RE = re.compile(r"^(__\d+)?\.metadata$")


class DCPDetector(BaseDetector):
    """torch.distributed.checkpoint: a directory of ``__R_I.distcp`` files, committed by the
    coordinator's ``.metadata.tmp`` -> ``.metadata`` rename; held until every rank's writer
    has closed. With ``use_collectives=False`` each rank renames its own
    ``__R.metadata``: each rename is a commit signal (held while others write), so a
    checkpoint whose slower rank had not yet started writing may commit early and again later.
    """

    name = "dcp"
    priority = 40

    def observe(self, ev: FsEvent, ns: NamespaceView) -> list[Detection]:
        k, p = ev.kind, ev.path
        name = _base(p)
        if k in (CREATE, WRITE) and (_DCP_DATA_RE.match(name) or _DCP_META_TMP_RE.match(name)):
            return [self._d(BEGIN, _parent(p), ev.time_ns, f"{k} of {name}")]
        if k == RENAME and not ev.is_dir and ev.src is not None:
            m, mt = _DCP_META_RE.match(name), _DCP_META_TMP_RE.match(_base(ev.src))
            if m and mt and m.group(1) == mt.group(1) and _parent(ev.src) == _parent(p):
                return [self._d(COMMIT, _parent(p), ev.time_ns, f"rename {_base(ev.src)} -> {name}")]
        return []

    def owns(self, path: str, ns: NamespaceView) -> str | None:
        if DCP_NAME_RE.match(_base(path)):
            return _parent(path)
        for d in _ancestors_or_self(path):
            if ns.exists(_join(d, ".metadata")) or ns.exists(_join(d, ".metadata.tmp")):
                return d
        return None


# --------------------------------------------------------------------------- HF Trainer

_HF_DIR_RE = re.compile(r"^(?:tmp-)?checkpoint-\d+$")
_HF_FINAL_RE = re.compile(r"^checkpoint-\d+$")
_RNG_RE = re.compile(r"^rng_state(?:_\d+)?\.pth$")


class HFTrainerDetector(BaseDetector):
    """HF Trainer ``output_dir/checkpoint-N``: committed at the release of
    ``trainer_state.json`` (rank 0 writes it last), held until other ranks' writers (their
    ``rng_state_R.pth``) close. 4.36-4.38: ``tmp-checkpoint-N`` renamed to ``checkpoint-N``.

    A rank that creates its ``rng_state_R.pth`` only after the commit reopens the checkpoint
    (a begin); when only such rng files were written and they close, it commits again.
    """

    name = "hf"
    priority = 50

    def __init__(self) -> None:
        self._committed: set[str] = set()
        # Committed roots reopened by late writes: True while only rng_state files were.
        self._late_rng: dict[str, bool] = {}

    def _where(self, path: str, last_is_dir: bool) -> tuple[str, str] | None:
        """(the checkpoint dir as named now, the root it becomes)."""
        c = _container(path, last_is_dir, _HF_DIR_RE)
        if c is None:
            return None
        base = _base(c)
        return c, (_join(_parent(c), base[4:]) if base.startswith("tmp-") else c)

    def observe(self, ev: FsEvent, ns: NamespaceView) -> list[Detection]:
        k, p, t = ev.kind, ev.path, ev.time_ns
        if k in _BEGIN_KINDS:
            w = self._where(p, k == MKDIR)
            if w is None:
                return []
            cdir, root = w
            if root in self._committed:
                late = k != MKDIR and _parent(p) == cdir and bool(_RNG_RE.match(_base(p)))
                self._late_rng[root] = self._late_rng.get(root, True) and late
            return [self._d(BEGIN, root, t, f"{k} of {p[len(_parent(cdir)) + 1:]}")]
        if k == RELEASE and ev.last_writer:
            d, name = _parent(p), _base(p)
            if name == "trainer_state.json" and _HF_FINAL_RE.match(_base(d)):
                self._committed.add(d)
                self._late_rng.pop(d, None)
                return [self._d(COMMIT, d, t, "trainer_state.json closed")]
            if _RNG_RE.match(name) and self._late_rng.get(d):
                del self._late_rng[d]
                return [self._d(COMMIT, d, t, f"late {name} of another rank closed")]
        elif k == RENAME and ev.is_dir and ev.src is not None:
            self._forget(ev.src)
            if _base(ev.src).startswith("tmp-") and _base(ev.src)[4:] == _base(p) and \
                    _HF_FINAL_RE.match(_base(p)):
                self._committed.add(p)
                return [self._d(COMMIT, p, t, f"rename {_base(ev.src)} -> {_base(p)}")]
        elif k == RMDIR:
            self._forget(p)
        return []

    def _forget(self, path: str) -> None:
        """A directory went away (roots are directories: unlinks cannot remove one)."""
        for r in [r for r in self._committed if _under(r, path)]:
            self._committed.discard(r)
            self._late_rng.pop(r, None)

    def owns(self, path: str, ns: NamespaceView) -> str | None:
        return _container(path, ns.is_dir(path), _HF_DIR_RE)


# --------------------------------------------------------------------------- DeepSpeed

_DS_TAG_RE = re.compile(r"^global_step\d+$")
# DeepSpeed's own file names (model, ZeRO optimizer, pipeline layer, MoE expert states):
# a directory holding one is a DeepSpeed tag dir whatever the tag is called.
_DS_FILE_RE = re.compile(r"^(?:.*mp_rank_\d+.*|layer_\d+.*)(?:model|optim)_states\.pt$")


class DeepSpeedDetector(BaseDetector):
    """DeepSpeed ``save_dir/<tag>/`` (default tag ``global_stepN``): committed when rank 0's
    rewrite of ``save_dir/latest`` closes holding the tag, held until other ranks close. The
    rewrite is O_TRUNC + write, so only a release whose content names an existing
    directory counts. A tag dir is one named ``global_stepN``, one holding a file named like
    DeepSpeed's (``mp_rank_00_model_states.pt``, ``*_optim_states.pt``...), or one a
    ``latest`` has named.
    """

    name = "deepspeed"
    priority = 50

    def __init__(self) -> None:
        self._tags: set[str] = set()  # tag directories some `latest` named

    def _root(self, path: str, last_is_dir: bool) -> str | None:
        c = _container(path, last_is_dir, _DS_TAG_RE)
        if c is not None:
            return c
        if not last_is_dir and _DS_FILE_RE.match(_base(path)):
            return _parent(path)
        for r in self._tags:
            if _under(path, r) and (path != r or last_is_dir):
                return r
        return None

    def observe(self, ev: FsEvent, ns: NamespaceView) -> list[Detection]:
        k, p, t = ev.kind, ev.path, ev.time_ns
        if k in _BEGIN_KINDS:
            root = self._root(p, k == MKDIR)
            if root is not None:
                return [self._d(BEGIN, root, t, f"{k} of {p[len(_parent(root)) + 1:]}")]
        elif k == RELEASE and ev.last_writer and _base(p) == "latest":
            tag = _small_text(ev.content)
            if tag is None:
                return []
            root = _join(_parent(p), tag)
            if not ns.is_dir(root):
                return []  # a torn rewrite, or not DeepSpeed's `latest`
            self._tags.add(root)
            return [self._d(COMMIT, root, t, f"latest closed naming {tag}")]
        elif (k == RMDIR or (k == RENAME and ev.is_dir)) and self._tags:
            gone = ev.src if k == RENAME and ev.src is not None else p
            self._tags = {r for r in self._tags if not _under(r, gone)}
        return []

    def owns(self, path: str, ns: NamespaceView) -> str | None:
        return self._root(path, ns.is_dir(path))


# --------------------------------------------------------------------------- Megatron

_MEGATRON_DIR_RE = re.compile(r"^iter_\d{7,}$")
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
# Legacy torch format: ITER/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt (+ distrib_optim.pt).
_MEGATRON_RANK_DIR_RE = re.compile(r"^mp_rank_\d+(?:_\d+){0,2}$")
_MEGATRON_LEGACY_FILES = ("model_optim_rng.pt", "distrib_optim.pt")


def _megatron_root(path: str, last_is_dir: bool) -> str | None:
    c = _container(path, last_is_dir, _MEGATRON_DIR_RE)
    if c is not None:
        return c
    parent = _parent(path)
    if (not last_is_dir and _base(path) in _MEGATRON_LEGACY_FILES
            and _MEGATRON_RANK_DIR_RE.match(_base(parent)) and parent != "/"):
        return _parent(parent)
    return None


class MegatronDetector(BaseDetector):
    """Megatron ``save/iter_NNNNNNN/``: committed when rank 0's rewrite of
    ``save/latest_checkpointed_iteration.txt`` closes holding the iteration (or
    ``release``: root ``save/release``). The DCP ``.metadata`` rename inside the dir is
    not a checkpoint of its own (the dir is Megatron's)."""

    name = "megatron"
    priority = 50

    def observe(self, ev: FsEvent, ns: NamespaceView) -> list[Detection]:
        k, p, t = ev.kind, ev.path, ev.time_ns
        if k in _BEGIN_KINDS:
            root = _megatron_root(p, k == MKDIR)
            if root is not None:
                return [self._d(BEGIN, root, t, f"{k} of {p[len(_parent(root)) + 1:]}")]
        elif k == RELEASE and ev.last_writer and _base(p) == MEGATRON_TRACKER:
            text = _small_text(ev.content)
            if text is None:
                return []
            if text == "release":
                root, step = _join(_parent(p), "release"), None
            elif text.isdigit():
                step = int(text)
                root = _join(_parent(p), f"iter_{step:07d}")
            else:
                return []
            if ns.is_dir(root):
                return [self._d(COMMIT, root, t, f"{MEGATRON_TRACKER} closed holding {text}",
                                step=step)]
        return []

    def owns(self, path: str, ns: NamespaceView) -> str | None:
        c = _megatron_root(path, ns.is_dir(path))
        if c is not None:
            return c
        parts = _parts(path)
        for i, name in enumerate(parts[1:], start=1):
            if name == "release" and ns.exists(_join(_prefix(parts, i), MEGATRON_TRACKER)):
                return _prefix(parts, i + 1)
        return None


# --------------------------------------------------------------------------- Orbax

_ORBAX_TMP_RE = re.compile(r"^(?P<final>.+)\.orbax-checkpoint-tmp(?:-\d+)?$")
ORBAX_METADATA = "_CHECKPOINT_METADATA"
ORBAX_COMMIT_FILE = "commit_success.txt"


class OrbaxDetector(BaseDetector):
    """Orbax: ``{step}.orbax-checkpoint-tmp/`` renamed to ``{step}`` (root: the final dir).
    Item dirs (``default.orbax-checkpoint-tmp`` -> ``default``) and ``X.__lock`` -> ``X``
    renames happen inside it and are not checkpoints. CommitFileTemporaryPath mode writes
    straight into ``{step}/`` and commits with ``{step}/commit_success.txt``: a step dir is
    one holding ``_CHECKPOINT_METADATA`` (or named by an integer)."""

    name = "orbax"
    priority = 50

    def __init__(self) -> None:
        self._committed: set[str] = set()

    @staticmethod
    def _outer_tmp(path: str) -> tuple[str, str] | None:
        """(the outermost ``X.orbax-checkpoint-tmp`` component, the root it becomes)."""
        parts = _parts(path)
        for i, name in enumerate(parts):
            m = _ORBAX_TMP_RE.match(name)
            if m:
                return _prefix(parts, i + 1), _join(_prefix(parts, i), m.group("final"))
        return None

    def observe(self, ev: FsEvent, ns: NamespaceView) -> list[Detection]:
        k, p, t = ev.kind, ev.path, ev.time_ns
        if k in _BEGIN_KINDS or k == RENAME:
            tmp = self._outer_tmp(p)
            if tmp is not None:
                return [self._d(BEGIN, tmp[1], t, f"{k} under {_base(tmp[0])}")]
        if k == CREATE and _base(p) == ORBAX_METADATA:
            return [self._d(BEGIN, _parent(p), t, f"create of {ORBAX_METADATA} (commit-file mode)")]
        if k == RENAME and ev.is_dir and ev.src is not None:
            self._forget(ev.src)
            tmp = self._outer_tmp(ev.src)
            if tmp is not None and tmp[0] == ev.src and self._outer_tmp(p) is None:
                self._committed.add(p)
                return [self._d(COMMIT, p, t, f"rename {_base(ev.src)} -> {_base(p)}")]
        elif k == RELEASE and ev.last_writer and _base(p) == ORBAX_COMMIT_FILE:
            d = _parent(p)
            if self._outer_tmp(d) is None and (
                ns.exists(_join(d, ORBAX_METADATA)) or _base(d).isdigit()
            ):
                self._committed.add(d)
                return [self._d(COMMIT, d, t, f"{ORBAX_COMMIT_FILE} closed (commit-file mode)")]
        elif k == RMDIR:
            self._forget(p)
        return []

    def _forget(self, path: str) -> None:
        """A directory went away (roots are directories: unlinks cannot remove one)."""
        if self._committed:
            self._committed = {r for r in self._committed if not _under(r, path)}

    def owns(self, path: str, ns: NamespaceView) -> str | None:
        tmp = self._outer_tmp(path)
        if tmp is not None:
            return tmp[0]
        for r in self._committed:
            if _under(path, r):
                return r
        for d in _ancestors_or_self(path):
            if ns.exists(_join(d, ORBAX_METADATA)):
                return d
        return None
