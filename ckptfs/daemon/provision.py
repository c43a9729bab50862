"""The namespaces' roots made at mount (docs/governance.md, "Provisioned roots"): a
``[[namespace]]`` whose root directory is missing gets it, with the owner, group and mode
of its config (config/nsroot.py), and the directories on the way to it (root's, 0755), so
that an operator needs neither a sticky mount root nor an admin override to start. A root
that exists is left as it is; one owned by others (or not a directory) is reported with a
WARNING. What each root was is recorded in the catalog (meta ``namespace_roots``) for
``ckptfs status``. Blocking: before the trio loop runs."""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from collections.abc import Sequence
from typing import Any, Protocol

from ..catalog import ROOT_INODE, Inode
from ..catalog.audit import AuditRecord
from ..catalog.protocols import MetaCatalog, NamespaceCatalog
from ..config.model import NamespaceConfig
from ..errors import AlreadyExists, NotFound

log = logging.getLogger("ckptfs.mount")

ROOTS_META = "namespace_roots"
ON_THE_WAY_MODE = 0o755  # a directory above a namespace root: anyone may traverse it


class ProvisionCatalog(NamespaceCatalog, MetaCatalog, Protocol):
    """Directories looked up and made; the roots' record."""


def _entry(catalog: ProvisionCatalog, parent: int, name: bytes, mode: int, uid: int,
           gid: int, path: str) -> tuple[Inode, bool]:
    """The entry ``name`` of ``parent``, made as a directory if missing; (inode, made).
    Another node sharing the catalog may make it at the same moment: then it is its."""
    try:
        return catalog.lookup(parent, name), False
    except NotFound:
        pass
    try:
        made = catalog.create(parent, name, stat.S_IFDIR | mode, uid, gid, audit=AuditRecord(
            "mkdir", uid=0, pid=os.getpid(), detail={"provisioned": True}))
        log.info("namespace root %s made: uid %d gid %d mode %04o", path, uid, gid, mode)
        return made, True
    except AlreadyExists:
        return catalog.lookup(parent, name), False


def provision_root(catalog: ProvisionCatalog, ns: NamespaceConfig) -> dict[str, Any]:
    """Make ``ns``'s root if missing; what it is now (the record ``status`` reads)."""
    want = {"uid": ns.root_uid, "gid": ns.root_gid, "mode": ns.root_mode}
    rec: dict[str, Any] = {"path": ns.path, "want": want, "created": False, "problem": None}
    if ns.root_uid is None or ns.root_gid is None or ns.root_mode is None:
        return rec
    parent, walked = ROOT_INODE, ""
    names = ns.path.strip("/").split("/")
    for i, name in enumerate(names):
        walked += "/" + name
        last = i == len(names) - 1
        uid, gid, mode = (ns.root_uid, ns.root_gid, ns.root_mode) if last else (
            0, 0, ON_THE_WAY_MODE)
        inode, made = _entry(catalog, parent, name.encode(), mode, uid, gid, walked)
        if not inode.is_dir:
            rec["problem"] = f"{walked} exists and is not a directory"
            log.warning("namespace %s: %s; its root cannot be made (%s)", ns.path,
                        rec["problem"], ns.origin)
            return rec
        parent = inode.ino
    rec["created"] = made
    if not made and (inode.uid, inode.gid) != (ns.root_uid, ns.root_gid):
        rec["problem"] = (f"owned by uid {inode.uid} gid {inode.gid}, the config says uid "
                          f"{ns.root_uid} gid {ns.root_gid}")
        log.warning("namespace root %s exists %s: left as it is (%s.owner, .group)",
                    ns.path, rec["problem"], ns.origin)
    elif not made and stat.S_IMODE(inode.mode) != ns.root_mode:
        log.info("namespace root %s exists with mode %04o, the config says %04o: left as it is",
                 ns.path, stat.S_IMODE(inode.mode), ns.root_mode)
    return rec


def provision_namespaces(catalog: ProvisionCatalog,
                         namespaces: Sequence[NamespaceConfig]) -> list[dict[str, Any]]:
    """Every namespace's root made where missing, and recorded for ``ckptfs status``."""
    before = {r["path"]: r for r in json.loads(catalog.get_meta(ROOTS_META) or "[]")}
    records = [provision_root(catalog, ns) for ns in namespaces]
    for rec in records:  # when ckptfs made it, this mount or an earlier one
        rec["created_ns"] = time.time_ns() if rec["created"] else (
            before.get(rec["path"], {}).get("created_ns"))
    if records or before:
        catalog.set_meta(ROOTS_META, json.dumps(records))
    return records
