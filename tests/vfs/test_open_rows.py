"""The open-handle rows of a node's session (shared catalog) against overlapping opens,
closes and a re-registration, each interleaving forced by a catalog that holds chosen
calls in their worker thread until the test lets them go: the real VFS on the real
PostgreSQL, no timing luck.

After every interleaving the catalog notes an inode open under this node's session exactly
while the node holds it open (a stale row keeps a closed file "open" for retention and
for the drop of unlinked files; a missing one lets another node drop a file read here)."""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
import trio
import trio.testing

from tests.support.daemons import build_daemon
from tests.vfs.test_vfs import CS, RW

from ckptfs.catalog import PostgresCatalog
from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.catalog.hooks import CatalogHooks
from ckptfs.catalog.rows import Registered
from ckptfs.daemon.build import Daemon, Wakeups
from ckptfs.daemon.services import running
from ckptfs.session import NodeSession
from ckptfs.testing.tiers import MemoryTier
from ckptfs.vfs.context import ROOT

T = TypeVar("T")
WAIT_S = 20  # s: a bound for each step (a step that hangs fails the test)


@dataclass
class Stop:
    """A catalog call held before it runs: ``arrived`` once it is there, ``go`` lets it run,
    ``done`` once it ran."""

    method: str
    ino: int | None
    args: tuple[Any, ...] = ()
    arrived: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)


class GatedCatalog(PostgresCatalog):
    """The real catalog, with fault injection: the next call of a method (of one inode)
    that the test armed a Stop for waits in its worker thread, still holding its catalog
    slot, until the test sets ``go``."""

    def __init__(self, url: str, pool_size: int, hooks: CatalogHooks | None = None) -> None:
        super().__init__(url, pool_size=pool_size, hooks=hooks)
        self._armed: list[Stop] = []
        self._lock = threading.Lock()
        self.waiting = 0  # calls held at a stop now

    def stop_next(self, method: str, ino: int | None = None) -> Stop:
        stop = Stop(method, ino)
        with self._lock:
            self._armed.append(stop)
        return stop

    def _gated(self, method: str, ino: int | None, args: tuple[Any, ...], call: Callable[[], T]) -> T:
        with self._lock:
            stop = next((s for s in self._armed
                         if s.method == method and s.ino in (None, ino)), None)
            if stop is not None:
                self._armed.remove(stop)
                self.waiting += 1
        if stop is None:
            return call()
        stop.args = args
        stop.arrived.set()
        let_go = stop.go.wait(WAIT_S)
        with self._lock:
            self.waiting -= 1
        assert let_go, f"{method} held at its stop for {WAIT_S} s"
        try:
            return call()
        finally:
            stop.done.set()

    def note_open(self, sid: str, ino: int, writing: bool = False) -> None:
        self._gated("note_open", ino, (sid, ino, writing),
                    lambda: super(GatedCatalog, self).note_open(sid, ino, writing))

    def release_inode(self, sid: str, ino: int) -> list[bytes] | None:
        return self._gated("release_inode", ino, (sid, ino),
                           lambda: super(GatedCatalog, self).release_inode(sid, ino))

    def note_open_many(self, sid: str, inos: Sequence[tuple[int, bool]]) -> None:
        self._gated("note_open_many", None, (sid, tuple(inos)),
                    lambda: super(GatedCatalog, self).note_open_many(sid, inos))

    def register_session(
        self, node: str, timeout_s: float, info: str = "", sid: str | None = None,
        earlier: str = "",
    ) -> Registered:
        return self._gated(
            "register_session", None, (node,),
            lambda: super(GatedCatalog, self).register_session(node, timeout_s, info, sid,
                                                               earlier))


async def arrived(stop: Stop) -> None:
    assert await trio.to_thread.run_sync(stop.arrived.wait, WAIT_S), f"{stop.method} never came"


async def settle(d: Daemon, cat: GatedCatalog) -> None:
    """Until every task waits and no catalog call runs but those held at a stop: the calls
    that come next are the ones the test lets go (a task may be queued for a lock)."""
    with trio.fail_after(WAIT_S):
        while True:
            await trio.testing.wait_all_tasks_blocked(0.02)
            if d.db_limiter.borrowed_tokens == cat.waiting:
                return
            await trio.sleep(0.005)  # a catalog call still runs in its thread


def rows(pg_url: str, sid: str) -> set[int]:
    """The inodes the catalog notes open under ``sid``."""
    with psycopg.connect(pg_url) as conn:
        return {int(r[0]) for r in conn.execute("SELECT ino FROM open_handles WHERE sid=%s",
                                                (sid,))}


@asynccontextmanager
async def node(tmp_path: Path, pg_url: str, timeout_s: float = 60.0
               ) -> AsyncIterator[tuple[Daemon, GatedCatalog, NodeSession]]:
    wakeups = Wakeups()
    cat = GatedCatalog(pg_url, pool_size=6, hooks=wakeups.catalog_hooks())
    try:
        session = NodeSession(cat, "a", timeout_s)
        session.register()
        d = build_daemon(cat, [MemoryTier("a:l")], wakeups, chunk_size=CS,
                         memory_budget=8 * CS, io_threads=2, session=session)
        async with running(d, drain=False):
            yield d, cat, session
    finally:
        cat.close()


