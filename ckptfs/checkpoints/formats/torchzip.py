"""torch.save files (a zip archive): the end-of-central-directory record, the central
directory, every entry's local header and data within the file, the CRC-32 of each entry
(streamed), and the ``ARCHIVE/data.pkl`` torch.load starts from.

The zip layout follows PKWARE's APPNOTE (zip64 included); torch writes stored (method 0)
entries, and deflated ones (method 8) are checked too, streamed through zlib.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from .files import CheckpointFiles, FormatProblem, Truncated, read_exact, stream

ZIP_MAGIC = b"PK\x03\x04"
_EOCD = struct.Struct("<4sHHHHIIH")  # 22 bytes
_LOC64 = struct.Struct("<4sIQI")  # 20 bytes, just before the EOCD
_EOCD64 = struct.Struct("<4sQHHIIQQQQ")  # 56 bytes
_CDIR = struct.Struct("<4sHHHHHHIIIHHHHHII")  # 46 bytes
_LOCAL = struct.Struct("<4sHHHHHIIIHH")  # 30 bytes
_MAX_COMMENT = 0xFFFF
MAX_DIRECTORY = 256 << 20  # a central directory larger than this is not read


class ZipBroken(Exception):
    """The archive's structure is broken; the message says where."""


@dataclass(frozen=True)
class Entry:
    name: str
    method: int
    crc: int
    csize: int
    usize: int
    local_offset: int


def _find_eocd(files: CheckpointFiles, name: str, size: int) -> tuple[int, tuple[int, ...]]:
    if size < _EOCD.size:
        raise ZipBroken(f"{size} bytes: too short for a zip archive (truncated?)")
    start = max(0, size - _EOCD.size - _MAX_COMMENT)
    tail = read_exact(files, name, start, size - start)
    i = tail.rfind(b"PK\x05\x06")
    while i >= 0 and i + _EOCD.size + _EOCD.unpack_from(tail, i)[7] != len(tail):
        i = tail.rfind(b"PK\x05\x06", 0, i)
    if i < 0:
        raise ZipBroken("no zip end-of-central-directory record at the end "
                        "(truncated, or not a zip archive)")
    return start + i, _EOCD.unpack_from(tail, i)


def _directory_span(files: CheckpointFiles, name: str, size: int) -> tuple[int, int, int]:
    """(offset, size, entries) of the central directory."""
    at, (_sig, _d, _cd, _n, total, cd_size, cd_off, _c) = _find_eocd(files, name, size)
    end = at  # where the directory must end
    loc = _zip64_locator(files, name, at)
    if loc is not None:  # zip64: the zip64 end record's numbers count (as zipfile reads it)
        if loc + _EOCD64.size > at:
            raise ZipBroken("zip64 locator points past the end record")
        rec = _EOCD64.unpack(read_exact(files, name, loc, _EOCD64.size))
        if rec[0] != b"PK\x06\x06":
            raise ZipBroken(f"no zip64 end record at byte {loc}, where its locator points")
        total, cd_size, cd_off, end = rec[7], rec[8], rec[9], loc
    elif total == 0xFFFF or 0xFFFFFFFF in (cd_size, cd_off):
        raise ZipBroken("zip64 archive without its zip64 locator")
    if cd_off + cd_size > end:
        raise ZipBroken(f"central directory (bytes {cd_off}..{cd_off + cd_size}) runs past "
                        f"its end record at byte {end}")
    if cd_size > MAX_DIRECTORY:
        raise ZipBroken(f"central directory of {cd_size} bytes: larger than checked here")
    return cd_off, cd_size, total


def _zip64_locator(files: CheckpointFiles, name: str, eocd_at: int) -> int | None:
    """The offset of the zip64 end record a locator just before the EOCD names, if any."""
    if eocd_at < _LOC64.size:
        return None
    loc = _LOC64.unpack(read_exact(files, name, eocd_at - _LOC64.size, _LOC64.size))
    return int(loc[2]) if loc[0] == b"PK\x06\x07" else None


def _zip64_fields(extra: bytes, usize: int, csize: int, off: int) -> tuple[int, int, int]:
    pos = 0
    while pos + 4 <= len(extra):
        tag, n = struct.unpack_from("<HH", extra, pos)
        if tag == 1:
            vals = list(struct.unpack_from(f"<{n // 8}Q", extra, pos + 4))
            if usize == 0xFFFFFFFF and vals:
                usize = vals.pop(0)
            if csize == 0xFFFFFFFF and vals:
                csize = vals.pop(0)
            if off == 0xFFFFFFFF and vals:
                off = vals.pop(0)
            break
        pos += 4 + n
    return usize, csize, off


