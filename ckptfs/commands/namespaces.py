"""What a command may show the user who runs it: the checkpoints and paths of the
namespaces that user may reach (docs/governance.md, "Namespaces and access").

Two ways, one rule:

* The caller can read the state dir (the daemon's user, or root): the command reads the
  catalog itself and shows only what the caller's real uid and groups may reach, by the
  rules the daemon recorded (meta ``access``, config/recorded_access.py). A path in
  another namespace is refused (exit 77).
* It cannot (the state dir is private): the daemon answers through the mount, which knows
  the caller from the FUSE request (``user.ckptfs.checkpoints``, vfs/listing.py) and
  answers EACCES for another namespace's path.
"""

from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..catalog.protocols import MetaCatalog
from ..config import DEFAULT_NAMESPACE, GovernanceConfig
from ..config.recorded_access import access_from_record
from ..errors import CkptfsError, PermissionDenied
from ..vfs.listing import XATTR_LIST


class NamespaceDenied(PermissionDenied):
    """A path in a namespace the caller may not reach (the CLI exits with EXIT_DENIED)."""


@dataclass(frozen=True)
class Viewer:
    """The user running the command, against the rules the daemon recorded."""

    gov: GovernanceConfig
    uid: int
    gids: frozenset[int]

    @classmethod
    def of(cls, catalog: MetaCatalog) -> Viewer:
        return cls(access_from_record(catalog.get_meta("access")), os.getuid(),
                   frozenset((os.getgid(), *os.getgroups())))

    def may_see(self, path: str) -> bool:
        ns = self.gov.namespace_for(path)
        if ns is DEFAULT_NAMESPACE or ns.owned_by(self.uid, self.gids):
            return True
        return self.gov.is_admin(self.gids)

    def require(self, inner: str, shown: Path | str) -> None:
        """``inner`` (a path inside the mount) or the namespace holding it may be reached."""
        if not self.may_see(inner):
            raise denied(shown, self.gov.namespace_for(inner).path, self.uid)


def denied(shown: Path | str, ns: str | None, uid: int) -> NamespaceDenied:
    where = f"namespace {ns}" if ns else "its namespace"
    return NamespaceDenied(f"{shown}: permission denied: {where} belongs to other users "
                           f"(uid {uid} is not an owner)")


def listed(mnt: Path, inner: str) -> list[dict[str, Any]]:
    """The checkpoints under ``inner`` the daemon shows this caller, through the mount
    (page by page); each with its ``path`` on this machine."""
    target = mnt / inner.lstrip("/")
    name = XATTR_LIST.decode()
    out: list[dict[str, Any]] = []
    while True:
        try:
            raw = os.getxattr(target, name)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM):
                raise denied(target, None, os.getuid()) from None
            if exc.errno in (errno.ENODATA, errno.ENOTSUP):
                raise CkptfsError(f"{target}: the daemon does not list checkpoints through the "
                                  "mount (an older ckptfs); run this as its user or root") from None
            raise CkptfsError(f"{target}: {exc.strerror}") from None
        page = json.loads(raw)
        for info in page["checkpoints"]:
            info["path"] = str(mnt) + info["root"]
            out.append(info)
        if page["next"] is None:
            return out
        name = f"{XATTR_LIST.decode()}.{page['next']}"
