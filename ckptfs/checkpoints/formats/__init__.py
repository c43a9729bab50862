"""Placeholder until branch r36/drillfmt is merged: the format checks' interface only
(check_checkpoint finds nothing)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


class CheckpointFiles(Protocol):
    def names(self) -> list[str]: ...  # "/"-separated paths relative to the checkpoint root

    def size(self, name: str) -> int: ...

    def read(self, name: str, offset: int, length: int) -> bytes: ...


@dataclass(frozen=True)
class FormatProblem:
    file: str
    what: str


class DirFiles:
    """CheckpointFiles over a directory on disk, or over one file (names() == [name])."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def names(self) -> list[str]:
        if self.root.is_file():
            return [self.root.name]
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file())

    def _path(self, name: str) -> Path:
        return self.root if self.root.is_file() else self.root / name

    def size(self, name: str) -> int:
        return self._path(name).stat().st_size

    def read(self, name: str, offset: int, length: int) -> bytes:
        with open(self._path(name), "rb") as f:
            f.seek(offset)
            return f.read(length)


def check_checkpoint(files: CheckpointFiles, layout: str) -> list[FormatProblem]:
    return []
