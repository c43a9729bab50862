"""One error hierarchy. Every error the filesystem raises knows the errno it becomes.

The FUSE adapter maps ``CkptfsError`` to ``FUSEError(err.errno)``; anything else that
escapes a handler is a bug, is logged with its traceback, and becomes EIO.
"""

from __future__ import annotations

import errno as _errno


class CkptfsError(Exception):
    """Base of every error ckptfs raises on purpose."""

    errno: int = _errno.EIO

    def __init__(self, message: str = "", *, errno: int | None = None) -> None:
        super().__init__(message)
        if errno is not None:
            self.errno = errno


class NotFound(CkptfsError):
    errno = _errno.ENOENT


class AlreadyExists(CkptfsError):
    errno = _errno.EEXIST


class NotEmpty(CkptfsError):
    errno = _errno.ENOTEMPTY


class NotADirectory(CkptfsError):
    errno = _errno.ENOTDIR


class IsADirectory(CkptfsError):
    errno = _errno.EISDIR


class NameTooLong(CkptfsError):
    errno = _errno.ENAMETOOLONG


class InvalidArgument(CkptfsError):
    errno = _errno.EINVAL


class NotPermitted(CkptfsError):
    errno = _errno.EPERM


class NotSupported(CkptfsError):
    errno = _errno.EOPNOTSUPP


class PermissionDenied(CkptfsError):
    errno = _errno.EACCES


class FileTooLarge(CkptfsError):
    """A write or truncate past the largest file ckptfs keeps (vfs/openfile.MAX_FILE_SIZE)."""

    errno = _errno.EFBIG


class NoAttribute(CkptfsError):
    """No such extended attribute."""

    errno = _errno.ENODATA


class NoSpace(CkptfsError):
    """No tier has room for a chunk."""

    errno = _errno.ENOSPC


class QuotaExceeded(CkptfsError):
    """A version would take its namespace past its quota (docs/governance.md "Quotas");
    nothing of it is committed."""

    errno = _errno.EDQUOT


class NoDaemon(CkptfsError):
    """A command needs the daemon of a mount and none serves it (killed or crashed: the
    mount point is left as a dead FUSE mount until it is mounted again)."""

    errno = _errno.ENOTCONN


class ResidencyRefused(CkptfsError):
    """A copy the residency of its namespace does not allow (no allowed tier for a write:
    freeing space would not help, so EIO, not ENOSPC; docs/governance.md)."""

    errno = _errno.EIO


class TierError(CkptfsError):
    """A tier failed (device gone, I/O error). The caller sees EIO.

    ``in_doubt``: the request may have reached the tier and no answer was read (a read
    timeout, a connection reset or closed mid-request, a failure not known): what it asked
    for may still happen later, e.g. a DELETE queued at the server. False when the tier
    answered (any status: the request is finished), when nothing was sent (a connect
    failure, a refused credential, a fenced write), or when the request changes nothing.
    The deleter keeps a remote claim for the tier's ``request_grace_s`` after a DELETE in
    doubt (upload/deleter.py)."""

    errno = _errno.EIO
    in_doubt: bool = False

    def __init__(
        self, message: str = "", *, errno: int | None = None, in_doubt: bool = False
    ) -> None:
        super().__init__(message, errno=errno)
        self.in_doubt = in_doubt


class TransientTierError(TierError):
    """A remote tier failed in a way worth retrying (throttling, 5xx, resets, timeouts)."""


class EndpointUnreachable(TransientTierError):
    """A remote endpoint does not answer at all: connection refused, DNS, no route, a
    connect timeout, or a health probe that fails after a request broke off."""


class PermanentTierError(TierError):
    """A remote tier refuses for good (access denied, no such bucket, bad credentials)."""


class AccessDenied(PermanentTierError):
    """The server refuses these credentials, or this bucket to them."""


class ChunkMissing(CkptfsError):
    """No tier holds a copy of a chunk the catalog references."""

    errno = _errno.EIO


class PeerChunkPending(ChunkMissing):
    """A shared catalog: the chunk is recorded only on another node's local tiers (not
    uploaded yet), and no copy reached a tier this node can read within peer_chunk_wait
    (or that node's session has ended: none will)."""

    def __init__(self, message: str, nodes: tuple[str, ...]) -> None:
        super().__init__(message)
        self.nodes = nodes


class CorruptChunk(CkptfsError):
    """A frame failed to decode or its digest did not match."""

    errno = _errno.EIO


class ObjectUnreadable(CorruptChunk):
    """One object cannot be read although its tier answers (a 500 on that key, a body cut
    short, a read that stalls): that copy is bad, not the tier."""



class CatalogUnavailable(CkptfsError):
    """The catalog's database server cannot be reached (down, refusing connections, or no
    connection free within the pool's wait), or a transaction kept conflicting with others
    past its retries. The call fails with EIO; nothing of it was committed, except when the
    connection broke during the COMMIT itself (then it may have been)."""

    errno = _errno.EIO

# The exit code of a refused input (UsageError, ConfigError, a bad command line): the CLI and
# the daemon (mount refused) exit with it.
EXIT_USAGE = 2
# The exit code of a command refused a path in a namespace the caller may not reach (EX_NOPERM).
EXIT_DENIED = 77


class UsageError(CkptfsError):
    """Bad input to a command rather than a failure while running: a mount point that does
    not exist, is a file, is mounted or not empty; a state dir in use; a tier directory that
    does not exist; a bucket that does not exist. The CLI exits with code 2."""

    errno = _errno.EINVAL


class ConfigError(CkptfsError):
    """Invalid configuration or command line. The CLI exits with code 2."""

    errno = _errno.EINVAL
