"""torch.distributed.checkpoint over the direct path: DCP's FileSystemWriter and
FileSystemReader with a storage layer whose streams are direct files. Everything but the
bytes (mkdir, the .metadata rename that commits a DCP checkpoint, listings) goes through
the mount, as with the plain classes. Each thread has its own client (DCP's writer
threads each write one file at a time), so streams never share shared memory."""

from __future__ import annotations

import errno
import io
import os
import threading
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, cast

from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from ..client import DirectClient, DirectFile, DirectWriteStream, connect

MEMORY = 64 << 20  # shared memory per client: a WRITE or READ moves up to 4 chunks of 16 MiB
READ_BUFFER = 1 << 20  # torch.load reads zip headers in small pieces


class DirectFileSystem(FileSystem):
    def __init__(self, path: str | os.PathLike[str], sync: bool = True,
                 memory: int = MEMORY) -> None:
        super().__init__()
        self.where, self.sync, self.memory = Path(path), sync, memory
        self._local = threading.local()
        first = connect(self.where, memory)
        self.direct = first is not None  # False: the mount path (connect said why)
        self._local.client = first

    def _client(self) -> DirectClient | None:
        if not self.direct:
            return None
        client: DirectClient | None = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = connect(self.where, self.memory)
        return client

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str
                      ) -> Generator[io.IOBase, None, None]:
        client = self._client()
        if client is None or mode not in ("wb", "rb"):
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        if mode == "wb":
            w = DirectWriteStream(client, path, sync=self.sync)
            with w:  # the close is the commit (DCP may close it first: idempotent)
                yield w
            return
        r = io.BufferedReader(DirectFile(client, path), READ_BUFFER)
        with r:
            yield r


class DirectWriter(FileSystemWriter):
    """``FileSystemWriter`` whose files are written through the direct path. ``sync_files``
    is kept by the streams themselves (FSYNC before the commit): DCP's own fsync needs a
    descriptor and would fall back to a whole-system sync()."""

    def __init__(self, path: str | os.PathLike[str], *, sync_files: bool = True,
                 **kwargs: Any) -> None:
        fs = DirectFileSystem(path, sync=sync_files)
        super().__init__(path, sync_files=sync_files and not fs.direct, **kwargs)
        self.fs = fs

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id:  # perhaps another mount: its own daemon
            self.fs = DirectFileSystem(checkpoint_id, sync=cast(DirectFileSystem, self.fs).sync)
        super().reset(checkpoint_id)


class DirectReader(FileSystemReader):
    """``FileSystemReader`` whose files are read through the direct path. Each item is
    read whole (``_slice_file``): its chunks in one READ, fetched by the daemon at once,
    and torch.load parses it in memory, instead of reading the file view in 1 MiB pieces
    that jump to the item's zip directory at its end and back (each jump a READ that
    waits for a chunk, and a break in the daemon's sequential readahead)."""

    def __init__(self, path: str | os.PathLike[str], **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.fs = DirectFileSystem(path)

    def _slice_file(self, file: Any, sinfo: Any) -> IO[bytes]:
        raw = getattr(file, "raw", None)
        if not isinstance(raw, DirectFile):  # the mount's file (no socket)
            return cast(IO[bytes], super()._slice_file(file, sinfo))
        buf = bytearray(sinfo.length)
        got = raw.client.preadinto(raw.handle, buf, sinfo.offset)
        if got != sinfo.length:
            raise OSError(errno.EIO, f"an item of {sinfo.length} bytes at {sinfo.offset} "
                          "is past the end of its file")
        return cast(IO[bytes], _Item(buf))

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id:
            self.fs = DirectFileSystem(checkpoint_id)
        super().reset(checkpoint_id)


class _Item(io.RawIOBase):
    """A seekable binary file over bytes already read (no copy of them, as BytesIO of a
    bytearray would make)."""

    def __init__(self, buf: bytearray) -> None:
        super().__init__()
        self.view, self.pos = memoryview(buf), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        out = memoryview(b).cast("B")
        n = max(0, min(len(out), len(self.view) - self.pos))
        out[:n] = self.view[self.pos: self.pos + n]
        self.pos += n
        return n

    def read(self, size: int | None = -1) -> bytes:
        end = len(self.view) if size is None or size < 0 else self.pos + size
        out = bytes(self.view[self.pos: end])  # one copy (RawIOBase's read makes two)
        self.pos += len(out)
        return out

    def seek(self, off: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: len(self.view)}[whence]
        self.pos = base + off
        return self.pos

    def tell(self) -> int:
        return self.pos


def open_read(path: str | os.PathLike[str]) -> IO[bytes]:
    """A binary file object for torch.load or safetensors' ``load(f.read())``: through
    the direct path, else the mount. Closing it ends its connection."""
    client = connect(path, MEMORY)
    if client is None:
        return open(path, "rb")
    return io.BufferedReader(DirectFile(client, path, owns_client=True), READ_BUFFER)