def read_directory(files: CheckpointFiles, name: str) -> tuple[list[Entry], int]:
    """The entries of the archive and the offset of its central directory."""
    cd_off, cd_size, total = _directory_span(files, name, files.size(name))
    raw = read_exact(files, name, cd_off, cd_size)
    out: list[Entry] = []
    pos = 0
    while pos + _CDIR.size <= len(raw) and raw[pos:pos + 4] == b"PK\x01\x02":
        f = _CDIR.unpack_from(raw, pos)
        n_len, x_len, c_len = f[10], f[11], f[12]
        ename = raw[pos + 46:pos + 46 + n_len].decode("utf-8", "replace")
        extra = raw[pos + 46 + n_len:pos + 46 + n_len + x_len]
        usize, csize, off = _zip64_fields(extra, f[9], f[8], f[16])
        out.append(Entry(ename, f[4], f[7], csize, usize, off))
        pos += _CDIR.size + n_len + x_len + c_len
    if len(out) != total or pos != len(raw):
        raise ZipBroken(f"central directory holds {len(out)} readable entries of the "
                        f"{total} its end record counts (damaged directory)")
    return out, cd_off


def _data_start(files: CheckpointFiles, name: str, e: Entry, cd_off: int) -> int:
    if e.local_offset + _LOCAL.size > cd_off:
        raise ZipBroken(f"entry {e.name}: local header at byte {e.local_offset} is past the "
                        f"start of the central directory ({cd_off})")
    h = _LOCAL.unpack(read_exact(files, name, e.local_offset, _LOCAL.size))
    if h[0] != ZIP_MAGIC:
        raise ZipBroken(f"entry {e.name}: no local header at byte {e.local_offset}")
    start = e.local_offset + _LOCAL.size + h[9] + h[10]
    if start + e.csize > cd_off:
        raise ZipBroken(f"entry {e.name}: data (bytes {start}..{start + e.csize}) runs past "
                        f"the central directory at byte {cd_off}")
    return start


def _crc_of(files: CheckpointFiles, name: str, e: Entry, start: int) -> tuple[int, int] | None:
    """(CRC-32, uncompressed length) of the entry's data; None for a method not checked."""
    crc, n = 0, 0
    if e.method == 0:
        for piece in stream(files, name, start, e.csize):
            crc, n = zlib.crc32(piece, crc), n + len(piece)
        return crc, n
    if e.method != 8:
        return None
    z = zlib.decompressobj(-zlib.MAX_WBITS)
    try:
        for piece in stream(files, name, start, e.csize):
            out = z.decompress(piece, 1 << 22)
            while True:
                crc, n = zlib.crc32(out, crc), n + len(out)
                if not z.unconsumed_tail:
                    break
                out = z.decompress(z.unconsumed_tail, 1 << 22)
        out = z.flush()
    except zlib.error as exc:
        raise ZipBroken(f"entry {e.name}: deflate data is damaged ({exc})") from None
    return zlib.crc32(out, crc), n + len(out)


def check_zip(files: CheckpointFiles, name: str, torch_archive: bool) -> list[FormatProblem]:
    """Every structural problem of the archive ``name``; with ``torch_archive``, also
    that torch.load finds its ``ARCHIVE/data.pkl``."""
    try:
        entries, cd_off = read_directory(files, name)
    except (ZipBroken, Truncated) as exc:
        return [FormatProblem(name, f"torch/zip archive: {exc}")]
    out: list[FormatProblem] = []
    for e in entries:
        try:
            start = _data_start(files, name, e, cd_off)
            got = _crc_of(files, name, e, start)
        except (ZipBroken, Truncated) as exc:
            out.append(FormatProblem(name, f"torch/zip archive: {exc}"))
            continue
        if got is not None and got[0] != e.crc:
            out.append(FormatProblem(name, f"torch/zip archive: entry {e.name} fails its "
                                     f"CRC-32 (stored {e.crc:08x}, data gives {got[0]:08x}): "
                                     "its bytes changed after they were written"))
        elif got is not None and got[1] != e.usize:
            out.append(FormatProblem(name, f"torch/zip archive: entry {e.name} holds "
                                     f"{got[1]} bytes, its directory says {e.usize}"))
    if torch_archive and not any(_is_data_pkl(e.name) for e in entries):
        out.append(FormatProblem(name, "torch.save archive without ARCHIVE/data.pkl: "
                                 "torch.load cannot read it"))
    return out


def _is_data_pkl(entry: str) -> bool:
    parts = entry.split("/")
    return len(parts) == 2 and parts[1] == "data.pkl"