async def test_a_close_right_after_a_reopen_leaves_no_row(tmp_path: Path, pg_url: str) -> None:
    """The interleaving of the flaky outage test (the kernel sends RELEASE without waiting,
    and the writer's re-read opens the file at once): the write handle's release runs late;
    the re-read opens and notes; the release comes back and the old VFS noted the inode
    again; the re-read closes and releases before that note lands: a row for a closed file."""
    async with node(tmp_path, pg_url) as (d, cat, session):
        fs = d.fs
        fh, inode = await fs.create(ROOT_INODE, b"f", 0o644, RW, ROOT)
        await fs.write(fh, 0, b"x" * 1000)
        await fs.flush(fh)
        ino = inode.ino
        assert await trio.to_thread.run_sync(rows, pg_url, session.sid) == {ino}
        handles: list[int] = []

        async def reopen() -> None:
            handles.append(await fs.open(ino, os.O_RDONLY))

        async with trio.open_nursery() as n:
            late = cat.stop_next("release_inode", ino)
            n.start_soon(fs.release, fh)  # the writer's close: its release is held
            await arrived(late)
            n.start_soon(reopen)  # the re-read
            await settle(d, cat)
            note = cat.stop_next("note_open", ino)
            late.go.set()
            await arrived(note)  # a note of ino after the late release
            if handles:  # the re-read is open: it closes before that note lands
                n.start_soon(fs.release, handles.pop())
                await settle(d, cat)
            note.go.set()
        if handles:  # still open: noted under the session, and released at its close
            assert await trio.to_thread.run_sync(rows, pg_url, session.sid) == {ino}
            await fs.release(handles.pop())
        assert not fs.handles
        assert await trio.to_thread.run_sync(rows, pg_url, session.sid) == set()


@pytest.mark.allow_log_errors  # the re-registration's error line
async def test_an_open_noted_under_the_ended_session_is_noted_again(
    tmp_path: Path, pg_url: str,
) -> None:
    """This node's session ended (another node cleaned up after it) while an open's note
    was in flight: the note went to the ended session (nothing), and the open was recorded
    after the re-registration had taken what to note anew: noted after the next heartbeat."""
    async with node(tmp_path, pg_url, timeout_s=1.0) as (d, cat, session):
        fs = d.fs
        fh, inode = await fs.create(ROOT_INODE, b"f", 0o644, RW, ROOT)
        await fs.flush(fh)
        await fs.release(fh)
        ino, first = inode.ino, session.sid
        other = PostgresCatalog(pg_url, pool_size=1)  # another node
        try:
            handles: list[int] = []

            async def reader() -> None:
                handles.append(await fs.open(ino, os.O_RDONLY))

            async with trio.open_nursery() as n:
                note = cat.stop_next("note_open", ino)
                n.start_soon(reader)
                await arrived(note)
                assert note.args[0] == first
                await trio.to_thread.run_sync(other.close_session, first)
                again = cat.stop_next("register_session")
                await arrived(again)  # the heartbeat found its session gone
                again.go.set()
                await trio.to_thread.run_sync(again.done.wait, WAIT_S)
                with trio.fail_after(WAIT_S):
                    while session.sid == first:  # set in the worker thread, after the call
                        await trio.sleep(0.005)
                await settle(d, cat)  # the re-registration's notes are taken and written
                note.go.set()
            assert handles
            beats = session.beats
            with trio.fail_after(WAIT_S):
                while session.beats < beats + 2:  # one whole heartbeat after the open
                    await trio.sleep(0.01)
            assert await trio.to_thread.run_sync(rows, pg_url, session.sid) == {ino}
            assert await trio.to_thread.run_sync(rows, pg_url, first) == set()
            await fs.release(handles.pop())
            assert await trio.to_thread.run_sync(rows, pg_url, session.sid) == set()
        finally:
            other.close()


@pytest.mark.allow_log_errors  # the re-registration's error line
async def test_a_close_during_the_notes_of_a_re_registration_leaves_no_row(
    tmp_path: Path, pg_url: str,
) -> None:
    """A last close while the re-registered session's notes are on their way: its release
    comes after them (or they skip it), never before them."""
    async with node(tmp_path, pg_url, timeout_s=1.0) as (d, cat, session):
        fs = d.fs
        fh, inode = await fs.create(ROOT_INODE, b"f", 0o644, RW, ROOT)
        await fs.flush(fh)
        ino, first = inode.ino, session.sid
        other = PostgresCatalog(pg_url, pool_size=1)
        try:
            async with trio.open_nursery() as n:
                notes = cat.stop_next("note_open_many")
                await trio.to_thread.run_sync(other.close_session, first)
                await arrived(notes)  # the heartbeat registered again and notes ino anew
                assert notes.args[0] != first and [i for i, _ in notes.args[1]] == [ino]
                n.start_soon(fs.release, fh)  # the last close, while they are on their way
                await settle(d, cat)
                notes.go.set()
            with trio.fail_after(WAIT_S):
                while session.sid == first:
                    await trio.sleep(0.005)
            beats = session.beats
            with trio.fail_after(WAIT_S):
                while session.beats < beats + 2:
                    await trio.sleep(0.01)
            assert not fs.handles
            assert await trio.to_thread.run_sync(rows, pg_url, session.sid) == set()
        finally:
            other.close()
