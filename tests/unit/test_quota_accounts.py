"""The write path's quota arithmetic (vfs/quota.py): reservations of open versions, the
read of the catalog's usage before a refusal, and moves across namespaces (EXDEV)."""

from __future__ import annotations

import errno

import pytest
import trio
import trio.testing

from ckptfs.catalog.quotas import Charge
from ckptfs.config.model import NamespaceConfig
from ckptfs.errors import QuotaExceeded
from ckptfs.vfs.quota import Quotas

NS = (NamespaceConfig("/a", uids=(1,), quota=100), NamespaceConfig("/b", uids=(1,)))


def _quotas(catalog_used: dict[str, int], initial: dict[str, int] | None = None) -> Quotas:
    async def used(ns: str) -> int:
        await trio.lowlevel.checkpoint()
        return catalog_used.get(ns, 0)

    return Quotas(NS, used, initial or {})


def test_open_versions_reserve_their_growth_and_a_rewrite_only_what_it_adds() -> None:
    q = _quotas({}, {"/a": 30})
    one, two = q.account("/a/x", 0), q.account("/a/y", 20)
    assert one is not None and two is not None and q.account("/c/z", 0) is None
    assert one.reserve(50) and q.tallies["/a"].reserved == 50
    assert two.reserve(20)  # a rewrite up to its committed size adds nothing
    assert two.reserve(40) and q.tallies["/a"].reserved == 70
    assert not one.reserve(51)  # 30 + 71 > 100
    two.resize(25)  # truncated: gives back what it no longer needs
    assert q.tallies["/a"].reserved == 55 and one.reserve(65)
    ch = one.charge()
    assert ch == Charge("/a", 100)
    ch.used = 95
    one.committed(65, ch)
    assert (q.tallies["/a"].committed, q.tallies["/a"].reserved, one.base) == (95, 5, 65)
    two.release()
    assert q.tallies["/a"].reserved == 0
    unlimited = q.account("/b/big", 0)
    assert unlimited is not None and unlimited.reserve(10**15)


def test_a_refusal_reads_the_catalog_first() -> None:
    catalog = {"/a": 90}

    async def main() -> None:
        q = _quotas(catalog, {"/a": 90})
        f = q.account("/a/x", 0)
        assert f is not None
        catalog["/a"] = 10  # deleted elsewhere: the node's figure is stale
        await f.grow(80)
        assert q.tallies["/a"].committed == 10
        with pytest.raises(QuotaExceeded) as exc:
            await f.grow(91)
        assert exc.value.errno == errno.EDQUOT

    trio.run(main)


def test_a_refusal_does_not_count_a_commit_ending_meanwhile_twice() -> None:
    catalog = {"/a": 10}  # another node deleted 40: this node still thinks 50

    async def main() -> None:
        q = _quotas(catalog, {"/a": 50})
        t = q.tallies["/a"]
        a, b = q.account("/a/a", 0), q.account("/a/b", 0)
        assert a is not None and b is not None and a.reserve(40)
        t.begin_commit()
        catalog["/a"] = 50  # a's commit reached the catalog, its reservation still held
        async with trio.open_nursery() as n:
            # 50 + 40 + 20 > 100 as cached; read now, a's 40 would count twice (50 + 40).
            n.start_soon(b.grow, 20)
            await trio.testing.wait_all_tasks_blocked()
            ch = a.charge()
            ch.used = 50
            t.end_commit(ch.used)
            a.committed(40, ch)
        assert (t.committed, t.reserved) == (50, 20)
        before = q.generations()
        t.begin_commit()
        q.note_used("/a", 999, before)  # read while a commit ran: not used
        assert t.committed == 50
        t.end_commit(None)
        q.note_used("/a", 70, q.generations())
        assert t.committed == 70

    trio.run(main)
