"""torch.distributed.checkpoint over the direct path: DCP's FileSystemWriter and
FileSystemReader with a storage layer whose streams are direct files. Everything but the
bytes (mkdir, the .metadata rename that commits a DCP checkpoint, listings) goes through
the mount, as with the plain classes. Each thread has its own client (DCP's writer
threads each write one file at a time), so streams never share shared memory."""

from __future__ import annotations

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
    """``FileSystemReader`` whose files are read through the direct path."""

    def __init__(self, path: str | os.PathLike[str], **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.fs = DirectFileSystem(path)

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id:
            self.fs = DirectFileSystem(checkpoint_id)
        super().reset(checkpoint_id)


def open_read(path: str | os.PathLike[str]) -> IO[bytes]:
    """A binary file object for torch.load or safetensors' ``load(f.read())``: through
    the direct path, else the mount. Closing it ends its connection."""
    client = connect(path, MEMORY)
    if client is None:
        return open(path, "rb")
    return io.BufferedReader(DirectFile(client, path, owns_client=True), READ_BUFFER)
