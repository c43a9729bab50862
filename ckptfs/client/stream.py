"""File objects over the direct path: what torch.save, torch.load, safetensors and DCP's
storage layer write to and read from (docs/direct-path.md, "The torch plugin")."""

from __future__ import annotations

import io
import os

from .session import DirectClient


class DirectWriteStream(io.RawIOBase):
    """A new file written sequentially: bytes are put straight into the client's shared
    memory and sent as one WRITE whenever it is full; ``close`` sends the rest and commits
    (``sync``: FSYNC first). Not thread-safe: one stream per client at a time."""

    def __init__(self, client: DirectClient, path: str | os.PathLike[str], sync: bool = False,
                 mode: int = 0o666) -> None:
        super().__init__()
        self.client, self.sync = client, sync
        self.handle = client.create(path, mode)
        self.pos = 0  # the file offset of the next byte written
        self.staged = 0  # bytes in the shared memory not sent yet (they end at pos)

    def writable(self) -> bool:
        return True

    def write(self, b: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        view = memoryview(b).cast("B")
        done = 0
        while done < len(view):
            n = min(self.client.memory - self.staged, len(view) - done)
            self.client.mem[self.staged: self.staged + n] = view[done: done + n]
            self.staged += n
            self.pos += n
            done += n
            if self.staged == self.client.memory:
                self._send()
        return done

    def _send(self) -> None:
        if self.staged:
            self.client.write_staged(self.handle, self.pos - self.staged, self.staged)
            self.staged = 0

    def tell(self) -> int:
        return self.pos

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._send()
            if self.sync:
                self.client.fsync(self.handle)
        finally:
            super().close()
            self.client.close(self.handle)  # the commit: its error is close()'s


class DirectFile(io.RawIOBase):
    """A file read by offset (readinto, seek, tell): each readinto is one READ. Wrap it in
    ``io.BufferedReader`` for readers of small pieces (torch.load's zip headers)."""

    def __init__(self, client: DirectClient, path: str | os.PathLike[str],
                 owns_client: bool = False) -> None:
        super().__init__()
        self.client, self.owns_client = client, owns_client
        self.handle, self.size = client.open(path)
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buf: bytearray | memoryview) -> int:  # type: ignore[override]
        n = self.client.preadinto(self.handle, buf, self.pos)
        self.pos += n
        return n

    def seek(self, off: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self.pos, os.SEEK_END: self.size}[whence]
        self.pos = base + off
        return self.pos

    def tell(self) -> int:
        return self.pos

    def close(self) -> None:
        if not self.closed:
            super().close()
            try:
                self.client.close(self.handle)
            finally:
                if self.owns_client:
                    self.client.close_connection()
