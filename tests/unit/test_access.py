"""The namespace access rules (ckptfs/vfs/access.py) without a mount: who may look up,
list, create, remove, rename and link where; root is not exempt, admins are (and logged);
the daemon's own work is; the inode places it caches; supplementary groups read only
when the uid does not decide."""

from __future__ import annotations

import errno
import logging

import pytest
import trio

from ckptfs.catalog.audit import AuditRecord
from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.config import GovernanceConfig, NamespaceConfig
from ckptfs.errors import CkptfsError
from ckptfs.vfs.access import Access
from ckptfs.vfs.context import ROOT, RequestContext

OWNER, MEMBER, STRANGER, ADMIN_GID, GROUP = 1001, 1002, 1003, 10, 2001

GOV = GovernanceConfig(
    namespaces=(NamespaceConfig(path="/proj-a", uids=(OWNER,)),
                NamespaceConfig(path="/teams/b", gids=(GROUP,))),
    admin_gids=(ADMIN_GID,),
)
# Inodes of a small tree: / (1), /proj-a (2), /proj-a/run (3), /proj-a/run/f (4),
# /teams (5), /teams/b (6), /teams/b/x (7), /shared (8).
PATHS = {2: "/proj-a", 3: "/proj-a/run", 4: "/proj-a/run/f", 5: "/teams", 6: "/teams/b",
         7: "/teams/b/x", 8: "/shared"}


class FakeCatalog:
    """Only ``path_of``, counting its calls (a cached place must not ask again), and
    ``audit_note``, keeping the records an admin's crossing notes."""

    def __init__(self) -> None:
        self.calls = 0
        self.noted: list[AuditRecord] = []

    def path_of(self, ino: int) -> str:
        self.calls += 1
        return PATHS[ino]

    def audit_note(self, record: AuditRecord) -> None:
        self.noted.append(record)


def make(groups: dict[int, tuple[int, ...]] | None = None) -> tuple[Access, FakeCatalog, list[int]]:
    cat = FakeCatalog()
    read: list[int] = []

    def groups_of(pid: int) -> tuple[int, ...]:
        read.append(pid)
        return (groups or {}).get(pid, ())

    access = Access(GOV, cat, trio.CapacityLimiter(1), groups_of=groups_of)  # type: ignore[arg-type]
    return access, cat, read


def who(uid: int, pid: int = 100, gid: int | None = None) -> RequestContext:
    return RequestContext(uid=uid, gid=uid if gid is None else gid, pid=pid)


async def errno_of(coro: object) -> int:
    try:
        await coro  # type: ignore[misc]
    except CkptfsError as exc:
        return exc.errno
    return 0


async def test_a_namespace_root_is_visible_its_contents_only_to_owners() -> None:
    a, _, _ = make()
    for uid in (OWNER, STRANGER, 0):
        assert await errno_of(a.lookup(who(uid), ROOT_INODE, b"proj-a")) == 0
        assert await errno_of(a.inode(who(uid), 2, "stat", root_visible=True)) == 0
    assert await errno_of(a.lookup(who(OWNER), 2, b"run")) == 0
    assert await errno_of(a.inode(who(OWNER), 2, "list")) == 0
    for uid in (STRANGER, 0):  # root without an admin group is not exempt
        assert await errno_of(a.lookup(who(uid), 2, b"run")) == errno.EACCES
        assert await errno_of(a.inode(who(uid), 2, "list")) == errno.EACCES
        assert await errno_of(a.inode(who(uid), 4, "open")) == errno.EACCES
        assert await errno_of(a.inode(who(uid), 4, "stat", root_visible=True)) == errno.EACCES
    # The default namespace keeps POSIX rules only.
    assert await errno_of(a.inode(who(STRANGER), 8, "open")) == 0
    assert await errno_of(a.lookup(who(STRANGER), 8, b"anything")) == 0


async def test_group_owners_need_their_supplementary_groups_read_only_then() -> None:
    a, _, read = make({200: (GROUP,), 201: ()})
    assert await errno_of(a.inode(who(OWNER, pid=300), 4, "open")) == 0
    assert read == []  # the uid decided
    assert await errno_of(a.inode(who(MEMBER, pid=200), 7, "open")) == 0
    assert await errno_of(a.inode(who(MEMBER, pid=201), 7, "open")) == errno.EACCES
    assert read == [200, 201]
    assert await errno_of(a.inode(who(MEMBER, pid=200), 7, "open")) == 0
    assert read == [200, 201]  # kept a moment
    # A primary gid counts too, and groups the adapter already read are used as they are.
    assert await errno_of(a.inode(who(MEMBER, pid=202, gid=GROUP), 7, "open")) == 0
    ctx = RequestContext(uid=MEMBER, gid=MEMBER, pid=203, groups=(GROUP,))
    assert await errno_of(a.inode(ctx, 7, "open")) == 0
    assert 202 not in read and 203 not in read


async def test_admins_cross_and_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    a, cat, _ = make({400: (ADMIN_GID,)})
    with caplog.at_level(logging.INFO, logger="ckptfs.access"):
        assert await errno_of(a.inode(who(0, pid=400), 4, "open")) == 0
    assert "admin override: uid 0 pid 400 open /proj-a/run/f (namespace /proj-a)" in caplog.text
    assert [(r.action, r.path, r.uid, r.pid, dict(r.detail)) for r in cat.noted] == [
        ("admin_override", "/proj-a/run/f", 0, 400, {"op": "open", "namespace": "/proj-a"})]


