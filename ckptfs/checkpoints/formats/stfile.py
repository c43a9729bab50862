"""safetensors files: an 8-byte little-endian header length, a JSON header, then the data.
Checked as the safetensors library validates on load: every tensor's dtype is known, its
``data_offsets`` length equals its shape times its dtype's size, the tensors tile the data
with no gap or overlap, and the data ends exactly at the end of the file."""

from __future__ import annotations

import json
import math
import struct
from typing import Any

from .files import CheckpointFiles, FormatProblem, Truncated, read_exact

MAX_HEADER = 100_000_000  # the library's own limit

# Bits per element of each dtype the safetensors format names.
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64,
}


class _Bad(Exception):
    pass


def _header(files: CheckpointFiles, name: str, size: int) -> tuple[dict[str, Any], int]:
    """The parsed header and the length of the data after it."""
    if size < 8:
        raise _Bad(f"{size} bytes: too short for a safetensors header length (truncated?)")
    (n,) = struct.unpack("<Q", read_exact(files, name, 0, 8))
    if n > MAX_HEADER:
        raise _Bad(f"header length {n} is beyond the format's limit (damaged first 8 bytes)")
    if 8 + n > size:
        raise _Bad(f"header of {n} bytes runs past the end of the {size}-byte file (truncated?)")
    raw = read_exact(files, name, 8, n)
    try:
        head = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise _Bad(f"header is not valid JSON ({exc})") from None
    if not isinstance(head, dict):
        raise _Bad("header is not a JSON object")
    return head, size - 8 - n


def _span(key: str, t: Any) -> tuple[int, int]:
    """The tensor's (begin, end) in the data, checked against its dtype and shape."""
    if not isinstance(t, dict):
        raise _Bad(f"tensor {key!r}: its header entry is not an object")
    dtype, shape, offs = t.get("dtype"), t.get("shape"), t.get("data_offsets")
    if dtype not in DTYPE_BITS:
        raise _Bad(f"tensor {key!r}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise _Bad(f"tensor {key!r}: shape {shape!r} is not a list of sizes")
    if (not isinstance(offs, list) or len(offs) != 2
            or not all(isinstance(o, int) and o >= 0 for o in offs) or offs[0] > offs[1]):
        raise _Bad(f"tensor {key!r}: data_offsets {offs!r} are not [begin, end]")
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits % 8 or bits // 8 != offs[1] - offs[0]:
        raise _Bad(f"tensor {key!r}: {dtype} {shape} needs {bits / 8:g} bytes, its "
                   f"data_offsets hold {offs[1] - offs[0]}")
    return offs[0], offs[1]


def check_safetensors(files: CheckpointFiles, name: str) -> list[FormatProblem]:
    try:
        head, data_len = _header(files, name, files.size(name))
        meta = head.pop("__metadata__", None)
        if meta is not None and not isinstance(meta, dict):
            raise _Bad("__metadata__ is not an object")
        spans = sorted((_span(k, t), k) for k, t in head.items())
        end = 0
        for (b, e), key in spans:
            if b != end:
                raise _Bad(f"tensor {key!r} begins at data byte {b}, the previous tensor "
                           f"ends at {end} (offsets not contiguous)")
            end = e
        if end > data_len:
            raise _Bad(f"tensors end at data byte {end}, past the {data_len} bytes of data "
                       "in the file (truncated?)")
        if end != data_len:
            raise _Bad(f"{data_len - end} bytes after the last tensor: the file does not end "
                       "where its header says")
    except (_Bad, Truncated) as exc:
        return [FormatProblem(name, f"safetensors: {exc}")]
    return []
