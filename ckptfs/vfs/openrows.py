"""The open-handle rows of a shared catalog (docs/multinode.md): the inodes this node holds
open, noted under its session, so that an inode with no name left is dropped by the last
closer on any node, and retention keeps what a live node still reads or writes.

One node (no session) notes nothing: every method is then a no-op. The filesystem tells
this class when an open needs a note (``needs_note``; ``note`` in the open's catalog call,
``noted_now`` right after on the trio thread), when its last handle of an inode closed
(``release``) and when the catalog answers again after an outage (``sync``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeVar

from ..catalog.protocols import SessionCatalog
from ..errors import CatalogUnavailable
from .rowlocks import RowLocks

log = logging.getLogger("ckptfs.vfs")

T = TypeVar("T")


class SessionId(Protocol):
    """This node's session in a shared catalog (session.NodeSession): its current id."""

    sid: str


class Db(Protocol):
    """A catalog call in the catalog's worker thread (Filesystem.db and its variants)."""

    async def __call__(self, fn: Callable[..., T], *args: Any) -> T: ...


class OpenRows:
    """``session``: None with one node (nothing noted). ``db``: a catalog call;
    ``db_dirs_changed``: one that may change directory rows (a release may drop an inode);
    ``held_here``: whether this node still holds an inode (a handle, an open file, an open
    under way); ``collect_dropped``: given the chunks of an inode a release dropped."""

    def __init__(
        self, catalog: SessionCatalog, session: SessionId | None, db: Db, db_dirs_changed: Db,
        held_here: Callable[[int], bool],
        collect_dropped: Callable[[int, Sequence[bytes]], Awaitable[None]],
    ) -> None:
        self.catalog = catalog
        self.session = session
        self._db = db
        self._db_dirs_changed = db_dirs_changed
        self._held_here = held_here
        self._collect_dropped = collect_dropped
        # Shared catalog: the inodes noted open under the session (ino -> noted for writing).
        self._noted: dict[int, bool] = {}
        # One note or release of an inode's open-handle row at a time, in the order they
        # were decided (vfs/rowlocks.py): else a note could commit after the release of the
        # close that followed it (a stale row), or a release after the next open's note.
        self._rows = RowLocks()
        # Inodes of _noted whose note went to a session that has ended (this node registered
        # again): noted anew under the new one after the next heartbeat (sync_open_rows);
        # _rows_sid is the session id the rest of _noted is noted under.
        self._stale: set[int] = set()
        self._rows_sid = self.session.sid if self.session is not None else ""
        # Last closes the catalog did not take (it was unreachable): released again after
        # the next heartbeat (``sync_open_rows``), else the rows would keep them "open" on
        # this node for retention and the last-closer drop until the session ends.
        self._unreleased: set[int] = set()

    def hold(self, ino: int) -> AbstractAsyncContextManager[None]:
        """The row lock of ``ino`` (an async context manager): a note after a release
        decided before."""
        return self._rows.hold(ino)

    def needs_note(self, ino: int, writing: bool) -> bool:
        return self.session is not None and (ino not in self._noted or writing > self._noted[ino])

    def note(self, ino: int, writing: bool) -> str:
        """In the worker thread of an open's catalog call: note ``ino`` open under the
        session (NotFound if another node dropped it meanwhile); the session id it went
        under. The caller records it (``noted_now``) on the trio thread after the call,
        still under the inode's row lock."""
        if self.session is None:
            return ""
        sid = self.session.sid  # read once: a re-registration may change it meanwhile
        self.catalog.note_open(sid, ino, writing)
        return sid

    def note_sid(self) -> str:
        """In the worker thread of a catalog call that notes an inode open in its own
        transaction (a create: ``open_for``): the session id to note it under, read once
        ("" with one node: nothing noted). The caller records it (``noted_now``)."""
        return self.session.sid if self.session is not None else ""

    def noted_now(self, ino: int, writing: bool, sid: str) -> None:
        if self.session is not None:
            self._noted[ino] = self._noted.get(ino, False) or writing
            if sid != self.session.sid:  # under the session that ended: noted anew later
                self._stale.add(ino)

    def unsure(self, ino: int) -> None:
        """The catalog failed during a call that may have noted ``ino``: released after the
        next heartbeat (if nothing holds it then)."""
        if self.session is not None:
            self._unreleased.add(ino)

    async def release(self, ino: int) -> None:
        """This node's last handle of ``ino`` closed (shared catalog): release it under the
        session; the catalog drops the inode if it has no name left and no other node
        holds it open."""
        if self.session is None or ino not in self._noted or self._held_here(ino):
            return
        del self._noted[ino]
        self._stale.discard(ino)
        try:
            # After the notes decided before (an open meanwhile notes after this release).
            async with self._rows.hold(ino):
                digests = await self._db_dirs_changed(self.catalog.release_inode,
                                                      self.session.sid, ino)
        except CatalogUnavailable as exc:
            if not self._unreleased:
                log.warning("the catalog did not take the close of inode %d (%s): closes are "
                            "noted again after the next heartbeat", ino, exc)
            self._unreleased.add(ino)
            return
        except BaseException:  # cancelled, maybe before the call: after the next heartbeat
            self._unreleased.add(ino)
            raise
        if digests is not None:
            await self._collect_dropped(ino, digests)

    async def sync(self) -> None:
        """After a heartbeat (the catalog answers again): the open-handle rows made to match
        what this node holds open. A session registered again has none: every inode held
        is noted anew; then the closes the catalog missed (and the notes of opens that
        failed half-way) are released."""
        if self.session is None:
            return
        if self.session.sid != self._rows_sid:
            self._rows_sid = self.session.sid
            self._stale.update(self._noted)
        if self._stale:
            await self._note_stale()
        pending, self._unreleased = self._unreleased, set()
        for ino in sorted(pending):
            if ino in self._noted or self._held_here(ino):
                continue  # opened again meanwhile: its next last close releases it
            self._noted[ino] = False
            await self.release(ino)  # back in the set if it fails again

    async def _note_stale(self) -> None:
        """Note the inodes of _stale under the current session, in one catalog call under
        their row locks (a close meanwhile has taken its inode out of _noted: not noted)."""
        assert self.session is not None
        stale = sorted(self._stale)
        async with self._rows.hold_all(stale):
            notes = [(ino, self._noted[ino]) for ino in stale
                     if ino in self._stale and ino in self._noted]
            # An inode another node dropped meanwhile (unlinked) is skipped: it reads on here.
            await self._db(self.catalog.note_open_many, self.session.sid, notes)
            self._stale.difference_update(ino for ino, _ in notes)