async def test_the_daemons_own_work_is_exempt() -> None:
    a, cat, _ = make()
    assert await errno_of(a.lookup(ROOT, 2, b"run")) == 0
    assert await errno_of(a.remove(ROOT, ROOT_INODE, b"proj-a", "rmdir")) == 0
    assert cat.calls == 0  # not even a path resolved
    # A real request of root is not the daemon's own (a RequestContext equal to ROOT).
    assert await errno_of(a.lookup(RequestContext(uid=0, gid=0), 2, b"run")) == errno.EACCES


async def test_creating_and_removing() -> None:
    a, _, _ = make({500: (ADMIN_GID,)})
    # Nobody but the owners may create the namespace root (no squatting its name) ...
    assert await errno_of(a.create(who(STRANGER), ROOT_INODE, b"proj-a", "mkdir")) == errno.EACCES
    assert await errno_of(a.create(who(OWNER), ROOT_INODE, b"proj-a", "mkdir")) == 0
    # ... and it, and a directory on the way to one, are directories.
    assert await errno_of(a.create(who(OWNER), ROOT_INODE, b"proj-a", "symlink")) == errno.EACCES
    assert await errno_of(a.create(who(STRANGER), ROOT_INODE, b"teams", "symlink")) == errno.EACCES
    assert await errno_of(a.create(who(STRANGER), ROOT_INODE, b"teams", "mkdir")) == 0
    assert await errno_of(a.create(who(STRANGER), 3, b"g", "create")) == errno.EACCES
    assert await errno_of(a.create(who(OWNER), 3, b"g", "create")) == 0
    assert await errno_of(a.remove(who(STRANGER), 3, b"f", "unlink")) == errno.EACCES
    assert await errno_of(a.remove(who(OWNER), 3, b"f", "unlink")) == 0
    # A namespace root goes by an admin only.
    assert await errno_of(a.remove(who(OWNER), ROOT_INODE, b"proj-a", "rmdir")) == errno.EACCES
    assert await errno_of(a.remove(who(0, pid=500), ROOT_INODE, b"proj-a", "rmdir")) == 0


async def test_rename_and_link_across_namespaces() -> None:
    a, _, _ = make({600: (ADMIN_GID,)})
    # Inside one namespace: its owners.
    assert await errno_of(a.rename(who(OWNER), 3, b"f", 2, b"f2")) == 0
    assert await errno_of(a.rename(who(STRANGER), 3, b"f", 2, b"f2")) == errno.EACCES
    assert await errno_of(a.link(who(OWNER), 4, 3, b"f-link")) == 0
    # Into or out of it: EACCES for a stranger, EXDEV (copy) for who may reach both sides.
    assert await errno_of(a.rename(who(STRANGER), 8, b"mine", 3, b"mine")) == errno.EACCES
    assert await errno_of(a.rename(who(STRANGER), 3, b"f", 8, b"f")) == errno.EACCES
    assert await errno_of(a.link(who(STRANGER), 4, 8, b"l")) == errno.EACCES
    assert await errno_of(a.rename(who(OWNER), 3, b"f", 8, b"f")) == errno.EXDEV
    assert await errno_of(a.link(who(OWNER), 4, 8, b"l")) == errno.EXDEV
    assert await errno_of(a.rename(who(0, pid=600), 3, b"f", 6, b"f")) == errno.EXDEV
    # The namespace root, and a directory on the way to one, never move.
    assert await errno_of(a.rename(who(OWNER), ROOT_INODE, b"proj-a", ROOT_INODE, b"old")) == errno.EXDEV
    assert await errno_of(a.rename(who(STRANGER), ROOT_INODE, b"teams", ROOT_INODE, b"t2")) == errno.EXDEV
    assert await errno_of(a.rename(who(STRANGER), 8, b"x", ROOT_INODE, b"teams")) == errno.EXDEV
    # The default namespace as before.
    assert await errno_of(a.rename(who(STRANGER), 8, b"x", ROOT_INODE, b"y")) == 0


async def test_places_are_cached_and_learned() -> None:
    a, cat, _ = make()
    await a.inode(who(OWNER), 4, "open")
    await a.inode(who(OWNER), 4, "open")
    assert cat.calls == 1
    # A name learned below a known directory costs no path_of at all.
    a.learn(ROOT_INODE, b"proj-a", 2)
    a.learn(2, b"run", 3)
    calls = cat.calls
    assert await errno_of(a.inode(who(STRANGER), 3, "list")) == errno.EACCES
    assert cat.calls == calls
    # The kernel must ask again for names below a namespace directory, not elsewhere.
    assert a.guarded(2) and a.guarded(3)
    assert not a.guarded(ROOT_INODE)
    assert a.guarded(99)  # unknown: ask again


async def test_without_namespaces_nothing_is_checked() -> None:
    cat = FakeCatalog()
    a = Access(GovernanceConfig(), cat, trio.CapacityLimiter(1))  # type: ignore[arg-type]
    assert not a.enabled
    assert await errno_of(a.inode(who(STRANGER), 4, "open")) == 0
    assert await errno_of(a.rename(who(STRANGER), 3, b"f", 8, b"f")) == 0
    assert cat.calls == 0 and not a.guarded(4)


async def test_viewer_filters_paths() -> None:
    a, _, _ = make({700: (GROUP,), 701: (ADMIN_GID,)})
    see = await a.viewer(who(MEMBER, pid=700))
    assert see("/teams/b/run/ckpt-1") and see("/shared/x") and not see("/proj-a/run/c")
    see = await a.viewer(who(0, pid=701))
    assert see("/proj-a/run/c")
    see = await a.viewer(who(0, pid=702))
    assert not see("/proj-a/run/c") and see("/")
