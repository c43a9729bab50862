"""Control xattrs (``user.ckptfs.gc``, ``.tag``, ``.prefetch``): commands, not data.

On an ``allow_other`` mount every local user reaches them, so each acts only for the owner
of the inode it is set on (or root), and only on that inode's subtree: a user who owns one
run directory cannot start retention over every run, or tag someone else's checkpoint.
"""

from __future__ import annotations

from ..catalog import Inode
from ..errors import NotPermitted
from .context import RequestContext

XATTR_TAG = b"user.ckptfs.tag"
XATTR_GC = b"user.ckptfs.gc"
XATTR_PREFETCH = b"user.ckptfs.prefetch"  # stage a file's chunks on the local tiers
CONTROL_XATTRS = (XATTR_TAG, XATTR_GC, XATTR_PREFETCH)


def is_control(name: bytes) -> bool:
    return name in CONTROL_XATTRS


def check_control(inode: Inode, name: bytes, caller: RequestContext) -> None:
    """Only the owner of ``inode`` (or root) may set control xattr ``name`` on it."""
    if not caller.owns(inode.uid):
        raise NotPermitted(
            f"{name.decode()}: only the owner (uid {inode.uid}) or root may set it; "
            f"uid {caller.uid} may not"
        )
