"""The direct path's client (docs/direct-path.md): bulk bytes to and from a ckptfs daemon
over its Unix socket and a shared memfd, for checkpoint libraries. Imports nothing of the
daemon (an import-linter contract); ``connect`` gives None where there is no direct path
(another machine's mount, an old daemon), and the caller uses the mount."""

from .discover import connect, find_socket
from .session import DirectClient
from .stream import DirectFile, DirectWriteStream

__all__ = ["DirectClient", "DirectFile", "DirectWriteStream", "connect", "find_socket"]
