"""Namespace quotas on the write path (docs/governance.md "Quotas").

The catalog counts each namespace's committed bytes and checks the quota in every commit's
transaction (catalog/quotas.py): the authoritative check, across nodes. This module is the
early one, on this node: a write (or a truncate that grows a file) whose version would take
its namespace past the quota fails with EDQUOT before its bytes are accepted. It counts, per
namespace, the usage as the catalog last said (``committed``) plus the growth of every
version open here and not committed yet (``reserved``), so that concurrent writers cannot
overshoot together. A rewrite reserves only what it adds beyond the file's committed size.

Before refusing, the namespace's usage is read again from the catalog (deletions by the
janitor or by other nodes free room the cached figure does not know of).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

import trio

from ..catalog.quotas import Charge
from ..config.model import NamespaceConfig
from ..errors import QuotaExceeded

log = logging.getLogger("ckptfs.vfs")

__all__ = ["FileAccount", "NamespaceTally", "Quotas"]

REFRESH_TRIES = 3  # reads of the catalog's usage while commits of the namespace keep ending


class NamespaceTally:
    """One namespace on this node."""

    def __init__(self, ns: str, quota: int | None) -> None:
        self.ns = ns
        self.quota = quota
        self.committed = 0  # the catalog's count, as last read or written by this node
        self.reserved = 0  # growth of this node's uncommitted versions
        self.commits = 0  # commits of the namespace's files under way here
        self.generation = 0  # commits begun so far (a refresh spanning one is not used)
        self._ended = trio.Event()

    def fits(self, extra: int) -> bool:
        return self.quota is None or self.committed + self.reserved + extra <= self.quota

    def begin_commit(self) -> None:
        self.commits += 1
        self.generation += 1

    def end_commit(self, used: int | None) -> None:
        self.commits -= 1
        if used is not None:
            self.committed = used
        self._ended.set()
        self._ended = trio.Event()

    async def one_ended(self) -> None:
        """Until the next commit of the namespace here ends."""
        await self._ended.wait()


class FileAccount:
    """One open file's share of its namespace: what its uncommitted version adds beyond
    its committed size (``base``)."""

    def __init__(self, tally: NamespaceTally, base: int,
                 used: Callable[[str], Awaitable[int]]) -> None:
        self.tally = tally
        self.base = base
        self.reserved = 0
        self._used = used

    @property
    def ns(self) -> str:
        return self.tally.ns

    def reserve(self, size: int) -> bool:
        """Room for a version of ``size`` bytes, as far as this node knows; taken if so."""
        extra = size - self.base - self.reserved
        if extra <= 0:
            return True
        if not self.tally.fits(extra):
            return False
        self.tally.reserved += extra
        self.reserved += extra
        return True

    async def grow(self, size: int) -> None:
        """``reserve``, with the namespace's usage read again before a refusal:
        QuotaExceeded if there is no room even then."""
        if self.reserve(size):
            return
        t = self.tally
        for _ in range(REFRESH_TRIES):
            if t.commits:
                # A commit here ends soon and moves its reservation into ``committed``;
                # a read of the catalog meanwhile could count it twice.
                await t.one_ended()
                if self.reserve(size):
                    return
                continue
            gen = t.generation
            used = await self._used(t.ns)
            if t.commits == 0 and t.generation == gen:
                t.committed = used
                break
        if self.reserve(size):
            return
        raise QuotaExceeded(
            f"namespace {t.ns}: quota {t.quota} bytes, {t.committed} used and "
            f"{t.reserved} being written; a version of {size} bytes does not fit"
        )

    def resize(self, size: int) -> None:
        """The version shrank to ``size`` (truncate): give back what it no longer needs."""
        keep = max(0, size - self.base)
        if keep < self.reserved:
            self.tally.reserved -= self.reserved - keep
            self.reserved = keep

    def charge(self) -> Charge:
        return Charge(self.tally.ns, self.tally.quota)

    def committed(self, size: int, charge: Charge) -> None:
        """The version of ``size`` bytes is committed: counted by the catalog now."""
        self.release()
        self.base = size
        if charge.used is not None:
            self.tally.committed = charge.used

    def release(self) -> None:
        """The uncommitted version is gone (committed, discarded or refused)."""
        self.tally.reserved -= self.reserved
        self.reserved = 0


class Quotas:
    """The namespaces of a mount and their tallies on this node. ``used`` reads a
    namespace's usage from the catalog (in a worker thread)."""

    def __init__(self, namespaces: Sequence[NamespaceConfig],
                 used: Callable[[str], Awaitable[int]], initial: Mapping[str, int]) -> None:
        """``initial``: each namespace's usage as the catalog counted it at mount."""
        self.namespaces = tuple(namespaces)
        self.tallies = {ns.path: NamespaceTally(ns.path, ns.quota) for ns in namespaces}
        for ns, used_now in initial.items():
            if ns in self.tallies:
                self.tallies[ns].committed = used_now
        self._used = used

    def generations(self) -> dict[str, int]:
        """Taken before a read of usage that ``note_used`` applies."""
        return {ns: t.generation for ns, t in self.tallies.items()}

    def note_used(self, ns: str, used: int, before: Mapping[str, int]) -> None:
        """The catalog's usage of ``ns``, read (another node may have committed); kept
        unless a commit of the namespace ran here meanwhile (it may be counted twice)."""
        t = self.tallies.get(ns)
        if t is not None and t.commits == 0 and t.generation == before.get(ns):
            t.committed = used

    def namespace_of(self, path: str) -> NamespaceConfig | None:
        for ns in self.namespaces:
            if ns.covers(path):
                return ns
        return None

    def account(self, path: str, base: int) -> FileAccount | None:
        """The account of a file at ``path`` whose committed size is ``base`` (None:
        outside every namespace)."""
        ns = self.namespace_of(path)
        if ns is None:
            return None
        return FileAccount(self.tallies[ns.path], base, self._used)


def refused(path: str, what: str, exc: QuotaExceeded) -> None:
    """A quota refusal, for the log (and the audit, which wires in here)."""
    log.info("quota: %s of %s refused (EDQUOT): %s", what, path, exc)
