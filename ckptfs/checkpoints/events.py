"""The interface between the filesystem and the checkpoint detectors.

The filesystem reports what happened (``FsEvent``) after each operation took effect; the
detectors (pure logic, ``detectors.py``) turn event sequences into ``Detection``s: a
checkpoint began, or it is committed. Paths are absolute inside the mount, "/" separated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# Event kinds.
CREATE = "create"  # a regular file was created (open O_CREAT of a new name)
WRITE = "write"  # first write to a file since it was opened (once per open file, not per call)
RELEASE = "release"  # a handle that wrote to the file was closed
RENAME = "rename"  # src -> path (file or directory)
SYMLINK = "symlink"  # path is a new symlink to ``target``
CHMOD = "chmod"  # mode of path changed (``mode``)
UNLINK = "unlink"
MKDIR = "mkdir"
RMDIR = "rmdir"


@dataclass(frozen=True)
class FsEvent:
    kind: str
    path: str  # for RENAME: the new path
    time_ns: int
    src: str | None = None  # RENAME: the old path
    is_dir: bool = False
    size: int = 0  # file size after the operation
    mode: int = 0  # st_mode after the operation
    target: str | None = None  # SYMLINK: the link target
    # RELEASE: no other handle that wrote to this file remains open (the last writer).
    last_writer: bool = False
    # RELEASE of a file of at most SMALL_FILE bytes: its content (tracker files such as
    # DeepSpeed's `latest` or Megatron's `latest_checkpointed_iteration.txt`).
    content: bytes | None = None
    # RELEASE: the file's last bytes (at most TAIL bytes; a torch.save zip ends with the
    # end-of-central-directory record, b"PK\x05\x06" 22 bytes from the end).
    tail: bytes | None = None
    # Replayed at a mount from the catalog's records of a close or rename whose event a
    # crash may have lost (tracker.py): recorded only where it adds what is missing.
    replayed: bool = False


SMALL_FILE = 4096
TAIL = 64


@dataclass(frozen=True)
class Detection:
    kind: str  # "begin" (a checkpoint is being written) or "commit" (it is complete)
    root: str  # the checkpoint: a directory, or a single file (torch.save, Lightning .ckpt)
    framework: str  # detector name: "torch", "safetensors", "dcp", "hf", "deepspeed", ...
    step: int | None
    time_ns: int
    reason: str  # what made it fire, for logs and `ckptfs show`


class NamespaceView(Protocol):
    """Read-only questions a detector may ask about the current namespace."""

    def exists(self, path: str) -> bool: ...
    def is_dir(self, path: str) -> bool: ...
    def listdir(self, path: str) -> list[str]: ...
    def open_writers_under(self, path: str) -> int: ...


class Detector(Protocol):
    name: str

    def observe(self, ev: FsEvent, ns: NamespaceView) -> list[Detection]: ...

    def tick(self, now_ns: int, ns: NamespaceView) -> list[Detection]: ...
