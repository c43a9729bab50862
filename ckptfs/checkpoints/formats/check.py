"""``check_checkpoint``: does a checkpoint load as its framework wrote it? The checks each
layout gets (docs/checkpoints.md, "What a drill checks"), by the layout names the detectors
record (layouts/files.py, layouts/dirs.py): a check of the whole checkpoint for its layout,
then every file by what it is (safetensors, torch.save zip, DCP directory, JSON, tracker).
An unknown layout (a user pattern's) gets the per-file checks only."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from functools import partial

from .dcp import check_dcp, metadata_names
from .files import CheckpointFiles, FormatProblem, SubFiles, Truncated, read_exact
from .meta import (
    DS_LATEST,
    MEGATRON_TRACKER,
    check_ds_latest,
    check_json,
    check_megatron_tracker,
    is_json_name,
    tracker_text,
)
from .stfile import check_safetensors
from .torchzip import ZIP_MAGIC, check_zip

TORCH_EXTS = (".pt", ".pth", ".ckpt")  # torch.save files; must be zip archives
_DS_MODEL_RE = re.compile(r"(?:^|/)[^/]*model_states\.pt$")
_MEGATRON_LEGACY_RE = re.compile(r"(?:^|/)mp_rank_[^/]+/model_optim_rng\.pt$")
MAX_PER_FILE = 5
MAX_PROBLEMS = 50


def check_checkpoint(files: CheckpointFiles, layout: str) -> list[FormatProblem]:
    """Every problem found (empty: the checkpoint loads as its framework wrote it). Never
    raises: a file that cannot be read, or a check that fails, is a problem too.

    DeepSpeed's ``latest`` and Megatron's ``latest_checkpointed_iteration.txt`` sit beside
    the checkpoint root: they are checked when ``files`` is rooted at the save dir and
    includes them (with the restored tag or iteration dir)."""
    try:
        names = files.names()
    except OSError as exc:
        return [FormatProblem("", f"cannot list the checkpoint's files: {exc}")]
    if not names:
        return [FormatProblem("", "the checkpoint holds no files")]
    out = _guard("", lambda: _layout_checks(files, layout, names))
    out += _guard("", lambda: _dcp_dirs(files, layout, names))
    in_dcp = _dcp_roots(layout, names)
    for name in names:
        if posixpath.dirname(name) in in_dcp and name.endswith(".distcp"):
            continue  # checked through its directory's metadata
        out += _guard(name, partial(_file_checks, files, layout, name, names))
    return _trim(out)


def _guard(name: str, check: Callable[[], list[FormatProblem]]) -> list[FormatProblem]:
    try:
        return check()
    except Truncated as exc:
        return [FormatProblem(name, f"short read: {exc}")]
    except OSError as exc:
        return [FormatProblem(name, f"cannot be read: {exc}")]
    except Exception as exc:  # a damaged file no check foresaw: report, never crash a drill
        return [FormatProblem(name, f"could not be checked ({type(exc).__name__}: {exc})")]


def _layout_checks(files: CheckpointFiles, layout: str, names: list[str]) -> list[FormatProblem]:
    have = set(names)
    if layout == "hf" and "trainer_state.json" not in have:
        return [FormatProblem("trainer_state.json", "missing: HF Trainer writes it last, and "
                              "resume_from_checkpoint needs it")]
    if layout == "deepspeed":
        out = check_ds_latest(files, have) if DS_LATEST in have else []
        tag = tracker_text(files, DS_LATEST) if DS_LATEST in have and not out else None
        under = f"{tag}/" if tag else ""  # the tag `latest` names, else the whole root
        if not any(n.startswith(under) and _DS_MODEL_RE.search(n) for n in names):
            out.append(FormatProblem(tag or "", "no *model_states.pt: DeepSpeed's "
                                     "load_checkpoint needs the model states"))
        return out
    if layout == "megatron" and not metadata_names([posixpath.basename(n) for n in names]) \
            and not any(_MEGATRON_LEGACY_RE.search(n) for n in names):
        return [FormatProblem("", "neither a DCP .metadata nor mp_rank_*/model_optim_rng.pt: "
                              "Megatron finds nothing to load")]
    return []


def _dcp_roots(layout: str, names: list[str]) -> set[str]:
    """Directories (relative; "" the root) holding a DCP metadata file, and the root
    itself for the DCP layout."""
    roots = {posixpath.dirname(n) for n in names
             if metadata_names([posixpath.basename(n)])}
    if layout == "dcp":
        roots.add("")
    return roots


def _dcp_dirs(files: CheckpointFiles, layout: str, names: list[str]) -> list[FormatProblem]:
    out: list[FormatProblem] = []
    for d in sorted(_dcp_roots(layout, names)):
        sub = SubFiles(files, d) if d else files
        for p in check_dcp(sub, required=True):
            out.append(FormatProblem(posixpath.join(d, p.file) if d else p.file, p.what))
    return out


def _file_checks(files: CheckpointFiles, layout: str, name: str,
                 names: list[str]) -> list[FormatProblem]:
    base = posixpath.basename(name)
    if name.endswith(".safetensors") or layout == "safetensors":
        return check_safetensors(files, name)
    if is_json_name(name):
        return check_json(files, name, set(names))
    if name == MEGATRON_TRACKER:
        return check_megatron_tracker(files, set(names))
    if metadata_names([base]) or (name == DS_LATEST and layout == "deepspeed"):
        return []  # checked with their directory, or by the layout check
    must_be_torch = name.endswith(TORCH_EXTS) or (
        layout in ("torch", "lightning") and "/" not in name)
    size = files.size(name)
    head = read_exact(files, name, 0, 4) if size >= 4 else b""
    if head == ZIP_MAGIC:
        return check_zip(files, name, torch_archive=must_be_torch or name.endswith(".bin"))
    if must_be_torch:
        return [FormatProblem(name, "not a torch.save zip archive (its first bytes are not a "
                              "zip header): damaged, or torch's legacy format")]
    return []


def _trim(problems: list[FormatProblem]) -> list[FormatProblem]:
    """At most ``MAX_PER_FILE`` problems a file and ``MAX_PROBLEMS`` in all, the rest
    counted in one line."""
    out: list[FormatProblem] = []
    per: dict[str, int] = {}
    dropped = 0
    for p in problems:
        per[p.file] = per.get(p.file, 0) + 1
        if per[p.file] > MAX_PER_FILE or len(out) >= MAX_PROBLEMS:
            dropped += 1
        else:
            out.append(p)
    if dropped:
        out.append(FormatProblem("", f"{dropped} more problems not listed"))
    return out
