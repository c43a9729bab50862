"""Small metadata files: JSON that must parse (HF's ``trainer_state.json``, ``*.json``,
Orbax's ``_CHECKPOINT_METADATA`` and ``_METADATA``), the files an index names (HF's
``*.index.json`` ``weight_map``, Orbax's item handlers), and the tracker files that name
the checkpoint to resume (DeepSpeed's ``latest``, Megatron's
``latest_checkpointed_iteration.txt``)."""

from __future__ import annotations

import json
import posixpath
from typing import Any

from .files import CheckpointFiles, FormatProblem, Truncated, read_exact

MAX_JSON = 64 << 20  # a JSON file larger than this is not parsed
DS_LATEST = "latest"
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
ORBAX_METADATA = "_CHECKPOINT_METADATA"
ORBAX_JSON_NAMES = ("_CHECKPOINT_METADATA", "_METADATA", "_sharding")


class BadJson(Exception):
    pass


def load_json(files: CheckpointFiles, name: str) -> Any:
    size = files.size(name)
    if size > MAX_JSON:
        raise BadJson(f"{size} bytes: larger than parsed here")
    try:
        return json.loads(read_exact(files, name, 0, size).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadJson(f"not valid JSON ({exc}); truncated or damaged?") from None
    except Truncated as exc:
        raise BadJson(f"short read: {exc}") from None


def is_json_name(name: str) -> bool:
    return name.endswith(".json") or posixpath.basename(name) in ORBAX_JSON_NAMES


def check_json(files: CheckpointFiles, name: str, have: set[str]) -> list[FormatProblem]:
    """The file parses; an index's ``weight_map`` names files present beside it."""
    try:
        doc = load_json(files, name)
    except BadJson as exc:
        return [FormatProblem(name, f"JSON: {exc}")]
    out: list[FormatProblem] = []
    wmap = doc.get("weight_map") if isinstance(doc, dict) else None
    if name.endswith(".index.json") and isinstance(wmap, dict):
        d = posixpath.dirname(name)
        for shard in sorted({str(v) for v in wmap.values()}):
            if posixpath.join(d, shard) not in have:
                out.append(FormatProblem(posixpath.join(d, shard),
                                         f"missing: {name} maps tensors to it"))
    if posixpath.basename(name) == ORBAX_METADATA and isinstance(doc, dict):
        out += _orbax_items(name, doc, have)
    return out


def _orbax_items(name: str, doc: dict[str, Any], have: set[str]) -> list[FormatProblem]:
    """Each item Orbax's ``_CHECKPOINT_METADATA`` lists has its directory."""
    handlers = doc.get("item_handlers")
    if not isinstance(handlers, dict):
        return []  # a single unnamed item, or an older Orbax: nothing named
    d = posixpath.dirname(name)
    out = []
    for item in sorted(handlers):
        prefix = posixpath.join(d, item) + "/"
        if not any(n.startswith(prefix) for n in have):
            out.append(FormatProblem(posixpath.join(d, item),
                                     f"missing: {name} lists item {item!r}"))
    return out


def tracker_text(files: CheckpointFiles, name: str) -> str | None:
    """The one token a tracker file holds, or None if it holds something else."""
    size = files.size(name)
    if size > 4096:
        return None
    try:
        text = read_exact(files, name, 0, size).decode("utf-8").strip()
    except (UnicodeDecodeError, Truncated):
        return None
    return text if text and len(text.split()) == 1 and "/" not in text else None


def _is_dir(have: set[str], d: str) -> bool:
    return any(n.startswith(d + "/") for n in have)


def check_ds_latest(files: CheckpointFiles, have: set[str]) -> list[FormatProblem]:
    """DeepSpeed's ``latest`` names a tag directory that exists (load_checkpoint's choice)."""
    tag = tracker_text(files, DS_LATEST)
    if tag is None:
        return [FormatProblem(DS_LATEST, "does not hold one tag name: DeepSpeed cannot "
                              "pick the checkpoint to load")]
    if tag in (".", "..") or not _is_dir(have, tag):
        return [FormatProblem(DS_LATEST, f"names tag {tag!r}, which is not a directory "
                              "here: DeepSpeed's load_checkpoint would fail")]
    return []


def check_megatron_tracker(files: CheckpointFiles, have: set[str]) -> list[FormatProblem]:
    """Megatron's tracker holds an iteration whose ``iter_NNNNNNN`` exists, or ``release``."""
    text = tracker_text(files, MEGATRON_TRACKER)
    if text is None or not (text.isdigit() or text == "release"):
        return [FormatProblem(MEGATRON_TRACKER, "holds neither an iteration number nor "
                              "'release': Megatron cannot pick the checkpoint to load")]
    d = "release" if text == "release" else f"iter_{int(text):07d}"
    if not _is_dir(have, d):
        return [FormatProblem(MEGATRON_TRACKER, f"names {text}, but {d}/ is not here: "
                              "Megatron's load would fail")]
    return []
