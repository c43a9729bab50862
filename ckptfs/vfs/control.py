"""Control xattrs (``user.ckptfs.gc``, ``.tag``, ``.prefetch``): commands, not data.

On an ``allow_other`` mount every local user reaches them, so each acts only for the owner
of the inode it is set on (or root), and only on that inode's subtree: a user who owns one
run directory cannot start retention over every run, or tag someone else's checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..catalog import Inode
from ..errors import NotPermitted

XATTR_TAG = b"user.ckptfs.tag"
XATTR_GC = b"user.ckptfs.gc"
XATTR_PREFETCH = b"user.ckptfs.prefetch"  # stage a file's chunks on the local tiers
CONTROL_XATTRS = (XATTR_TAG, XATTR_GC, XATTR_PREFETCH)


@dataclass(frozen=True)
class Caller:
    """Who sent a request (the FUSE request context)."""

    uid: int
    gid: int
    pid: int


ROOT = Caller(0, 0, 0)  # requests ckptfs makes itself, and callers without a context


def is_control(name: bytes) -> bool:
    return name in CONTROL_XATTRS


def check_control(inode: Inode, name: bytes, caller: Caller) -> None:
    """Only the owner of ``inode`` (or root) may set control xattr ``name`` on it."""
    if caller.uid != 0 and caller.uid != inode.uid:
        raise NotPermitted(
            f"{name.decode()}: only the owner (uid {inode.uid}) or root may set it; "
            f"uid {caller.uid} may not"
        )
