"""The many-small-files path (issue 12): catalog round trips per request, the paths the
checkpoint events carry, page-cache invalidations and the batching of events."""

import os
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from tests.vfs.test_vfs import catalog_of, make_daemon, make_fs

from ckptfs import threads
from ckptfs.catalog import Inode, SqliteCatalog
from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.checkpoints import tracker as tracker_mod
from ckptfs.checkpoints.events import Detection, FsEvent
from ckptfs.checkpoints.tracker import CheckpointTracker
from ckptfs.config import CheckpointConfig
from ckptfs.daemon.build import Daemon
from ckptfs.errors import CkptfsError
from ckptfs.testing.tiers import MemoryTier
from ckptfs.vfs import names as names_mod
from ckptfs.vfs.context import ROOT
from ckptfs.vfs.filesystem import Filesystem

DATA = os.urandom(4096)


def count_db_hops(monkeypatch: pytest.MonkeyPatch, d: Daemon) -> list[str]:
    """Names of the catalog thread calls made by requests (not by the background tasks)."""
    calls: list[str] = []
    background = (d.tracker, d.deleter, d.uploader, d.telemetry, d.janitor, d.scrubber)

    def counter(real: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def counting(fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
            if (kw.get("limiter") is d.db_limiter
                    and getattr(fn, "__self__", None) not in background):
                calls.append(getattr(fn, "__qualname__", repr(fn)))
            return await real(fn, *args, **kw)
        return counting

    # Both ways into a worker thread: trio's, and the lighter one of the hot calls.
    monkeypatch.setattr(trio.to_thread, "run_sync", counter(trio.to_thread.run_sync))
    monkeypatch.setattr(threads, "run_sync", counter(threads.run_sync))
    return calls


async def hops(calls: list[str], op: Awaitable[Any]) -> list[str]:
    calls.clear()
    await op
    return list(calls)


def recorded(fs: Filesystem) -> list[FsEvent]:
    assert fs.tracker is not None
    events: list[FsEvent] = []
    push = fs.tracker.push

    def spy(ev: FsEvent) -> None:
        events.append(ev)
        push(ev)

    fs.tracker.push = spy  # type: ignore[method-assign]
    return events


async def test_one_catalog_round_trip_per_create_close_rename_unlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with make_daemon(tmp_path, [MemoryTier("l")], checkpoints=CheckpointConfig()) as daemon:
        fs = daemon.fs
        d = await fs.mkdir(ROOT_INODE, b"d", 0o755, ROOT)
        calls = count_db_hops(monkeypatch, daemon)
        fh, _ = await fs.create(d.ino, b"f", 0o644, os.O_WRONLY, ROOT)
        assert len(calls) == 1, calls  # create: the inode and the event's path
        assert len(await hops(calls, fs.write(fh, 0, DATA))) == 0  # the path is cached
        assert len(await hops(calls, fs.flush(fh))) == 1  # the commit
        assert len(await hops(calls, fs.release(fh))) == 0  # the event: from the clean file
        assert len(await hops(calls, fs.rename(d.ino, b"f", d.ino, b"g", 0, ROOT))) == 1
        assert len(await hops(calls, fs.unlink(d.ino, b"g", ROOT))) == 1
        # The unlink dropped the inode and its chunk's rows (the frame: deletion queue).
        assert await fs.db(fs.catalog.unlinked_inodes) == []
        assert await fs.db(fs.catalog.referenced_digests) == set()
        assert await fs.db(catalog_of(fs).replica_keys_all) == set()


async def test_events_carry_the_current_path_after_a_rename(tmp_path: Path) -> None:
    async with make_fs(tmp_path, [MemoryTier("l")], checkpoints=CheckpointConfig()) as fs:
        events = recorded(fs)
        a = await fs.mkdir(ROOT_INODE, b"a", 0o755, ROOT)
        fh, _ = await fs.create(a.ino, b"f", 0o644, os.O_WRONLY, ROOT)
        await fs.rename(ROOT_INODE, b"a", ROOT_INODE, b"b", 0, ROOT)  # while f is open
        await fs.write(fh, 0, DATA)
        await fs.flush(fh)
        fh2 = await fs.open((await fs.lookup(a.ino, b"f")).ino, os.O_WRONLY)
        await fs.release(fh)
        await fs.rename(a.ino, b"f", a.ino, b"g", 0, ROOT)  # between a write and the close
        await fs.write(fh2, 0, DATA[:100])
        await fs.flush(fh2)
        await fs.rename(a.ino, b"g", a.ino, b"h", 0, ROOT)
        await fs.release(fh2)
        got = [(e.kind, e.path) for e in events if e.kind in ("create", "write", "release")]
        assert got == [
            ("create", "/a/f"), ("write", "/b/f"), ("release", "/b/f"),
            ("write", "/b/g"), ("release", "/b/h"),
        ]
        last = [e for e in events if e.kind == "release"][-1]
        assert last.size == len(DATA) and last.content == DATA


async def test_unlinked_while_open_is_dropped_at_the_last_close(tmp_path: Path) -> None:
    async with make_fs(tmp_path, [MemoryTier("l")], checkpoints=CheckpointConfig()) as fs:
        fh, inode = await fs.create(ROOT_INODE, b"f", 0o644, os.O_RDWR, ROOT)
        await fs.write(fh, 0, DATA)
        await fs.flush(fh)
        await fs.unlink(ROOT_INODE, b"f", ROOT)
        assert await fs.read(fh, 0, 10) == DATA[:10]  # still readable through the handle
        assert await fs.db(fs.catalog.unlinked_inodes) == [inode.ino]
        await fs.release(fh)
        assert await fs.db(fs.catalog.unlinked_inodes) == []


async def test_new_write_only_files_need_no_page_cache_invalidation(tmp_path: Path) -> None:
    invalidated: list[int] = []
    async with make_fs(tmp_path, [MemoryTier("l")], invalidate=invalidated.append) as fs:
        fh, new = await fs.create(ROOT_INODE, b"new", 0o644, os.O_WRONLY, ROOT)
        await fs.write(fh, 0, DATA)
        await fs.flush(fh)
        await fs.release(fh)
        assert invalidated == []  # nothing could have cached a page of it
        # A file some handle could read (or map) is invalidated after direct-I/O writes.
        fh, old = await fs.create(ROOT_INODE, b"old", 0o644, os.O_WRONLY, ROOT)
        reader = await fs.open(old.ino, os.O_RDONLY)
        await fs.write(fh, 0, DATA)
        await fs.flush(fh)
        await fs.release(fh)
        await fs.release(reader)
        assert invalidated == [old.ino]
        # So is a file reopened later (an earlier open may have left pages in the cache).
        fh = await fs.open(new.ino, os.O_WRONLY)
        await fs.write(fh, 0, DATA[:10])
        await fs.flush(fh)
        await fs.release(fh)
        assert invalidated == [old.ino, new.ino]


class _Observer:
    name = "observer"

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.current: list[str] = []
        self.seen = threading.Event()

    def observe(self, ev: FsEvent, ns: object) -> list[Detection]:
        self.current.append(ev.path)
        self.seen.set()
        return []

    def tick(self, now_ns: int, ns: object) -> list[Detection]:
        return []


def test_a_burst_of_events_costs_one_catalog_round_trip(tmp_path: Path) -> None:
    clock = trio.testing.MockClock()  # the batching window only ends when we say so
    cat = SqliteCatalog(tmp_path / "catalog.sqlite")
    obs = _Observer()
    hops = 0
    tracker = CheckpointTracker(cat, trio.CapacityLimiter(1), obs, lambda: [])
    observe = tracker._observe

    def counted(batch: list[FsEvent], inos: list[int]) -> None:
        nonlocal hops
        hops += 1
        observe(batch, inos)

    tracker._observe = counted  # type: ignore[method-assign]

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(tracker.run)
            for i in range(10):  # events of a save, each after the tracker had its chance
                tracker.push(FsEvent("create", f"/d/f{i}", i))
                await trio.testing.wait_all_tasks_blocked()
            clock.jump(tracker_mod.BATCH_S)
            assert await trio.to_thread.run_sync(obs.seen.wait, 10)
            while len(obs.current) < 10:
                await trio.to_thread.run_sync(obs.seen.wait, 0.01)
            n.cancel_scope.cancel()

    try:
        trio.run(main, clock=clock)
    finally:
        cat.close()
    assert obs.current == [f"/d/f{i}" for i in range(10)] and hops == 1


async def test_directory_getattr_after_a_change_needs_no_round_trip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with make_daemon(tmp_path, [MemoryTier("l")]) as daemon:
        fs = daemon.fs
        d = await fs.mkdir(ROOT_INODE, b"d", 0o755, ROOT)
        calls = count_db_hops(monkeypatch, daemon)
        for op in (
            fs.create(d.ino, b"f", 0o644, os.O_WRONLY, ROOT),
            fs.rename(d.ino, b"f", d.ino, b"g", 0, ROOT),
            fs.unlink(d.ino, b"g", ROOT),
        ):
            await op
            calls.clear()
            got = await fs.getattr(d.ino)  # what the kernel asks next (default_permissions)
            assert calls == []
            assert got == await fs.db(fs.catalog.get_inode, d.ino)


async def test_directory_attributes_follow_every_change(tmp_path: Path) -> None:
    async with make_fs(tmp_path, [MemoryTier("l")]) as fs:
        a = await fs.mkdir(ROOT_INODE, b"a", 0o755, ROOT)
        b = await fs.mkdir(ROOT_INODE, b"b", 0o755, ROOT)

        async def check() -> None:
            for ino in (ROOT_INODE, a.ino, b.ino):
                assert await fs.getattr(ino) == await fs.db(fs.catalog.get_inode, ino)

        await check()
        sub = await fs.mkdir(a.ino, b"sub", 0o700, ROOT)  # a's link count
        await check()
        fh, f = await fs.create(a.ino, b"f", 0o644, os.O_WRONLY, ROOT)
        await fs.release(fh)
        await check()
        await fs.setattr(a.ino, mode=0o750)
        await check()
        await fs.setxattr(b.ino, b"user.k", b"v")
        await check()
        await fs.rename(a.ino, b"sub", b.ino, b"sub", 0, ROOT)  # a directory moves
        await check()
        await fs.link(f.ino, b.ino, b"f2")
        await check()
        await fs.symlink(b.ino, b"s", b"f2", ROOT)
        await check()
        await fs.rename(b.ino, b"f2", a.ino, b"f", 0, ROOT)  # replaces a/f (same inode)
        await check()
        await fs.unlink(a.ino, b"f", ROOT)
        await fs.rmdir(b.ino, b"sub", ROOT)
        await check()
        with pytest.raises(CkptfsError):
            await fs.getattr(sub.ino)  # gone from the catalog: not served from memory


async def test_file_getattr_after_its_close_needs_no_round_trip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with make_daemon(tmp_path, [MemoryTier("l")], checkpoints=CheckpointConfig()) as daemon:
        fs = daemon.fs
        d = await fs.mkdir(ROOT_INODE, b"d", 0o755, ROOT)
        fh, f = await fs.create(d.ino, b"f", 0o644, os.O_WRONLY, ROOT)
        await fs.write(fh, 0, DATA)
        await fs.flush(fh)
        await fs.release(fh)
        calls = count_db_hops(monkeypatch, daemon)
        got = await fs.getattr(f.ino)  # the stat after a close (the write dropped the kernel's)
        assert calls == []
        assert got == await fs.db(fs.catalog.get_inode, f.ino) and got.size == len(DATA)


async def test_file_attributes_follow_every_change(tmp_path: Path) -> None:
    async with make_fs(tmp_path, [MemoryTier("l")], checkpoints=CheckpointConfig()) as fs:
        d = await fs.mkdir(ROOT_INODE, b"d", 0o755, ROOT)

        async def check(*inos: int) -> None:
            for ino in inos:
                assert await fs.getattr(ino) == await fs.db(fs.catalog.get_inode, ino)

        fh, f = await fs.create(d.ino, b"f", 0o644, os.O_WRONLY, ROOT)
        await fs.write(fh, 0, DATA)
        await fs.flush(fh)
        await fs.release(fh)
        await check(f.ino)
        await fs.setattr(f.ino, mode=0o600)
        await check(f.ino)
        await fs.setattr(f.ino, size=10)  # no writer: committed at once
        await check(f.ino)
        await fs.rename(d.ino, b"f", d.ino, b"g", 0, ROOT)  # ctime
        await check(f.ino)
        await fs.link(f.ino, ROOT_INODE, b"h")  # link count
        await check(f.ino)
        await fs.setxattr(f.ino, b"user.k", b"v")
        await check(f.ino)
        fh, e = await fs.create(d.ino, b"e", 0o644, os.O_WRONLY, ROOT)
        await fs.write(fh, 0, DATA[:7])
        await fs.flush(fh)
        await fs.rename(d.ino, b"e", d.ino, b"e2", 0, ROOT)  # while open: ctime from the catalog
        await fs.release(fh)
        await check(e.ino)
        await fs.rename(d.ino, b"e2", ROOT_INODE, b"h", 0, ROOT)  # replaces a link of f
        await check(f.ino, e.ino)
        fh = await fs.open(f.ino, os.O_WRONLY)
        await fs.write(fh, 0, DATA)  # not committed: a reader sees the live size ...
        assert (await fs.getattr(f.ino)).size == len(DATA)
        await fs.release(fh)  # ... and after a close without flush, the committed one
        await check(f.ino)
        await fs.link(f.ino, ROOT_INODE, b"h2")
        fh = await fs.open(f.ino, os.O_WRONLY)
        await fs.write(fh, 0, DATA)
        await fs.flush(fh)
        await fs.release(fh)
        await fs.unlink(ROOT_INODE, b"h2", ROOT)  # one link of two: link count, ctime
        await check(f.ino)
        await fs.unlink(d.ino, b"g", ROOT)
        with pytest.raises(CkptfsError):
            await fs.getattr(f.ino)  # gone from the catalog: not served from memory
        await check(e.ino)


@pytest.mark.allow_log_errors
async def test_a_small_close_that_cannot_store_takes_the_usual_path(tmp_path: Path) -> None:
    # A full tier: the close reports ENOSPC, nothing commits.
    async with make_fs(tmp_path, [MemoryTier("l", capacity=100)]) as fs:
        fh, f = await fs.create(ROOT_INODE, b"f", 0o644, os.O_WRONLY, ROOT)
        await fs.write(fh, 0, DATA)
        with pytest.raises(CkptfsError) as err:
            await fs.flush(fh)
        assert err.value.errno == 28  # ENOSPC
        await fs.release(fh)
        assert await fs.db(fs.catalog.extents, f.ino) == {}
        assert (await fs.db(fs.catalog.get_inode, f.ino)).size == 0


async def test_a_missing_name_in_a_new_directory_needs_no_round_trip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with make_daemon(tmp_path, [MemoryTier("l")]) as daemon:
        fs = daemon.fs
        d = await fs.mkdir(ROOT_INODE, b"tmp-checkpoint-1", 0o755, ROOT)
        fh, _ = await fs.create(d.ino, b"shard-0", 0o644, os.O_WRONLY, ROOT)
        await fs.release(fh)
        calls = count_db_hops(monkeypatch, daemon)
        with pytest.raises(CkptfsError) as err:
            await fs.lookup(d.ino, b"shard-1")  # the kernel's LOOKUP before the next create
        assert err.value.errno == 2 and calls == []
        got = await fs.lookup(d.ino, b"shard-0")  # a name it has, of a file it closed
        assert calls == []
        assert got == await fs.db(fs.catalog.lookup, d.ino, b"shard-0")


async def test_known_names_follow_every_change(tmp_path: Path) -> None:
    async with make_fs(tmp_path, [MemoryTier("l")]) as fs:
        a = await fs.mkdir(ROOT_INODE, b"a", 0o755, ROOT)
        b = await fs.mkdir(a.ino, b"b", 0o755, ROOT)
        names = [b"f", b"g", b"h", b"s", b"n", b"b", b"c", b"x"]

        async def check() -> None:
            for parent in (a.ino, b.ino):
                for n in names:
                    try:
                        want: Inode | None = await fs.db(fs.catalog.lookup, parent, n)
                    except CkptfsError:
                        want = None
                    try:
                        got: Inode | None = await fs.lookup(parent, n)
                    except CkptfsError as exc:
                        assert exc.errno == 2
                        got = None
                    assert got == want, (parent, n)

        await check()
        fh, f = await fs.create(a.ino, b"f", 0o644, os.O_WRONLY, ROOT)
        await fs.release(fh)
        await check()
        await fs.rename(a.ino, b"f", b.ino, b"g", 0, ROOT)  # across directories
        await check()
        await fs.link(f.ino, a.ino, b"h")
        await check()
        await fs.setattr(f.ino, mode=0o600)
        await check()
        fh = await fs.open(f.ino, os.O_WRONLY)
        await fs.write(fh, 0, DATA)
        assert (await fs.lookup(a.ino, b"h")).size == len(DATA)  # live while open, as always
        await fs.flush(fh)
        await fs.release(fh)
        await check()
        await fs.rename(a.ino, b"h", b.ino, b"g", 0, ROOT)  # both names one inode: no-op
        await check()
        await fs.symlink(a.ino, b"s", b"g", ROOT)
        await fs.mknod(a.ino, b"n", 0o10644, 0, ROOT)
        await check()
        with pytest.raises(CkptfsError):
            await fs.create(a.ino, b"s", 0o644, os.O_WRONLY, ROOT)  # EEXIST: forgotten
        await check()
        c = await fs.mkdir(a.ino, b"c", 0o755, ROOT)
        fh, _ = await fs.create(c.ino, b"x", 0o644, os.O_WRONLY, ROOT)
        await fs.release(fh)
        await fs.rename(a.ino, b"c", b.ino, b"c", 0, ROOT)  # a known directory moves
        assert (await fs.lookup(c.ino, b"x")).ino
        await fs.unlink(c.ino, b"x", ROOT)
        await fs.rmdir(b.ino, b"c", ROOT)
        await fs.unlink(b.ino, b"g", ROOT)
        await fs.unlink(a.ino, b"h", ROOT)
        await check()


def test_known_names_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(names_mod, "MAX_TOTAL", 9)
    monkeypatch.setattr(names_mod, "MAX_NAMES", 6)
    known = names_mod.KnownNames()
    known.new_dir(1)
    known.new_dir(2)
    for i in range(5):
        known.added(1, b"a%d" % i, 100 + i)
    known.removed(1, b"a0")
    assert known.absent(1, b"a0") and known.ino(1, b"a1") == 101
    for i in range(7):  # too many names in one directory: it is forgotten
        known.added(2, b"b%d" % i, 200 + i)
    assert not known.known(2) and not known.absent(2, b"x")
    known.new_dir(3)
    for i in range(6):  # 4 + 6 names: over the total, the oldest directory goes first
        known.added(3, b"c%d" % i, 300 + i)
    assert not known.known(1) and known.known(3) and known.ino(3, b"c5") == 305
