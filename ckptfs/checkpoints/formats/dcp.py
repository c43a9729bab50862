"""torch.distributed.checkpoint directories: ``.metadata`` (or each rank's
``__R.metadata`` without collectives) unpickled without torch (restricted.py), and every
item it records checked against the data files: its file exists, its byte range
(``relative_path``, ``offset``, ``length``) lies within that file, items of a file do not
overlap, every tensor chunk and object of the state dict has an item, and in files of
torch.save records (DCP's default serialization) each item starts and ends like one."""

from __future__ import annotations

import pickle
import re
from typing import Any

from .files import CheckpointFiles, FormatProblem, Truncated, read_exact
from .restricted import ForbiddenGlobal, Obj, kind_of, load_restricted
from .torchzip import ZIP_MAGIC

METADATA_RE = re.compile(r"^(?:__\d+)?\.metadata$")
MAX_METADATA = 256 << 20  # bytes of .metadata read at most
_EOCD_SIG = b"PK\x05\x06"


class _Bad(Exception):
    pass


def metadata_names(names: list[str]) -> list[str]:
    return [n for n in names if METADATA_RE.match(n)]


def _load(files: CheckpointFiles, meta: str) -> Any:
    size = files.size(meta)
    if size > MAX_METADATA:
        raise _Bad(f"{size} bytes: larger than checked here ({MAX_METADATA})")
    try:
        md = load_restricted(read_exact(files, meta, 0, size))
    except ForbiddenGlobal as exc:
        why = ("a torch class this check does not know (a newer torch? see "
               "formats/restricted.py)" if str(exc).startswith("torch") else
               "which no DCP metadata holds (not a DCP metadata file, or a tampered one)")
        raise _Bad(f"refused: the pickle names {exc}, {why}; nothing was run") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError,
            IndexError, KeyError, MemoryError) as exc:
        raise _Bad(f"not a readable pickle ({type(exc).__name__}: {exc}); truncated?") from None
    sdm, sd = getattr(md, "state_dict_metadata", None), getattr(md, "storage_data", None)
    if kind_of(md) != "Metadata" or not isinstance(sdm, dict) or not isinstance(sd, dict):
        raise _Bad(f"holds a {kind_of(md)}, not a DCP Metadata with its storage data")
    return md


def _items(sd: dict[Any, Any]) -> list[tuple[str, str, int, int, bool]]:
    """(fqn, relative_path, offset, length, plain) of each stored item; ``plain``: no
    transform (compression...) changes its bytes."""
    out = []
    for idx, info in sd.items():
        fqn = str(getattr(idx, "fqn", idx))
        path, off, n = (getattr(info, a, None) for a in ("relative_path", "offset", "length"))
        if not isinstance(path, str) or not isinstance(off, int) or not isinstance(n, int) \
                or off < 0 or n < 0:
            raise _Bad(f"item {fqn}: storage info {info!r} is not (relative_path, offset, "
                       "length)")
        out.append((fqn, path, off, n, not getattr(info, "transform_descriptors", None)))
    return out


def _missing_items(md: Any) -> list[str]:
    """Tensor chunks and objects of the state dict that no stored item holds."""
    have = {(str(getattr(i, "fqn", "")), _tuple(getattr(i, "offset", None)))
            for i in md.storage_data}
    out = []
    for fqn, m in md.state_dict_metadata.items():
        if isinstance(m, Obj) and m.kind == "TensorStorageMetadata":
            for c in getattr(m, "chunks", []) or []:
                if (fqn, _tuple(getattr(c, "offsets", None))) not in have:
                    out.append(f"{fqn} chunk at {_tuple(getattr(c, 'offsets', None))}")
        elif (fqn, None) not in have:
            out.append(str(fqn))
    return out


def _tuple(x: Any) -> tuple[int, ...] | None:
    return None if x is None else tuple(x)


def _check_items(files: CheckpointFiles, meta: str, md: Any,
                 names: set[str]) -> list[FormatProblem]:
    out: list[FormatProblem] = []
    by_file: dict[str, list[tuple[int, int, str, bool]]] = {}
    for fqn, path, off, n, plain in _items(md.storage_data):
        by_file.setdefault(path, []).append((off, off + n, fqn, plain))
    for path, spans in sorted(by_file.items()):
        if path not in names:
            out.append(FormatProblem(path, f"missing: {meta} stores {len(spans)} items in it"))
            continue
        out += _check_file(files, path, sorted(spans))
    for what in _missing_items(md)[:5]:
        out.append(FormatProblem(meta, f"state dict entry {what} has no stored item"))
    return out


def _check_file(files: CheckpointFiles, path: str,
                spans: list[tuple[int, int, str, bool]]) -> list[FormatProblem]:
    size, end = files.size(path), 0
    records = size >= 4 and read_exact(files, path, 0, 4) == ZIP_MAGIC
    for b, e, fqn, plain in spans:
        if e > size:
            return [FormatProblem(path, f"item {fqn} (bytes {b}..{e}) runs past the end of "
                                  f"the {size}-byte file: truncated")]
        if b < end:
            return [FormatProblem(path, f"item {fqn} (bytes {b}..{e}) overlaps the item "
                                  f"before it (ends at {end})")]
        end = e
        if records and plain and e - b >= 22 and (
                read_exact(files, path, b, 4) != ZIP_MAGIC
                or read_exact(files, path, e - 22, 4) != _EOCD_SIG):
            return [FormatProblem(path, f"item {fqn} (bytes {b}..{e}) is not one torch.save "
                                  "record: the metadata and the data file disagree")]
    return []


def check_dcp(files: CheckpointFiles, required: bool) -> list[FormatProblem]:
    """Check the DCP directory ``files`` is rooted at; ``required``: a missing
    ``.metadata`` is a problem (the layout is DCP's), else the directory is not DCP."""
    names = files.names()
    metas = metadata_names(names)
    if not metas:
        if not required:
            return []
        return [FormatProblem(".metadata", "missing: DCP writes it last, so the save never "
                              "finished or the copy lost it; dcp.load refuses the directory")]
    out: list[FormatProblem] = []
    have = set(names)
    for meta in metas:
        try:
            md = _load(files, meta)
            out += _check_items(files, meta, md, have)
        except _Bad as exc:
            out.append(FormatProblem(meta, f"DCP metadata: {exc}"))
        except Truncated as exc:
            out.append(FormatProblem(meta, f"DCP metadata: short read: {exc}"))
    return out
