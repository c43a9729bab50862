"""What a format check reads: a checkpoint's files by name (``CheckpointFiles``), the
problems it reports (``FormatProblem``), and the files on disk (``DirFiles``).

The checks read headers, directories and metadata through ``read``; none holds a whole
tensor in memory (a CRC streams in ``STREAM_BLOCK`` pieces).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

STREAM_BLOCK = 1 << 20  # bytes a streaming check reads at once


class CheckpointFiles(Protocol):
    def names(self) -> list[str]: ...   # "/"-separated paths relative to the checkpoint root
    def size(self, name: str) -> int: ...
    def read(self, name: str, offset: int, length: int) -> bytes: ...


@dataclass(frozen=True)
class FormatProblem:
    file: str  # name within the checkpoint ("" for the checkpoint as a whole)
    what: str  # one line an operator understands


class DirFiles:
    """``CheckpointFiles`` over a directory on disk (every regular file under it, symlinks
    to files included), or over one file (``names() == [its name]``)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._single = self.root.is_file()

    def names(self) -> list[str]:
        if self._single:
            return [self.root.name]
        out: list[str] = []
        for dirpath, _dirs, files in os.walk(self.root, onerror=_raise):
            rel = Path(dirpath).relative_to(self.root)
            for f in files:
                p = Path(dirpath, f)
                if p.is_file():
                    out.append((rel / f).as_posix())
        return sorted(out)

    def _path(self, name: str) -> Path:
        if self._single:
            if name != self.root.name:
                raise FileNotFoundError(name)
            return self.root
        parts = name.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise FileNotFoundError(name)
        return self.root.joinpath(*parts)

    def size(self, name: str) -> int:
        return self._path(name).stat().st_size

    def read(self, name: str, offset: int, length: int) -> bytes:
        with open(self._path(name), "rb") as f:
            return os.pread(f.fileno(), length, offset)


def _raise(exc: OSError) -> None:
    raise exc  # a directory that cannot be listed must not look empty


class SubFiles:
    """The files under ``prefix/`` of another ``CheckpointFiles``, named relative to it
    (a DCP directory inside a Megatron or HF checkpoint)."""

    def __init__(self, files: CheckpointFiles, prefix: str) -> None:
        self.files = files
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""

    def names(self) -> list[str]:
        n = len(self.prefix)
        return [x[n:] for x in self.files.names() if x.startswith(self.prefix)]

    def size(self, name: str) -> int:
        return self.files.size(self.prefix + name)

    def read(self, name: str, offset: int, length: int) -> bytes:
        return self.files.read(self.prefix + name, offset, length)


class Truncated(Exception):
    """A read came back short: the file ends before what its header says."""


def read_exact(files: CheckpointFiles, name: str, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset``, or ``Truncated`` naming where the file ended.
    Reads loop: a ``CheckpointFiles`` may return fewer bytes than asked."""
    first = files.read(name, offset, length)
    if len(first) == length:
        return first  # the usual case: no copy
    out = bytearray(first)
    while len(out) < length:
        got = files.read(name, offset + len(out), length - len(out))
        if not got:
            raise Truncated(f"ends at byte {offset + len(out)}, "
                            f"{length - len(out)} bytes short of {offset + length}")
        out += got
    return bytes(out)


def stream(files: CheckpointFiles, name: str, offset: int, length: int) -> Iterator[bytes]:
    """``length`` bytes at ``offset`` in pieces of at most ``STREAM_BLOCK``."""
    pos, end = offset, offset + length
    while pos < end:
        piece = read_exact(files, name, pos, min(STREAM_BLOCK, end - pos))
        pos += len(piece)
        yield piece
