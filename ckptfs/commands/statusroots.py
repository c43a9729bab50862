"""The namespaces' roots in `ckptfs status`: what the last mount recorded of each
(catalog meta ``namespace_roots``: the owner, group and mode its config asks for, whether
ckptfs made it, a problem it reported; daemon/provision.py) and what the root is now in the
catalog (owner, group and mode may have changed since)."""

from __future__ import annotations

import contextlib
import json
import stat
from typing import Any, Protocol

from ..catalog.protocols import MetaCatalog, NamespaceCatalog
from ..errors import CkptfsError

ROOTS_META = "namespace_roots"  # written by daemon/provision.py


class RootsCatalog(MetaCatalog, NamespaceCatalog, Protocol):
    """The recorded roots, and the inodes at their paths."""


def root_facts(catalog: RootsCatalog) -> dict[str, dict[str, Any]]:
    """Per namespace path: ``root`` (``uid``, ``gid``, ``mode`` as an octal string, or
    None where it is missing or not a directory), ``want`` (the config's), ``created``
    (ckptfs made it: the time in ns, or None), ``differs`` (the keys that differ from the
    config's) and ``problem`` (what the mount reported, or None)."""
    out: dict[str, dict[str, Any]] = {}
    for rec in json.loads(catalog.get_meta(ROOTS_META) or "[]"):
        inode = None
        with contextlib.suppress(CkptfsError):
            inode = catalog.resolve(rec["path"])
        now = None
        if inode is not None and stat.S_ISDIR(inode.mode):
            now = {"uid": inode.uid, "gid": inode.gid, "mode": f"{stat.S_IMODE(inode.mode):04o}"}
        want = rec.get("want") or {}
        want_mode = want.get("mode")
        wanted = {"uid": want.get("uid"), "gid": want.get("gid"),
                  "mode": None if want_mode is None else f"{want_mode:04o}"}
        differs = [] if now is None else [k for k in ("uid", "gid", "mode")
                                          if wanted[k] is not None and now[k] != wanted[k]]
        out[rec["path"]] = {"root": now, "want": wanted, "created": rec.get("created_ns"),
                            "differs": differs, "problem": rec.get("problem")}
    return out


def root_text(r: dict[str, Any] | None) -> str:
    """What a namespace's status line adds about its root ("" when nothing was recorded)."""
    if r is None:
        return ""
    now = r["root"]
    if now is None:
        return f"; root missing ({r['problem'] or 'not made yet'})"
    text = f"; root uid {now['uid']} gid {now['gid']} mode {now['mode']}"
    if r["created"] is not None:
        text += ", made by ckptfs"
    if r["differs"]:
        w = r["want"]
        text += (f", differs from the config ({', '.join(r['differs'])}: config uid {w['uid']} "
                 f"gid {w['gid']} mode {w['mode']})")
    return text
