"""What every checkpoint detector shares: path arithmetic on namespace paths, the names
that are temp files or say a step, content checks on a released file, and ``BaseDetector``.

Pure logic, no I/O (the detectors and their rules: detectors.py, docs/checkpoints.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from .events import CREATE, MKDIR, SYMLINK, WRITE, Detection, FsEvent, NamespaceView

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

