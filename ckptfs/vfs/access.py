"""Namespace access: may this caller reach inside this namespace (docs/governance.md,
"Namespaces and access")?

A ``[[namespace]]`` subtree is reached only by its owners (uids, gids) and members of an
``[access] admin_gids`` group, whatever the mode bits say; root is not exempt. The root
directory of a namespace stays visible in its parent (its name and stat), nothing below.

The namespace of an inode never changes while it exists: a rename or link across
namespaces, or of a directory on the way to a namespace root, is refused (EXDEV for a
caller who may reach both sides, so ``mv`` copies through the per-file rules; EACCES
otherwise). So the place of each inode is cached once resolved (lookups teach it), and a
check costs a dictionary read; only an inode not seen yet costs a ``path_of``.

Checks run at lookup, open and the other namespace operations, never per read or write.
The daemon's own work (``ROOT``, the exact object) is exempt. Each refusal is counted for
the audit log (vfs/refusals.py: one record per uid, namespace and operation per window).
"""

from __future__ import annotations

import errno
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import trio

from ..catalog.audit import AuditRecord
from ..catalog.catalog import ROOT_INODE
from ..catalog.protocols import AuditCatalog, NamespaceCatalog
from ..config import DEFAULT_NAMESPACE, GovernanceConfig, NamespaceConfig
from ..errors import CkptfsError, PermissionDenied
from .context import ROOT, RequestContext, read_groups
from .refusals import Refusals

log = logging.getLogger("ckptfs.access")

# Supplementary groups of a process, kept this long (a setgroups(2) takes effect after it).
GROUPS_TTL_S = 1.0
GROUPS_MAX = 1024
PLACES_MAX = 1 << 18  # inodes whose place is remembered (oldest out; a miss costs a path_of)


class CrossNamespace(CkptfsError):
    """A rename or link across namespaces: the caller may reach both sides, but the
    namespace is like another filesystem (its keys, quota and residency), so ``mv`` copies."""

    errno = errno.EXDEV


@dataclass(frozen=True)
class Place:
    """Where an inode sits: its namespace, and, for the namespace's root, ``is_root``. A
    default-namespace directory on the way to a namespace root keeps its ``path``: the
    namespace of its children depends on their names."""

    ns: NamespaceConfig
    is_root: bool = False
    path: str | None = None

    @property
    def guarded(self) -> bool:
        """Names below this directory belong to a namespace (not the default one)."""
        return self.ns is not DEFAULT_NAMESPACE


def _join(base: str, name: bytes) -> str:
    return base.rstrip("/") + "/" + name.decode(errors="surrogateescape")


class AccessCatalog(NamespaceCatalog, AuditCatalog, Protocol):
    """What the rules read (an inode's path) and note (the refusals' audit records)."""


