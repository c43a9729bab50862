"""Checkpoint detectors: pure logic turning filesystem events into "begin" and "commit".

One small detector per framework (the call sequences and commit signals they implement
are the contract in docs/frameworks.md), user-configured ``PatternDetector``s, and a
``DetectorSet`` that runs them all over every event.

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

import fnmatch
import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from ..config.model import DEFAULT_QUIET_S, PATTERN_COMMITS, PatternConfig
from .events import (
    CHMOD,
    CREATE,
    MKDIR,
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

BEGIN = "begin"
COMMIT = "commit"

# Events that put new content under a path (a committed root becomes "dirty").
_WRITE_KINDS = (CREATE, WRITE, MKDIR, SYMLINK)
# Events after which a detector may say "a checkpoint is being written here".
_BEGIN_KINDS = (CREATE, WRITE, MKDIR)

# --------------------------------------------------------------------------- paths


def _parent(p: str) -> str:
    return p[: p.rfind("/")] or "/"


def _base(p: str) -> str:
    return p[p.rfind("/") + 1 :]


def _join(d: str, name: str) -> str:
    return ("" if d == "/" else d) + "/" + name


def _parts(p: str) -> list[str]:
    return [x for x in p.split("/") if x]


def _prefix(parts: list[str], n: int) -> str:
    return "/" + "/".join(parts[:n])


def _under(p: str, root: str) -> bool:
    """``p`` is ``root`` or inside it."""
    return p == root or root == "/" or p.startswith(root + "/")


def _ancestors_or_self(p: str) -> Iterable[str]:
    parts = _parts(p)
    for n in range(len(parts), 0, -1):
        yield _prefix(parts, n)


def _container(
    path: str, last_is_dir: bool, match: re.Pattern[str], innermost: bool = True
) -> str | None:
    """The directory component of ``path`` whose name matches (the last component counts
    only if it is a directory)."""
    parts = _parts(path)
    found = None
    for i, name in enumerate(parts):
        if i == len(parts) - 1 and not last_is_dir:
            break
        if match.match(name):
            found = _prefix(parts, i + 1)
            if not innermost:
                return found
    return found


# Temp names: never a checkpoint root themselves; their content arrives by rename.
_TEMP_RE = re.compile(
    r"""^(?:
        \.tmp.*                         # safetensors 0.8 .tmpXXXXXX, generic dot-tmp
      | tmp[a-z0-9_]{8}                 # tempfile.mkstemp() (Lightning's fsspec temp)
      | .*\.(?:tmp|temp|partial|part|incomplete)
      | .*~
      | .*\.__lock                      # tensorstore X.__lock -> X
      | .*\.orbax-checkpoint-tmp(?:-\d+)?
      | tmp-checkpoint-\d+              # HF 4.36-4.38
    )$""",
    re.X,
)


def is_temp_name(name: str) -> bool:
    return bool(_TEMP_RE.match(name))


# --------------------------------------------------------------------------- steps

_STEP_NAME_RES = (
    re.compile(r"^(?:tmp-)?checkpoint-(\d+)$"),  # HF
    re.compile(r"^global_step(\d+)$"),  # DeepSpeed
    re.compile(r"^iter_(\d+)$"),  # Megatron
    re.compile(r"^(\d+)$"),  # Orbax step dirs
)
_KV_STEP_RE = re.compile(r"(?:^|[^A-Za-z0-9])step=(\d+)")  # Lightning epoch=3-step=1200.ckpt
_EXT_RE = re.compile(r"(?:\.[A-Za-z][A-Za-z0-9_]*)+$")
_SHARD_RE = re.compile(r"-\d+-of-\d+$")  # model-00001-of-00004: numbering, not a step
_VERSION_RE = re.compile(r"-v\d+$")  # Lightning's name collision suffix: last-v1.ckpt
_TRAILING_INT_RE = re.compile(r"(\d+)$")


def step_from_name(name: str) -> int | None:
    """The training step a checkpoint's name says, or None.

    ``checkpoint-500``, ``global_step500``, ``iter_0000500``, ``500``, ``epoch=3-step=500.ckpt``
    and, generically, a trailing integer (``step_500.pt``). Names with ``key=value`` parts use
    only ``step=``: ``val_loss=0.12.ckpt`` has no step.
    """
    m = _KV_STEP_RE.search(name)
    if m:
        return int(m.group(1))
    if "=" in name:
        return None
    name = re.sub(r"\.orbax-checkpoint-tmp(?:-\d+)?$", "", name)
    for rx in _STEP_NAME_RES:
        m = rx.match(name)
        if m:
            return int(m.group(1))
    stem = _EXT_RE.sub("", name)
    stem = _VERSION_RE.sub("", _SHARD_RE.sub("", stem))
    m = _TRAILING_INT_RE.search(stem)
    return int(m.group(1)) if m else None


# --------------------------------------------------------------------------- content checks

_EOCD = b"PK\x05\x06"


def zip_at_eof(tail: bytes | None) -> bool:
    """A zip end-of-central-directory record ends the file (torch.save's zip format; the
    record is 22 bytes with an empty comment, which torch writes)."""
    if tail is None or len(tail) < 22:
        return False
    eocd = tail[len(tail) - 22 :]
    return eocd[:4] == _EOCD and eocd[20:22] == b"\x00\x00"


def _small_text(content: bytes | None) -> str | None:
    """A tracker file's content as one stripped token (DeepSpeed ``latest``, Megatron's
    iteration file), or None if it is not one."""
    if content is None:
        return None
    try:
        text = content.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None
    if not text or "/" in text or "\x00" in text or text in (".", "..") or text.split() != [text]:
        return None
    return text


# --------------------------------------------------------------------------- base


class BaseDetector:
    """Defaults for the ``Detector`` protocol plus what ``DetectorSet`` asks.

    ``priority``: who wins when two detectors claim a path (higher wins; equal: outer root).
    ``hold_for_writers``: a commit waits until no writer is open under the root.
    ``owns(path)``: the checkpoint (an ancestor-or-self of ``path``, as it is named in the
    namespace now) this detector considers ``path`` part of, or None.
    """

    name: str = "base"
    priority: int = 0
    hold_for_writers: bool = True

    def observe(self, ev: FsEvent, ns: NamespaceView) -> list[Detection]:
        return []

    def tick(self, now_ns: int, ns: NamespaceView) -> list[Detection]:
        return []

    def owns(self, path: str, ns: NamespaceView) -> str | None:
        return None

    def pending(self) -> bool:
        """A commit this detector will make at a later tick, kept only in memory."""
        return False

    def _d(
        self, kind: str, root: str, t: int, reason: str, step: int | None = None,
        framework: str | None = None,
    ) -> Detection:
        if step is None:
            step = step_from_name(_base(root))
        return Detection(kind, root, framework or self.name, step, t, reason)


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
_DCP_NAME_RE = re.compile(r"^(?:__\d+_\d+\.distcp|(?:__\d+)?\.metadata(?:\.tmp)?)$")


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
        return not name.lower().endswith(_NOT_TORCH_EXTS) and not _DCP_NAME_RE.match(name)

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


# --------------------------------------------------------------------------- torch DCP

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
        if _DCP_NAME_RE.match(_base(path)):
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