class Access:
    """The namespace rules of one mount. Built by the composition root (mount.py)."""

    def __init__(
        self, gov: GovernanceConfig, catalog: AccessCatalog | None = None,
        db_limiter: trio.CapacityLimiter | None = None,
        groups_of: Callable[[int], tuple[int, ...]] = read_groups,
        refusals: Refusals | None = None,
    ) -> None:
        self.gov = gov
        self.refusals = refusals
        self.enabled = gov.enabled
        self._catalog = catalog
        self._db_limiter = db_limiter
        self._groups_of = groups_of
        self._places: OrderedDict[int, Place] = OrderedDict()
        self._groups: OrderedDict[tuple[int, int, int], tuple[tuple[int, ...], float]] = OrderedDict()
        self._ancestors = {
            ns.path.rsplit("/", i)[0] or "/"
            for ns in gov.namespaces for i in range(1, ns.path.count("/") + 1)
        }

    # -- places --------------------------------------------------------------------------

    def place_of_path(self, path: str) -> Place:
        ns = self.gov.namespace_for(path)
        if ns is not DEFAULT_NAMESPACE:
            return Place(ns, is_root=path == ns.path)
        return Place(ns, path=path if path in self._ancestors else None)

    def _child(self, parent: Place, name: bytes) -> Place:
        if parent.path is None:
            return Place(parent.ns)  # inside a namespace, or far from any
        return self.place_of_path(_join(parent.path, name))

    def _remember(self, ino: int, place: Place) -> None:
        self._places[ino] = place
        self._places.move_to_end(ino)
        if len(self._places) > PLACES_MAX:
            self._places.popitem(last=False)

    async def place(self, ino: int) -> Place:
        if ino == ROOT_INODE:
            return self.place_of_path("/")
        known = self._places.get(ino)
        if known is not None:
            return known
        assert self._catalog is not None and self._db_limiter is not None
        path = await trio.to_thread.run_sync(self._catalog.path_of, ino, limiter=self._db_limiter)
        place = self.place_of_path(path)
        if not path.startswith("<"):  # "<unlinked>": reachable by handle only, not cached
            self._remember(ino, place)
        return place

    async def child_place(self, parent: int, name: bytes) -> Place:
        return self._child(await self.place(parent), name)

    def learn(self, parent: int, name: bytes, ino: int) -> None:
        """``ino`` is now known as ``name`` in ``parent`` (a lookup, create, readdir)."""
        if not self.enabled:
            return
        known = self.place_of_path("/") if parent == ROOT_INODE else self._places.get(parent)
        if known is not None:
            self._remember(ino, self._child(known, name))

    def guarded(self, parent: int) -> bool:
        """Must the kernel ask again for each name below ``parent`` (entry timeout 0)? Its
        dentry cache is shared by every user: a name one owner looked up must not let a
        stranger's path walk through without a LOOKUP. Unknown directories: yes."""
        if not self.enabled:
            return False
        if parent == ROOT_INODE:
            return False
        known = self._places.get(parent)
        return known is None or known.guarded

    # -- who --------------------------------------------------------------------------------

    async def _gids(self, ctx: RequestContext) -> frozenset[int]:
        """The caller's gid and supplementary groups, read from /proc/PID/status only when
        the uid alone does not decide, and kept a moment: a group owner's path walk asks
        once per name (entry timeout 0)."""
        groups = ctx.groups
        if not groups and ctx.pid > 0:
            key = (ctx.pid, ctx.uid, ctx.gid)
            now = time.monotonic()
            hit = self._groups.get(key)
            if hit is not None and now - hit[1] < GROUPS_TTL_S:
                groups = hit[0]
            else:
                groups = await trio.to_thread.run_sync(self._groups_of, ctx.pid)
                self._groups[key] = (groups, now)
                if len(self._groups) > GROUPS_MAX:
                    self._groups.popitem(last=False)
        return frozenset((ctx.gid, *groups))

    async def _path(self, ino: int, name: bytes | None) -> str:
        assert self._catalog is not None and self._db_limiter is not None
        try:
            base = await trio.to_thread.run_sync(self._catalog.path_of, ino,
                                                 limiter=self._db_limiter)
        except CkptfsError:
            base = f"<inode {ino}>"
        return base if name is None else _join(base, name)

    async def _may(self, ctx: RequestContext, ns: NamespaceConfig, what: str, ino: int,
                   name: bytes | None) -> bool:
        """Whether the caller may reach ``ns``; an admin's crossing is logged (audit)."""
        if ns is DEFAULT_NAMESPACE or ns.owned_by(ctx.uid, frozenset((ctx.gid, *ctx.groups))):
            return True  # the uid, the primary gid or groups already read decide
        if not ns.gids and not self.gov.admin_gids:
            return False
        gids = await self._gids(ctx)
        if ns.owned_by(ctx.uid, gids):
            return True
        if self.gov.is_admin(gids):
            path = await self._path(ino, name)
            log.info("admin override: uid %d pid %d %s %s (namespace %s)", ctx.uid, ctx.pid,
                     what, path, ns.path)
            self._audit(ctx, path, what, ns)
            return True
        return False

    def _audit(self, ctx: RequestContext, path: str, what: str, ns: NamespaceConfig) -> None:
        """An admin's crossing, for the audit log: noted in memory (no I/O on the request
        path), written with the next batch of open records (docs/governance.md)."""
        if self._catalog is not None:
            self._catalog.audit_note(AuditRecord(
                "admin_override", path, ctx.uid, ctx.pid, time_ns=time.time_ns(),
                detail={"op": what, "namespace": ns.path}))

    def _refuse(self, ctx: RequestContext, ns: NamespaceConfig, what: str, why: str) -> PermissionDenied:
        """The EACCES of a refusal, counted for the audit log."""
        if self.refusals is not None:
            self.refusals.note(ctx.uid, ctx.pid, ns.path, what)
        return PermissionDenied(why)

    async def _require(self, ctx: RequestContext, ns: NamespaceConfig, what: str, ino: int,
                       name: bytes | None = None) -> None:
        if not await self._may(ctx, ns, what, ino, name):
            raise self._refuse(ctx, ns, what,
                f"{what}: namespace {ns.path} belongs to other users (uid {ctx.uid} is not "
                "an owner)")

    # -- the checks ----------------------------------------------------------------------

    def _exempt(self, ctx: RequestContext) -> bool:
        return not self.enabled or ctx is ROOT

    async def lookup(self, ctx: RequestContext, parent: int, name: bytes) -> None:
        """A name in ``parent``: a namespace root is visible to all, its contents are not."""
        if self._exempt(ctx):
            return
        place = await self.child_place(parent, name)
        if place.guarded and not place.is_root:
            await self._require(ctx, place.ns, "lookup", parent, name)

    async def inode(self, ctx: RequestContext, ino: int, what: str, root_visible: bool = False) -> None:
        """An operation on inode ``ino`` itself (open, list, setattr, xattrs; ``stat`` with
        ``root_visible``: the stat of a namespace root is public)."""
        if self._exempt(ctx):
            return
        place = await self.place(ino)
        if place.guarded and not (root_visible and place.is_root):
            await self._require(ctx, place.ns, what, ino)

    async def create(self, ctx: RequestContext, parent: int, name: bytes, what: str) -> None:
        """A new name in ``parent`` (mkdir, create, mknod, symlink, link): the namespace's
        owners only, including its root (nobody else may squat the name). A namespace root
        and a directory on the way to one are directories: a symlink there would lead the
        owners' path walks out of the namespace."""
        if self._exempt(ctx):
            return
        place = await self.child_place(parent, name)
        if (place.is_root or place.path is not None) and what != "mkdir":
            raise self._refuse(ctx, place.ns, what, f"{what} {name!r}: the path of a namespace "
                               "root (or on the way to one) is for a directory only")
        await self._require(ctx, place.ns, what, parent, name)

    async def remove(self, ctx: RequestContext, parent: int, name: bytes, what: str) -> None:
        """unlink, rmdir: the owners inside; a namespace root by an admin only."""
        if self._exempt(ctx):
            return
        place = await self.child_place(parent, name)
        if not place.is_root:
            await self._require(ctx, place.ns, what, parent, name)
            return
        gids = await self._gids(ctx) if self.gov.admin_gids else frozenset()
        if not self.gov.is_admin(gids):
            raise self._refuse(ctx, place.ns, what,
                               f"{what} of namespace root {place.ns.path}: admins only")
        log.info("admin override: uid %d pid %d %s %s (namespace root)", ctx.uid, ctx.pid,
                 what, place.ns.path)
        self._audit(ctx, place.ns.path, what, place.ns)

    async def _move(self, ctx: RequestContext, src: Place, dst: Place, what: str,
                    where: tuple[int, bytes | None], to: tuple[int, bytes]) -> None:
        await self._require(ctx, src.ns, what, *where)
        await self._require(ctx, dst.ns, what, *to)
        # A namespace root, or a directory on the way to one, never moves: the namespace
        # of everything below it would change.
        pinned = src.is_root or src.path is not None or dst.is_root or dst.path is not None
        if src.ns is not dst.ns or pinned:
            raise CrossNamespace(f"{what}: across namespaces ({src.ns.path} -> {dst.ns.path}); "
                                 "copy instead")

    async def rename(self, ctx: RequestContext, old_parent: int, old_name: bytes,
                     new_parent: int, new_name: bytes) -> None:
        if self._exempt(ctx):
            return
        src = await self.child_place(old_parent, old_name)
        dst = await self.child_place(new_parent, new_name)
        await self._move(ctx, src, dst, "rename", (old_parent, old_name), (new_parent, new_name))

    async def link(self, ctx: RequestContext, ino: int, new_parent: int, new_name: bytes) -> None:
        if self._exempt(ctx):
            return
        src = await self.place(ino)
        dst = await self.child_place(new_parent, new_name)
        await self._move(ctx, Place(src.ns), dst, "link", (ino, None), (new_parent, new_name))

    async def viewer(self, ctx: RequestContext) -> Callable[[str], bool]:
        """A test of paths inside the mount: may the caller see what lies there? For the
        listings the daemon answers (checkpoints under a directory); groups read once, and
        no admin log per row (the request that asked for the listing was checked)."""
        if self._exempt(ctx):
            return lambda path: True
        gids = await self._gids(ctx)
        admin = self.gov.is_admin(gids)

        def visible(path: str) -> bool:
            ns = self.gov.namespace_for(path)
            return admin or ns is DEFAULT_NAMESPACE or ns.owned_by(ctx.uid, gids)

        return visible
